"""What a dataset reads: its ``shards`` argument resolved to shards, member tables and components.

``ShardListDataset(shards)`` takes our index (JSON or SQLite, path or URL), a reference
``wids-shard-index-v1`` description (path, URL, open text stream, list of dicts) or a brace
pattern / list of shard URLs. Its :class:`Catalog` loads that once, lazily, into a
:class:`Description` (cumulative counts as one int64 array, shard records on demand,
:class:`DatasetComponent` ranges) and
maps a global index to (shard, sample); finds each shard's member table (in the index, or by
scanning the shard, kept in ``cache_dir`` when given); keeps a remote index's shard list in
``cache_dir`` for ``offline`` use; and checks a shard against the index on first touch in each
process.
"""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import operator
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import IndexFormatError, IndexMismatchError, SampleTooLargeError
from ..index import (
    ShardInfo,
    ShardMembers,
    header_mismatch_at_spot,
    mismatch_error,
    settle,
    with_repair_hint,
)
from ..samples import DuplicatePolicy
from ..storage import FileStat, RetryPolicy, Source, Store, is_local, redact_url
from .description import Description
from .exclusions import SIDECAR, ExcludeSpec, Kept, parse_exclude, resolve_described, warn_unknown
from .handoff import Handoff, Ticket, read_handoff
from .localcache import LocalCache
from .localtables import parse_local_tables

__all__ = [
    "MAX_SAMPLE_BYTES",
    "PICKLED_BYTES",
    "PICKLED_SHARDS",
    "PICKLED_TABLES",
    "Catalog",
    "display_url",
]

MAX_SAMPLE_BYTES = 1 << 30
"""Default bound on one sample's bytes (1 GiB): ``ds[i]`` holds a sample whole in memory, and a
DataLoader worker pickles it to the main process; anything larger (a long video) is a job for
streaming reads, and a crafted 64 GiB member must not become a ``MemoryError``."""

PICKLED_SHARDS = 1 << 14
"""A loaded description of an index of up to this many shards goes with a pickled catalog."""
PICKLED_TABLES = 32
"""A remote index of up to this many shards has its member tables loaded with it, and they go
with a pickled catalog, at most ..."""
PICKLED_BYTES = 32 << 10
"""... and their bytes at most: the pickle must stay under a pipe's buffer (64 KiB on Linux).
``Process.start()`` under forkserver/spawn writes the pickled dataset into the child's pipe and,
past the buffer, blocks until the child has unpickled it, after the child's torch import: the
workers then start one after another. Measured on 8 remote shards (`tools/bench_startmethods.py`,
tables of ~95 KB each): 16 MiB of tables gave 0.75x the samples/s of none under forkserver and
spawn, the first batch 1.5x later. More go through a file (:mod:`wids.dataset.handoff`)."""


def _is_shard_pattern(src: Any) -> bool:
    if isinstance(src, (list, tuple)):
        return len(src) > 0 and all(isinstance(s, (str, os.PathLike)) for s in src)
    if not isinstance(src, (str, os.PathLike)):
        return False
    s = os.fspath(src)
    return ("{" in s and "}" in s) or s.endswith((".tar", ".tgz", ".tar.gz", ".tar.zst"))


def display_url(src: Any) -> str | None:
    """The ``shards`` argument as errors and ``repr`` show it: a redacted URL, or ``None``."""
    if isinstance(src, (str, os.PathLike)):
        return redact_url(os.fspath(src))
    return None


class Catalog:
    """The shards of a dataset: its description, member tables and first-touch checks.

    Args:
        src: The dataset's ``shards`` argument.
        local: Where data is kept locally, and whether the network may be used.
        dataset_name: Name of the dataset (overrides the description's).
        base: Directory against which relative shard URLs resolve.
        url_map: Checked mirror mapping, longest prefix first.
        allow_local_shards: Let a remote index name local files.
        store: Storage options, retry policy and I/O counters of every shard read.
        duplicates: Policy for repeated keys or fields when a shard is scanned.
        verify: Check each shard against the index on first touch in a process.
        exclude: Samples left out (:mod:`wids.dataset.exclusions`), resolved when the
            description loads; a local index's ``P.exclude`` file beside it is added.
    """

    def __init__(
        self,
        src: Any,
        local: LocalCache,
        *,
        dataset_name: str | None = None,
        base: str | None = None,
        url_map: tuple[tuple[str, str], ...] = (),
        allow_local_shards: bool = False,
        store: Store | None = None,
        duplicates: DuplicatePolicy = "error",
        verify: bool = True,
        max_sample_bytes: int | None = MAX_SAMPLE_BYTES,
        exclude: ExcludeSpec | None = None,
    ) -> None:
        self.src = src
        self.exclude = exclude
        self._kept: Kept | None = None  # the description without the exclusions, once loaded
        self._excluded = False  # whether the exclusion was resolved (_kept stays None if empty)
        self.local = local
        self.dataset_name = dataset_name
        self.base = base
        self.url_map = url_map
        self.allow_local_shards = bool(allow_local_shards)
        self.store = store if store is not None else Store()
        self.duplicates: DuplicatePolicy = duplicates
        self.verify = bool(verify)
        self.max_sample_bytes = max_sample_bytes
        self._largest: dict[int, int] = {}  # bytes of each loaded table's largest sample
        self._loaded: Description | None = None
        self._ready: Description | None = None  # _loaded once its exclusion is resolved too
        self._resolving = False
        # table, end of its last member's data
        self._members: dict[int, tuple[ShardMembers, int]] = {}
        self._scanned: set[int] = set()  # member tables that came from scanning (costly)
        self._first: list[int] = []  # tables loaded with the description (load)
        self._handoff: Handoff | None = None  # the files this process wrote for its copies
        self._ticket: Ticket | None = None  # where a copy finds its tables (not read yet)
        self._warned_duplicates = False
        self.reset_process()

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options of every URL (a copy; assign to change them)."""
        return dict(self.store.storage_options)

    @storage_options.setter
    def storage_options(self, value: Mapping[str, Any] | None) -> None:
        self.store = Store(value, self.store.retry, stats=self.store.stats, named=self.store.named)

    @property
    def retry(self) -> RetryPolicy:
        """The retry and timeout policy of every request."""
        return self.store.retry

    @retry.setter
    def retry(self, value: RetryPolicy | None) -> None:
        self.store = Store(
            self.store.storage_options, value, stats=self.store.stats, named=self.store.named
        )

    def reset_process(self) -> None:
        """Forget what only holds in the process that did it (after a fork or unpickling)."""
        self._verified: set[int] = set()
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process: the loaded description and the tables held, bounded.

        A DataLoader pickles the dataset for each worker under forkserver or spawn: with it go
        a description of up to :data:`PICKLED_SHARDS` shards (not read again) and the tables
        held here, in the pickle up to :data:`PICKLED_BYTES`, else in a file (``hand_over``).
        """
        self._take_handoff()  # a copy of a copy: the tables it has not read yet
        state = self.__dict__.copy()
        del state["_verified"], state["_lock"], state["_handoff"]
        indexed = self._loaded is not None and self._loaded.indexed is not None
        if indexed and len(self._loaded.lengths) > PICKLED_SHARDS:  # type: ignore[union-attr]
            state.update(_loaded=None, _ready=None, _members={})  # reopens faster than it pickles
            return state
        if self._handoff is None or self._handoff.pid != os.getpid():  # a fork writes its own
            self._handoff = Handoff(self, PICKLED_BYTES)
        first = self._first[:PICKLED_TABLES] if indexed else []
        state["_members"], state["_ticket"] = self._handoff.hand_over(
            self._members, self._scanned, first
        )
        return state

    def _take_handoff(self) -> None:
        """Read the tables of the handoff file, once (a bad file: they are fetched instead)."""
        if self._ticket is None:
            return
        with self._lock:
            ticket, self._ticket = self._ticket, None  # read once, whatever it holds
            for i, (members, scanned) in ((ticket and read_handoff(ticket)) or {}).items():
                if i not in self._members:
                    self._keep_members(i, members, scanned=scanned)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handoff = None  # the files a copy writes for its own copies are its own
        self.reset_process()

    @property
    def loaded(self) -> bool:
        """Whether the description has been loaded (in this process or before pickling)."""
        return self._loaded is not None

    def locate(self, index: Any) -> tuple[int, int, int]:
        """``(global index, shard, index in shard)``, for Python-style (negative) indices.

        Raises:
            IndexError: ``index`` is out of range.
            TypeError: ``index`` is not an integer.
        """
        # The hot path of random access: keep it flat (see tools/bench_read.py).
        i = index if type(index) is int else operator.index(index)
        loaded = self._ready or self.load()
        if self._kept is not None:
            return self._locate_kept(self._kept, i, index, loaded)
        n = loaded.total
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} samples")
        per = loaded.per_shard  # shards of one size but the last: no search
        if per:
            shard = min(i // per, loaded.last)
            return i, shard, i - shard * per
        cum = loaded.cum_list
        if cum is not None:
            shard = bisect.bisect_right(cum, i)
            return i, shard, (i - cum[shard - 1] if shard else i)
        shard = loaded.locate(i)  # numpy search: datasets of many shards
        return i, shard, i - int(loaded.starts[shard])

    @staticmethod
    def _locate_kept(kept: Kept, i: int, index: Any, loaded: Description) -> tuple[int, int, int]:
        n = kept.total
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} samples")
        g = kept.raw(i)
        per = loaded.per_shard
        if per:
            shard = min(g // per, loaded.last)
            return i, shard, g - shard * per
        shard = loaded.locate(g)
        return i, shard, g - int(loaded.starts[shard])

    def counts(self) -> Description | Kept:
        """What the dataset's ``lengths``, ``cum``, ``total`` and ``components`` are: the kept."""
        loaded = self._ready or self.load()
        return self._kept if self._kept is not None else loaded

    def _exclusion(self) -> ExcludeSpec | None:
        """``exclude=`` and the local index's exclusion file (``wids subset --exclude``)."""
        spec = self.exclude
        src = self.src
        if not isinstance(src, (str, os.PathLike)) or _is_shard_pattern(src):
            return spec
        path = os.fspath(src).removeprefix("file://")
        if not is_local(path) or not os.path.isfile(path + SIDECAR):
            return spec
        beside = parse_exclude(path + SIDECAR, strict=True)
        if beside is None or spec is None:
            return beside or spec
        # a file holds keys and pairs only; strict stays the user's (the file names this index)
        merged = {**spec.pairs}
        for shard, keys in beside.pairs.items():
            merged[shard] = merged.get(shard, frozenset()) | keys
        return ExcludeSpec(spec.samples, spec.keys | beside.keys, merged, spec.strict, spec.beyond)

    def _resolve_exclusion(self, loaded: Description) -> None:
        if self._excluded:  # once: a copy for a worker comes resolved (and warned) already
            return
        spec = self._exclusion()
        if spec is None:
            self._excluded = True
            return
        excluded, unknown = resolve_described(spec, loaded, lambda k: self.members(k)[0])
        warn_unknown(unknown, spec, stacklevel=7)  # len(ds)'s caller
        if len(excluded):
            self._kept = Kept(
                excluded, np.asarray(loaded.lengths, dtype=np.int64), loaded.components
            )
        self._excluded = True  # only now: a refused exclusion is refused again, never skipped

    # -- the description ----------------------------------------------------------------------

    def load(self) -> Description:
        """The description, loaded on first use.

        A small remote index (up to :data:`PICKLED_TABLES` shards) has its member tables
        fetched at once with it (one round trip for all, beside the one the first read would
        make anyway): loaded before a DataLoader starts its workers, they are inherited by
        forked workers and go with the pickled dataset to the others.
        """
        loaded = self._loaded
        if loaded is None:
            with self._lock:
                if self._loaded is None:
                    self._loaded = self._load_description()
                    self.store.preload(self._loaded.infos[0].url)  # before workers fork
                    if not self.remote_tables and self.duplicates == "error":  # else: a warning
                        parse_local_tables(self._loaded, self._keep_members)  # before forks
                    elif len(self._loaded.lengths) <= PICKLED_TABLES:
                        self._first = list(range(len(self._loaded.lengths)))
                loaded = self._loaded
            if self._first and self.remote_tables:  # outside the lock: members() takes it
                self.prefetch_members(self._first, at_least=1)
        if self._ready is None:
            with self._lock:  # other threads wait; this one's members() calls come back here
                if self._ready is None and not self._resolving:
                    self._resolving = True
                    try:
                        self._resolve_exclusion(loaded)
                    finally:
                        self._resolving = False
                    self._ready = loaded  # locate() and counts() see the exclusion from now
        return loaded

    def _load_description(self) -> Description:
        src = self.src
        if isinstance(src, str):  # webdataset's pipe:curl URL (refused unless a known fetch)
            from ..index import unpipe_url

            src = unpipe_url(src)
        if _is_shard_pattern(src):
            return self._load_pattern(src)
        if isinstance(src, (str, os.PathLike)):
            reader = self._open_index(os.fspath(src))
            try:
                name = self.dataset_name or reader.name or ""
                loaded = Description.of_reader(reader, name)
            except IndexFormatError as e:
                raise with_repair_hint(e) from None
        else:
            from ..index import load_spec

            spec = load_spec(
                src, storage_options=self._uncounted(), base=self.base, url_map=self.url_map
            )
            name = self.dataset_name or spec.name or ""
            loaded = Description.of_infos(list(spec.shards), list(spec.components), name, None)
        if not loaded.infos:
            raise IndexFormatError("the dataset has no shards", shard=display_url(src))
        return loaded

    def _open_index(self, url: str) -> Any:
        """Open the index; with ``cache_dir``, a remote index's shard list is kept for offline."""
        from ..index import open_index

        remote = self.local.cache_dir is not None and not is_local(url)
        if self.local.offline and remote:
            from ..cache import open_snapshot

            return open_snapshot(url, self.local.cache_dir)  # type: ignore[arg-type]
        self.local.check_online(url)
        kwargs: dict[str, Any] = {"allow_local_shards": self.allow_local_shards}
        if self.base is not None:
            kwargs["base"] = self.base
        if not remote:
            return open_index(url, self._uncounted(), url_map=dict(self.url_map), **kwargs)
        from ..cache import save_snapshot

        # the snapshot's stat of the index goes out with the index's read, not after it
        with cf.ThreadPoolExecutor(1, thread_name_prefix="wids-index-stat") as pool:
            stat = pool.submit(self._uncounted().source(url).info)
            reader = open_index(url, self._uncounted(), url_map=dict(self.url_map), **kwargs)
            got = None if stat.exception() is not None else stat.result()  # else it stats
        save_snapshot(reader, url, self.local.cache_dir, self._uncounted(), stat=got)  # type: ignore[arg-type]
        return reader

    def _load_pattern(self, src: Any) -> Description:
        from ..index import Component, expand_braces
        from ..storage import expand_glob

        urls: list[str] = []
        for s in [src] if isinstance(src, (str, os.PathLike)) else src:
            urls += expand_braces(os.fspath(s))
        if self.base is not None:
            from ..index import resolve_url

            urls = [resolve_url(u, self.base) for u in urls]
        if self.url_map:
            from ..index import map_url

            urls = [map_url(u, self.url_map) for u in urls]
        urls = [m for u in urls for m in expand_glob(u, self._uncounted())]  # where they are
        if not urls:
            raise IndexFormatError("the shard pattern names no shards", shard=display_url(src))
        with cf.ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
            tables = list(pool.map(lambda u: self._scan(self.source(u)), urls))
        infos = [ShardInfo(u, len(m)) for u, m in zip(urls, tables, strict=True)]
        for i, m in enumerate(tables):
            self._keep_members(i, m, scanned=True)
        name = self.dataset_name or ""
        return Description.of_infos(infos, [Component(name, None, 0, len(infos))], name, None)

    # -- members ------------------------------------------------------------------------------

    def _scan(self, source: Source, expected: ShardInfo | None = None) -> ShardMembers:
        from ..cache import scan_cached
        from ..index import scan_shard

        if self.local.offline and self.local.cache_dir is not None and not source.is_local:
            # Offline (index snapshot without member tables): scan the cached copy.
            info = expected or ShardInfo(source.url, 0)
            expect: dict[str, Any] = {"size": info.size, "etag": info.etag, "md5sum": info.md5sum}
            with self.local.shard_cache().open(source, **expect) as cached:
                return self._scan(Source(cached.path))
        self.local.check_online(source.url)
        if self.local.cache_dir is not None:
            return scan_cached(
                source,
                cache_dir=self.local.cache_dir,
                expected=expected,
                duplicates=self.duplicates,
                stats=self.store.stats,
            )
        _, members, _ = scan_shard(source, duplicates=self.duplicates, stats=self.store.stats)
        return members

    def _keep_members(self, shard: int, members: ShardMembers, *, scanned: bool) -> None:
        starts, ends = members.spans()
        self._largest[shard] = int((ends - starts).max(initial=0))
        self._members[shard] = (members, members.data_end)
        if scanned:
            self._scanned.add(shard)

    def oversized(self, shard: int) -> bool:
        """Whether a loaded table holds a sample over ``max_sample_bytes``."""
        bound = self.max_sample_bytes
        return bound is not None and self._largest.get(shard, 0) > bound

    def too_large(self, shard: int, local: int, size: int) -> SampleTooLargeError:
        """The error for sample ``local`` of ``shard``, of ``size`` bytes, over the bound."""
        members = self.members(shard)[0]
        url = self.load().infos[shard].url
        key = members.key(local)
        error = SampleTooLargeError(
            f"sample {key!r} is {size:,} bytes, over max_sample_bytes={self.max_sample_bytes:,}; "
            "ds[i] reads a sample into memory whole: read large members by streaming "
            "(ds.open(i, field), or ShardListDataset(..., stream_over=...)), or raise the bound "
            "(ShardListDataset(..., max_sample_bytes=...))",
            shard=redact_url(url),
        )
        error.key, error.size = key, size
        return error

    def members(self, shard: int) -> tuple[ShardMembers, int]:
        """A shard's member table and the end of its last member's data (loaded once)."""
        got = self._members.get(shard)
        if got is not None:
            return got
        self._take_handoff()
        got = self._members.get(shard)
        if got is not None:
            return got
        loaded = self.load()
        info = loaded.infos[shard]
        try:  # outside the lock: tables of several shards may be fetched at once (prefetch)
            members = loaded.indexed(shard) if loaded.indexed is not None else None
        except IndexFormatError as e:
            raise with_repair_hint(e) from None
        with self._lock:
            got = self._members.get(shard)
            if got is not None:
                return got
            scanned = members is None
            if not scanned and self.duplicates != "error" and not self._warned_duplicates:
                self._warned_duplicates = True
                warnings.warn(
                    f"duplicates={self.duplicates!r} has no effect on shards the index already "
                    "records members for (it applies when a shard is scanned); rebuild the index "
                    "with that policy instead",
                    stacklevel=6,  # the caller of ds[i]
                )
            if members is None:
                # Not marked verified: the table may come from the scan cache, whose record is
                # matched by fingerprint only; the first touch checks a member's header too.
                members = self._scan(self.source(info.url), info)
            if len(members) != info.nsamples:
                raise IndexMismatchError(
                    f"has {len(members)} samples but the index says {info.nsamples}",
                    shard=redact_url(info.url),
                )
            self._keep_members(shard, members, scanned=scanned)
            return self._members[shard]

    @property
    def remote_tables(self) -> bool:
        """Whether member tables come from a remote index (a request each)."""
        return isinstance(self.src, (str, os.PathLike)) and not is_local(os.fspath(self.src))

    def prefetch_members(self, shards: Iterable[int], at_least: int = 2) -> None:
        """Fetch the member tables of ``shards`` not loaded yet at once, from a remote index.

        A batch's first touches of several shards then cost one round trip to the index's
        sidecars, not one after another. Nothing is done for fewer than ``at_least`` tables
        (a batch's read fetches a single one itself). Errors are left for :meth:`members`
        to raise.
        """
        self._take_handoff()  # the tables handed to this copy come first
        if not self.remote_tables:
            return
        todo = sorted({s for s in shards if s not in self._members})
        if len(todo) < max(1, at_least) or self.load().indexed is None:
            return
        with cf.ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
            for future in [pool.submit(self.members, s) for s in todo]:
                future.exception()  # waited for; raised again by members() when it matters

    # -- storage and first touch ----------------------------------------------------------------

    def _uncounted(self) -> Store:
        """The store for reading the index: its requests are not the dataset's shard I/O."""
        return self.store.with_stats()

    def source(self, url: str, info: ShardInfo | None = None) -> Source:
        """A source for ``url``; given the shard's ``info``, it reads that version only."""
        if info is None:
            return self.store.source(url)
        return self.store.source(url, size=info.size, etag=info.etag, mtime=info.mtime)

    def needs_check(self, shard: int) -> bool:
        """Whether ``shard`` must be checked against the index before it is read here."""
        return self.verify and shard not in self._verified

    def forget_check(self, shard: int) -> None:
        """Check ``shard`` again when it is next opened (nothing ties reads to its version)."""
        self._verified.discard(shard)

    def check_fingerprint(
        self, info: ShardInfo, data_end: int, reader_source: Source | None = None
    ) -> None:
        """First touch in this process: the shard's fingerprint must be the index's.

        Args:
            info: The shard's record in the index.
            data_end: End of its last member's data.
            reader_source: The source the shard's reader will read, if it reads by range:
                where each answer says the file's size and etag (HTTP, S3), every answer is
                checked against the index's size, etag and mtime (the source's pin, from
                :meth:`source`) before any byte is returned; no stat of its own.
        """
        if self.local.offline and self.local.cache_dir is not None and not is_local(info.url):
            return  # the cache checks its copy against the index's size, etag and md5
        self.local.check_online(info.url)
        fingerprint, url = info.fingerprint, info.url

        def check(stat: FileStat) -> None:
            problem = fingerprint.mismatch(stat, data_end=data_end)
            if problem is not None:
                raise mismatch_error(problem, url)

        if reader_source is not None and reader_source.answers_with_stat:
            if fingerprint.md5 is None or fingerprint.etag is not None or not _md5_store(url):
                return
            # An MD5 but no etag (shards indexed where they were written, then uploaded to an
            # object store whose etag or metadata is the MD5): the answers' pin compares sizes
            # and etags, not an etag with an MD5, so one stat goes through the fingerprint's
            # rule (a single-part S3 etag is the MD5; GCS reports md5Hash).
        source = self.source(url)
        stat, path = source.info(self.store.stats), source.local_path
        if path is not None and fingerprint.needs_content(stat, data_end=data_end):
            # new timestamps, same size: a copy (cp -r) or a rewrite? The bytes tell, once.
            memo = self.local.contents(self.src)
            problem, _ = settle(fingerprint, stat, path, memo, data_end=data_end)
            if problem is not None:
                raise mismatch_error(problem, url)
            return
        check(stat)

    def check_header(self, shard: int, members: ShardMembers, reader: Any) -> None:
        """First open in this process: one recorded member's tar header must be where it was.

        A reader that checks the headers of every read itself (remote range reads) needs no
        separate spot read: its first read is the check, with retries.
        """
        if not reader.verifies:
            problem = header_mismatch_at_spot(
                members, lambda start, end: bytes(reader.read_span(start, end, self.store.stats))
            )
            if problem is not None:
                raise mismatch_error(problem, self.load().infos[shard].url)
        self._verified.add(shard)


def _md5_store(url: str) -> bool:
    """Whether ``url``'s store reports an object's MD5 (S3 single-part etags, GCS md5Hash)."""
    return url.startswith(("s3://", "s3a://", "gs://", "gcs://"))
