"""What a dataset reads: its ``shards`` argument resolved to shards, member tables and components.

``ShardListDataset(shards)`` takes our index (JSON or SQLite, path or URL), a reference
``wids-shard-index-v1`` description (path, URL, open text stream, list of dicts) or a brace
pattern / list of shard URLs. :class:`ShardSources` loads it once, lazily, into shard infos,
cumulative lengths and :class:`DatasetComponent` ranges; finds each shard's member table (in the
index, or by scanning the shard, kept in ``cache_dir`` when given); keeps a remote index's shard
list in ``cache_dir`` for ``offline`` use; and checks a shard against the index on first touch.

:class:`ShardSources` is a mixin of :class:`~wids.dataset.listdataset.ShardListDataset`: its
state lives in the dataset's ``__dict__`` (assigned by the dataset's constructor and
per-process reset, pickled by its ``__getstate__``) and is declared here.
:class:`MemberTable` is one open shard's member table as Python lists, for the hot path.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import IndexFormatError, IndexMismatchError, OfflineError
from ..index import (
    REPAIR_HINT,
    ShardInfo,
    ShardMembers,
    header_mismatch_at_spot,
    with_repair_hint,
)
from ..samples import DuplicatePolicy
from ..storage import Source, Store, is_local, redact_url

__all__ = ["DatasetComponent", "MemberTable", "ShardSources", "display_url"]


@dataclass(frozen=True, slots=True)
class DatasetComponent:
    """One (sub-)dataset as a range of global sample indices ``[start, stop)``."""

    name: str
    weight: float | None
    start: int
    stop: int


class _Loaded:
    """The dataset's description, loaded once: shard infos, components, where members are."""

    def __init__(
        self,
        shards: list[ShardInfo],
        components: list[Any],
        name: str,
        indexed: Callable[[int], ShardMembers | None] | None,
    ) -> None:
        self.infos = shards
        self.name = name
        self.lengths = [int(s.nsamples) for s in shards]
        self.cum = np.cumsum(np.asarray(self.lengths, dtype=np.int64))
        self.cum_list: list[int] = self.cum.tolist()
        self.total = self.cum_list[-1] if self.cum_list else 0
        starts = np.concatenate([[0], self.cum]).astype(np.int64)
        self.components = [
            DatasetComponent(
                c.name or name, c.weight, int(starts[c.first_shard]), int(starts[c.stop_shard])
            )
            for c in components
        ]
        self.dataset_of = [""] * len(shards)
        for c in components:
            for i in range(c.first_shard, c.stop_shard):
                self.dataset_of[i] = c.name or name or ""
        self.indexed = indexed
        self.shard_dicts: list[dict[str, Any]] | None = None  # built when .shards is read


class MemberTable:
    """One open shard's member table, read one sample at a time.

    A thin view over the shard's ``ShardMembers`` arrays: building it costs nothing, so
    reopening a shard (random access over more shards than ``lru_size``) stays cheap. Each
    sample's rows are taken with small slices; keys are decoded when their sample is read.
    """

    __slots__ = ("blob", "dataset", "fields", "fid", "ko", "off", "size", "ss", "url")

    def __init__(self, members: ShardMembers, url: str, dataset: str) -> None:
        self.url = url
        self.dataset = dataset
        self.fields = members.fields
        self.blob = members.key_blob
        self.ko = members.key_offsets
        self.ss = members.sample_start
        self.fid = members.member_field
        self.off = members.member_offset
        self.size = members.member_size

    def key(self, j: int) -> str:
        """The key of sample ``j``."""
        a, b = self.ko[j : j + 2].tolist()
        return self.blob[a:b].decode("utf-8", "surrogateescape")

    def rows(self, j: int) -> tuple[list[int], list[int], list[int]]:
        """Sample ``j``'s members: field ids, data offsets and sizes, as lists."""
        first, stop = self.ss[j : j + 2].tolist()
        return (
            self.fid[first:stop].tolist(),
            self.off[first:stop].tolist(),
            self.size[first:stop].tolist(),
        )

    def first_member(self, j: int) -> tuple[str, int]:
        """Sample ``j``'s first member: its name (key + field) and size, to check its header."""
        first = int(self.ss[j])
        return self.key(j) + self.fields[int(self.fid[first])], int(self.size[first])

    def span(self, j: int) -> tuple[int, int]:
        """The byte span ``(start, end)`` of sample ``j``'s members in the shard."""
        first, stop = self.ss[j : j + 2].tolist()
        return int(self.off[first]), int(self.off[stop - 1] + self.size[stop - 1])

    def fill(self, sample: dict[str, Any], j: int, buf: bytes, base: int) -> None:
        """Put sample ``j``'s fields and ``__key__`` into ``sample``; ``buf`` starts at ``base``."""
        fields = self.fields
        fids, offs, sizes = self.rows(j)
        for f, o, n in zip(fids, offs, sizes, strict=True):
            a = o - base
            sample[fields[f]] = buf[a : a + n]
        sample["__key__"] = self.key(j)


def _is_shard_pattern(src: Any) -> bool:
    if isinstance(src, (list, tuple)):
        return len(src) > 0 and all(isinstance(s, str) for s in src)
    if not isinstance(src, (str, os.PathLike)):
        return False
    s = os.fspath(src)
    return ("{" in s and "}" in s) or s.endswith((".tar", ".tgz", ".tar.gz"))


def display_url(src: Any) -> str | None:
    """The ``shards`` argument as errors and ``repr`` show it: a redacted URL, or ``None``."""
    if isinstance(src, (str, os.PathLike)):
        return redact_url(os.fspath(src))
    return None


class ShardSources:
    """The description, member tables and index checks of a ``ShardListDataset`` (a mixin).

    Holds no state of its own: the attributes below are the dataset's, assigned by its
    constructor (configuration, ``_loaded``, ``_members`` ...) or per process (``_lock``,
    ``_verified``). ``_cache()`` is the dataset's per-process ``ShardCache``.
    """

    _src: Any
    dataset_name: str | None
    base: str | None
    url_map: tuple[tuple[str, str], ...]  # checked, longest prefix first
    allow_local_shards: bool
    cache_dir: str | None
    offline: bool
    duplicates: DuplicatePolicy
    _store: Store  # storage options, retry policy, this process's I/O counters
    _lock: threading.RLock
    _loaded: _Loaded | None
    _members: dict[int, tuple[ShardMembers, int]]  # table, end of its last member's data
    _scanned: set[int]  # member tables that came from scanning (costly)
    _warned_duplicates: bool
    _verified: set[int]

    def _cache(self) -> Any:
        raise NotImplementedError  # the dataset's

    # -- the description ----------------------------------------------------------------------

    def _load(self) -> _Loaded:
        loaded = self._loaded
        if loaded is None:
            with self._lock:
                if self._loaded is None:
                    self._loaded = self._load_description()
                loaded = self._loaded
        return loaded

    def _load_description(self) -> _Loaded:
        src = self._src
        if _is_shard_pattern(src):
            return self._load_pattern(src)
        if isinstance(src, (str, os.PathLike)):
            reader = self._open_index(os.fspath(src))
            try:
                shards, components = list(reader.shards), list(reader.components)
            except IndexFormatError as e:
                raise with_repair_hint(e) from None
            name = self.dataset_name or reader.name or ""
            loaded = _Loaded(shards, components, name, reader.members)
        else:
            from ..index import load_spec

            spec = load_spec(
                src, storage_options=self._uncounted(), base=self.base, url_map=self.url_map
            )
            name = self.dataset_name or spec.name or ""
            loaded = _Loaded(list(spec.shards), list(spec.components), name, None)
        if not loaded.infos:
            raise IndexFormatError("the dataset has no shards", shard=display_url(src))
        return loaded

    def _open_index(self, url: str) -> Any:
        """Open the index; with ``cache_dir``, a remote index's shard list is kept for offline."""
        from ..index import open_index

        remote = self.cache_dir is not None and not is_local(url)
        if self.offline and remote:
            from ..cache import open_snapshot

            return open_snapshot(url, self.cache_dir)  # type: ignore[arg-type]
        self._check_offline(url)
        kwargs: dict[str, Any] = {"allow_local_shards": self.allow_local_shards}
        if self.base is not None:
            kwargs["base"] = self.base
        reader = open_index(url, self._uncounted(), url_map=dict(self.url_map), **kwargs)
        if remote:
            from ..cache import save_snapshot

            save_snapshot(reader, url, self.cache_dir, self._uncounted())  # type: ignore[arg-type]
        return reader

    def _load_pattern(self, src: Any) -> _Loaded:
        from ..index import Component, expand_braces

        urls: list[str] = []
        for s in [src] if isinstance(src, (str, os.PathLike)) else src:
            urls += expand_braces(os.fspath(s))
        if self.base is not None:
            from ..index import resolve_url

            urls = [resolve_url(u, self.base) for u in urls]
        if self.url_map:
            from ..index import map_url

            urls = [map_url(u, self.url_map) for u in urls]
        if not urls:
            raise IndexFormatError("the shard pattern names no shards", shard=display_url(src))
        with cf.ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
            tables = list(pool.map(lambda u: self._scan(self._source(u)), urls))
        infos = [ShardInfo(u, len(m)) for u, m in zip(urls, tables, strict=True)]
        for i, m in enumerate(tables):
            self._keep_members(i, m, scanned=True)
        name = self.dataset_name or ""
        return _Loaded(infos, [Component(name, None, 0, len(infos))], name, None)

    # -- members ------------------------------------------------------------------------------

    def _scan(self, source: Source, expected: ShardInfo | None = None) -> ShardMembers:
        from ..cache import scan_cached
        from ..index import scan_shard

        if self.offline and self.cache_dir is not None and not source.is_local:
            # Offline (index snapshot without member tables): scan the cached copy.
            info = expected or ShardInfo(source.url, 0)
            expect = {"size": info.size, "etag": info.etag, "md5sum": info.md5sum}
            with self._cache().open(source, **expect) as cached:
                return self._scan(Source(cached.path))
        self._check_offline(source.url)
        if self.cache_dir is not None:
            return scan_cached(
                source,
                cache_dir=self.cache_dir,
                expected=expected,
                duplicates=self.duplicates,
                stats=self._store.stats,
            )
        _, members, _ = scan_shard(source, duplicates=self.duplicates, stats=self._store.stats)
        return members

    def _keep_members(self, shard: int, members: ShardMembers, *, scanned: bool) -> None:
        ends = members.spans()[1]
        self._members[shard] = (members, int(ends.max(initial=0)))
        if scanned:
            self._scanned.add(shard)

    def _shard_members(self, shard: int) -> tuple[ShardMembers, int]:
        got = self._members.get(shard)
        if got is not None:
            return got
        with self._lock:
            got = self._members.get(shard)
            if got is not None:
                return got
            loaded = self._load()
            info = loaded.infos[shard]
            try:
                members = loaded.indexed(shard) if loaded.indexed is not None else None
            except IndexFormatError as e:
                raise with_repair_hint(e) from None
            scanned = members is None
            if not scanned and self.duplicates != "error" and not self._warned_duplicates:
                self._warned_duplicates = True
                warnings.warn(
                    f"duplicates={self.duplicates!r} has no effect on shards the index already "
                    "records members for (it applies when a shard is scanned); rebuild the index "
                    "with that policy instead",
                    stacklevel=5,  # the caller of ds[i]
                )
            if members is None:
                # Not marked verified: the table may come from the scan cache, whose record is
                # matched by fingerprint only; the first touch checks a member's header too.
                members = self._scan(self._source(info.url), info)
            if len(members) != info.nsamples:
                raise IndexMismatchError(
                    f"has {len(members)} samples but the index says {info.nsamples}",
                    shard=redact_url(info.url),
                )
            self._keep_members(shard, members, scanned=scanned)
            return self._members[shard]

    # -- storage ------------------------------------------------------------

    def _uncounted(self) -> Store:
        """The store for reading the index: its requests are not the dataset's shard I/O."""
        return self._store.with_stats()

    def _source(self, url: str, info: ShardInfo | None = None) -> Source:
        """A source for ``url``; given the shard's ``info``, it reads that version only."""
        if info is None:
            return self._store.source(url)
        return self._store.source(url, size=info.size, etag=info.etag)

    def _check_offline(self, url: str) -> None:
        if self.offline and not is_local(url):
            raise OfflineError("offline, and this is not a local file", shard=redact_url(url))

    def _verify(self, shard: int, info: ShardInfo, data_end: int) -> None:
        """First touch in this process: the shard's fingerprint must be the index's."""
        if self.offline and self.cache_dir is not None and not is_local(info.url):
            return  # the cache checks its copy against the index's size, etag and md5
        self._check_offline(info.url)
        stat = self._source(info.url).info(self._store.stats)
        problem = info.fingerprint.mismatch(stat, data_end=data_end)
        if problem is not None:
            raise _changed(problem, info.url)

    def _verify_header(self, shard: int, members: ShardMembers, reader: Any) -> None:
        """First open in this process: one recorded member's tar header must be where it was."""

        def read(start: int, end: int) -> bytes:
            if not reader.verifies:
                return bytes(reader.read_span(start, end, self._store.stats))
            # over a network a wrong answer is retried, and reported as one if it persists
            return bytes(reader.read_span(start, end, self._store.stats, check))

        def check(got: bytes) -> str | None:
            return header_mismatch_at_spot(members, lambda *_: got)

        problem = header_mismatch_at_spot(members, read)
        if problem is not None:
            raise _changed(problem, self._load().infos[shard].url)
        self._verified.add(shard)


def _changed(problem: str, url: str) -> IndexMismatchError:
    return IndexMismatchError(
        f"not the shard the index describes: {problem}; it changed after indexing, so "
        f"{REPAIR_HINT}",
        shard=redact_url(url),
    )
