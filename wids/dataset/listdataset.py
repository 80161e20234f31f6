"""``ShardListDataset``: map-style random access to the samples of WebDataset shards.

A global index maps to (shard, sample) by a binary search over the cumulative lengths; the
sample's byte span comes from the shard's member table (``ShardMembers``, loaded lazily and kept)
and is read with one range request, then sliced into its fields. A batch
(``__getitems__``) becomes one request per run of nearby samples of a shard, all in flight at
once. Readers are opened lazily in each process and never pickled.

What the dataset reads (the ``shards`` argument resolved to shards, member tables and
components) is :mod:`wids.dataset.catalog`; how it reads a shard's bytes is
:mod:`wids.dataset.readers`.
"""

from __future__ import annotations

import bisect
import operator
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..decode import Decoder, interpret_transformations
from ..index import ShardInfo, ShardMembers, check_url_map
from ..samples import DUPLICATE_POLICIES, DuplicatePolicy
from ..storage import RetryPolicy, Store
from .catalog import DatasetComponent, MemberTable, ShardSources, display_url
from .readers import (
    HEADER,
    CachedReader,
    LocalReader,
    RangeReader,
    ShardReader,
    download_check,
    fetch_blocks,
    header_check,
    plan_batch,
)

__all__ = ["DatasetComponent", "DatasetStats", "ShardListDataset"]

ACCESS_MODES = ("auto", "range", "shard")
Transform = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class DatasetStats:
    """What this process's copy of a dataset has done so far.

    Attributes:
        samples: Samples returned.
        accesses: Shard look-ups, one per sample (the reference's ``get_stats()[0]``).
        misses: Look-ups that had to open a shard reader (the reference's ``get_stats()[1]``).
        requests: Storage requests (stats, range reads, retries included).
        bytes_read: Bytes received from storage or the local cache.
        cache_hits: Samples served from the local shard cache.
        retries: Requests repeated after transient failures.
        errors: Operations that failed for good.
    """

    samples: int
    accesses: int
    misses: int
    requests: int
    bytes_read: int
    cache_hits: int
    retries: int
    errors: int


class ShardListDataset(ShardSources):
    """A map-style dataset over WebDataset tar shards, reading only the samples asked for.

    A drop-in for the reference ``wids.ShardListDataset`` (see ``docs/compat.md``), with member
    offsets: ``ds[i]`` is one range request for that sample's bytes, wherever the shards are.

    Samples are dicts: field keys keep the leading dot and the full extension (``".jpg"``,
    ``".seg.png"``, ``".txt.gz"``), plus ``__key__``, ``__index__`` (the non-negative index),
    ``__shard__`` (resolved shard URL), ``__shardindex__`` and ``__dataset__`` (the component's
    name, ``""`` if none, never ``None`` so ``default_collate`` accepts it).

    **Difference from the reference:** raw field values (``transformations=[]``) are ``bytes``,
    not ``io.BytesIO``. Decoders here accept both; a transformation of your own that calls
    ``value.read()`` needs ``io.BytesIO(value)`` instead.

    Args:
        shards: Our index (JSON or SQLite, path or URL), a reference ``wids-shard-index-v1``
            JSON (path, URL or open text stream), a list of ``{"url", "nsamples"}`` dicts, or
            a brace pattern / list of shard URLs (scanned on first use).
        cache_size: Byte budget of the shard cache (``access="shard"``).
        cache_dir: Local cache directory: whole shards (``access="shard"``) and member tables of
            shards whose index has no offsets (scanned once per machine).
        lru_size: Open shard readers (file descriptors, cached shards) kept per process.
        localname: Not supported (the cache chooses collision-free names); warns if given.
        transformations: ``"PIL"``, ``"numpy"``, an image mode (``"rgb8"``, ``"torchrgb"`` ...,
            see ``wids.decode.IMAGE_MODES``), a callable, or a list of those; ``[]`` for raw.
        keep: Never evict shards from the cache automatically (``access="shard"``).
        base: Directory against which relative shard URLs resolve.
        options: As the reference: top-level keys that override the description's; only
            ``name`` is supported, others warn.
        dataset_name: Name of the dataset when ``shards`` is a list (reference parameter).
        storage_options: fsspec options for every URL (index and shards).
        access: ``"auto"`` (local files read in place, remote shards by range requests and,
            with ``cache_dir``, fetched whole into the cache in the background once
            ``promote_share`` of a shard's bytes were requested),
            ``"range"`` (range requests always) or ``"shard"`` (whole shards into ``cache_dir``,
            then local reads).
        verify: On first touch of a shard in a process, check that it is the shard the index
            describes: its fingerprint (size, plus etag, or mtime where the store gives no
            etag; one ``info()``) and the tar header of one recorded member (one 512-byte
            read); a mismatch raises ``IndexMismatchError``.
        retry: Retry and timeout policy for storage requests.
        merge_gap: In a batch, samples of one shard closer than this many bytes share a request
            (consecutive samples always do: only tar headers lie between them).
        offline: Never touch the network: remote data that is not cached raises ``OfflineError``.
        duplicates: Policy for repeated keys or fields when a shard must be scanned
            (``"error"``, ``"split"``, ``"keep_first"``).
        allow_pickle: Let the decoders unpickle ``.pyd/.pickle/.pkl/.pt/.pth`` fields.
        promote_share: With ``access="auto"`` and ``cache_dir``: the share (0 to 1) of a remote
            shard's bytes requested by range before the whole shard is cached.
        url_map: Read shards from a mirror or proxy holding the same bytes:
            ``{"https://old/": "s3://new/"}`` replaces the longest matching prefix of each
            resolved shard URL. A mapped shard is checked by size and member headers (the
            etag and mtime recorded at the old location are another store's).
        allow_local_shards: Let an index read from a remote location (http, s3, gs, ...) name
            local files (absolute paths, ``file://``, ``memory://``); refused by default with
            ``IndexFormatError``, so a crafted remote index cannot serve the user's files.

    Raises:
        ValueError: An invalid parameter (checked here; all I/O happens lazily).
    """

    def __init__(
        self,
        shards: Any,
        *,
        cache_size: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        lru_size: int = 10,
        localname: Callable[[str], str] | None = None,
        transformations: Any = "PIL",
        keep: bool = False,
        base: str | None = None,
        options: Mapping[str, Any] | None = None,
        dataset_name: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        access: str = "auto",
        verify: bool = True,
        retry: RetryPolicy | None = None,
        merge_gap: int = 1 << 16,
        offline: bool = False,
        duplicates: DuplicatePolicy = "error",
        allow_pickle: bool = False,
        promote_share: float = 0.05,
        url_map: Mapping[str, str] | None = None,
        allow_local_shards: bool = False,
    ) -> None:
        if access not in ACCESS_MODES:
            raise ValueError(f"access must be one of {ACCESS_MODES}, not {access!r}")
        if duplicates not in DUPLICATE_POLICIES:
            raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}, not {duplicates!r}")
        if isinstance(lru_size, bool) or not isinstance(lru_size, int) or lru_size < 1:
            raise ValueError(f"lru_size must be an int >= 1, not {lru_size!r}")
        if isinstance(merge_gap, bool) or not isinstance(merge_gap, int) or merge_gap < 0:
            raise ValueError(f"merge_gap must be an int >= 0, not {merge_gap!r}")
        if cache_size is not None and cache_size < 0:
            raise ValueError(f"cache_size must be >= 0 or None, not {cache_size!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        if not 0.0 <= promote_share <= 1.0:
            raise ValueError(f"promote_share must be between 0 and 1, not {promote_share!r}")
        if access == "shard" and cache_dir is None:
            raise ValueError("access='shard' needs cache_dir")
        if localname is not None:
            warnings.warn(
                "localname is not supported: the shard cache names its files itself "
                "(collision-free); pass cache_dir",
                stacklevel=2,
            )
        if (access == "range" or cache_dir is None) and (cache_size is not None or keep):
            warnings.warn(
                f"cache_size and keep apply to the shard cache (cache_dir with access 'shard' "
                f"or 'auto'); with access={access!r} and cache_dir={cache_dir!r} no shard is "
                f"downloaded, so they have no effect",
                stacklevel=2,
            )
        options = dict(options or {})
        unknown = sorted(set(options) - {"name"})
        if unknown:
            warnings.warn(f"options {unknown} are not supported and have no effect", stacklevel=2)
        self.transformations: list[Transform] = interpret_transformations(
            transformations, allow_pickle=allow_pickle
        )
        if allow_pickle and not any(isinstance(t, Decoder) for t in self.transformations):
            warnings.warn(
                "allow_pickle=True has no effect: no built-in decoder among the transformations",
                stacklevel=2,
            )
        self._src = shards
        self.cache_size = cache_size
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.lru_size = lru_size
        self.keep = bool(keep)
        self.base = base
        self.url_map = check_url_map(url_map)
        self.allow_local_shards = bool(allow_local_shards)
        self.dataset_name = options.get("name", dataset_name)
        self.access = access
        self.verify = bool(verify)
        self._store = Store(storage_options, retry)
        self.merge_gap = merge_gap
        self.offline = bool(offline)
        self.duplicates: DuplicatePolicy = duplicates
        self.allow_pickle = bool(allow_pickle)
        self.promote_share = float(promote_share)
        # range reads are counted towards promotion only in this configuration
        self._promotable = access == "auto" and self.cache_dir is not None
        self._loaded = None
        self._members = {}
        self._scanned = set()
        self._warned_duplicates = False
        self._counts = {"samples": 0, "accesses": 0, "misses": 0, "cache_hits": 0}
        self._reset_process_state()

    # -- per-process state --------------------------------------------------------------------

    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._verified = set()
        self._pins: dict[int, str] = {}  # etags seen by readers since closed (LRU)
        self._tables: dict[int, MemberTable] = {}
        self._lock = threading.RLock()
        self._shard_cache: Any = None
        self._promoter: Any = None

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's readers are not ours to use
            self._reset_process_state()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_readers", "_verified", "_pins", "_tables", "_lock", "_shard_cache"):
            del state[k]
        for k in ("_promoter", "_pid"):
            del state[k]
        # Tables from an index reload cheaply; scanned ones would cost a pass over the shard.
        state["_members"] = {i: m for i, m in self._members.items() if i in self._scanned}
        if self._loaded is not None and self._loaded.indexed is not None:
            state["_loaded"] = None  # holds an open index; reload in the new process
            state["_members"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    # -- readers ------------------------------------------------------------------------------

    def _reader(self, shard: int) -> ShardReader:
        """The open reader of a shard (opening and verifying it if needed); counts an access."""
        self._counts["accesses"] += 1
        reader = self._readers.get(shard)
        if reader is not None and self._promoter is not None and not reader.cached:
            reader = self._promoted(shard, reader)
        if reader is not None:
            try:
                self._readers.move_to_end(shard)
            except KeyError:  # another thread has just evicted it
                pass
            return reader
        with self._lock:
            self._counts["misses"] += 1
            loaded = self._load()
            info = loaded.infos[shard]
            members = self._shard_members(shard)
            check = self.verify and shard not in self._verified
            if check:
                self._verify(shard, info, members[1])
            reader = self._open_reader(info, members[0], self._pins.get(shard))
            if check:
                try:
                    self._verify_header(shard, members[0], reader)
                except BaseException:
                    reader.close()
                    raise
            self._readers[shard] = reader
            self._tables[shard] = MemberTable(members[0], info.url, loaded.dataset_of[shard])
            return reader

    def _evict(self) -> None:
        """Close the least recently used readers beyond ``lru_size``.

        Called after a read, never during one: a batch may use more shards than that.
        """
        if len(self._readers) <= self.lru_size:
            return
        with self._lock:
            while len(self._readers) > self.lru_size:
                shard, old = self._readers.popitem(last=False)
                self._tables.pop(shard, None)
                src = old.source
                if src is not None and not src.is_local:
                    if src.etag is not None:  # the reopened reader reads the same version
                        self._pins[shard] = src.etag
                    if not src.pins_version:  # nothing ties reads to a version: stat again
                        self._verified.discard(shard)
                old.close()

    def _cache(self) -> Any:
        """This process's ``ShardCache`` (``cache_dir`` is set)."""
        if self._shard_cache is None:
            from ..cache import ShardCache

            if self.cache_dir is None:  # callers check; a bug if reached
                raise RuntimeError("the shard cache needs cache_dir")
            self._shard_cache = ShardCache(
                self.cache_dir, max_bytes=self.cache_size, keep=self.keep, offline=self.offline
            )
        return self._shard_cache

    def _open_reader(
        self, info: ShardInfo, members: ShardMembers, pin: str | None = None
    ) -> ShardReader:
        source = self._source(info.url, info)
        if source.etag is None:
            source.etag = pin
        expect = {"size": info.size, "etag": info.etag, "md5sum": info.md5sum}
        uses_cache = self.cache_dir is not None and self.access != "range"
        if uses_cache and not source.is_local:
            if self.access == "shard" or self.offline:
                verify = download_check(members, info.url)
                shard = self._cache().open(source, stats=self._store.stats, verify=verify, **expect)
                return CachedReader(shard)
            cached = self._cache().open_cached(info.url, **expect)  # promoted earlier
            if cached is not None:
                return CachedReader(cached)
        self._check_offline(info.url)
        return LocalReader(source) if source.is_local else RangeReader(source)

    def _requested(self, shard: int, reader: ShardReader, nbytes: int) -> None:
        """``access="auto"``: count bytes read by range; promote the shard at the share."""
        if self.access != "auto" or self.cache_dir is None or reader.cached:
            return
        if reader.source is None or reader.source.is_local:
            return
        if self._promoter is None:
            from ..cache import Promoter

            self._promoter = Promoter(self._cache(), self.promote_share)
        info = self._load().infos[shard]
        members, data_end = self._members[shard]
        shard_bytes = info.size if info.size is not None else data_end
        self._promoter.requested(
            reader.source,
            nbytes,
            shard_bytes=shard_bytes,
            size=info.size,
            etag=info.etag,
            md5sum=info.md5sum,
            stats=self._store.stats,
            verify=download_check(members, info.url),
        )

    def _promoted(self, shard: int, reader: ShardReader) -> ShardReader:
        """Swap a range reader for the cached copy once its promotion has finished."""
        info = self._load().infos[shard]
        cached = self._promoter.open_if_ready(
            info.url, size=info.size, etag=info.etag, md5sum=info.md5sum
        )
        if cached is None:
            return reader
        with self._lock:
            reader.close()
            new = CachedReader(cached)
            self._readers[shard] = new
            return new

    # -- indexing -----------------------------------------------------------------------------

    def _locate(self, index: Any) -> tuple[int, int, int]:
        """``(global index, shard, index in shard)``, for Python-style (negative) indices."""
        i = index if type(index) is int else operator.index(index)
        loaded = self._loaded or self._load()
        n = loaded.total
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} samples")
        cum = loaded.cum_list
        shard = bisect.bisect_right(cum, i)
        return i, shard, (i - cum[shard - 1] if shard else i)

    def _assemble(
        self, table: MemberTable, i: int, local: int, buf: bytes, base: int
    ) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        table.fill(sample, local, buf, base)
        sample["__index__"] = i
        sample["__shard__"] = table.url
        sample["__shardindex__"] = local
        sample["__dataset__"] = table.dataset
        return sample

    def _transform(self, sample: dict[str, Any]) -> Any:
        out: Any = sample
        for t in self.transformations:
            out = t(out)
        return out

    def _raw(self, index: Any) -> dict[str, Any]:
        # The hot path of random access: keep it flat (see tools/bench_read.py).
        if self._pid != os.getpid():
            self._reset_process_state()
        i = index if type(index) is int else operator.index(index)
        loaded = self._loaded or self._load()
        if i < 0:
            i += loaded.total
        if not 0 <= i < loaded.total:
            raise IndexError(f"index {index} out of range for a dataset of {loaded.total} samples")
        cum = loaded.cum_list
        shard = bisect.bisect_right(cum, i)
        local = i - cum[shard - 1] if shard else i
        reader = self._readers.get(shard)
        if reader is None or self._promoter is not None:
            reader = self._reader(shard)
        else:  # the fast path of _reader
            self._counts["accesses"] += 1
            try:
                self._readers.move_to_end(shard)
            except KeyError:  # another thread has just evicted it
                pass
        table = self._tables[shard]
        fids, offs, sizes = table.rows(local)
        start, end = offs[0], offs[-1] + sizes[-1]
        check = None
        if reader.verifies:  # read the first member's tar header too, and check it
            start -= HEADER
            name = table.key(local) + table.fields[fids[0]]
            check = header_check(((0, name, sizes[0]),), start)
        try:
            if self._promotable:  # before the read: a promotion then overlaps with it
                self._requested(shard, reader, end - start)
            buf = reader.read_span(start, end, self._store.stats, check)
        finally:
            if len(self._readers) > self.lru_size:
                self._evict()
        counts = self._counts
        counts["samples"] += 1
        if reader.cached:
            counts["cache_hits"] += 1
        fields = table.fields
        sample: dict[str, Any] = {}
        for f, o, n in zip(fids, offs, sizes, strict=True):
            a = o - start
            sample[fields[f]] = buf[a : a + n]
        sample["__key__"] = table.key(local)
        sample["__index__"] = i
        sample["__shard__"] = table.url
        sample["__shardindex__"] = local
        sample["__dataset__"] = table.dataset
        return sample

    def __getitem__(self, index: Any) -> Any:
        """The sample at ``index`` (negative counts from the end), transformed.

        Raises:
            IndexError: ``index`` is out of range.
            TypeError: ``index`` is not an integer.
        """
        sample: Any = self._raw(index)
        for t in self.transformations:
            sample = t(sample)
        return sample

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        """Many samples at once (torch's DataLoader calls this for a batch).

        Samples of one shard whose spans are adjacent or within ``merge_gap`` bytes are read
        with one request; all requests are issued concurrently.
        """
        self._check_process()
        located = [self._locate(x) for x in indices]
        readers = {shard: self._reader(shard) for _, shard, _ in located}
        tables = {shard: self._tables[shard] for shard in readers}
        spans = []
        for _, shard, local in located:
            start, end = tables[shard].span(local)
            if readers[shard].verifies:  # the first member's tar header too, to check it
                start -= HEADER
            spans.append((shard, start, end, local))
        blocks, where = plan_batch(spans, self.merge_gap)
        checks = self._header_checks(located, readers, tables, blocks, where)
        raws = []
        try:  # readers stay open until every block is read: evict only afterwards
            if self._promotable:  # before the reads: a promotion then overlaps with them
                for blk in blocks:
                    self._requested(blk.shard, readers[blk.shard], blk.end - blk.start)
            data = fetch_blocks(blocks, readers, self._store.stats, defer_local=True, checks=checks)
            uses = [0] * len(blocks)
            for b, _ in where:
                uses[b] += 1
            for (i, shard, local), (b, offset), span in zip(located, where, spans, strict=True):
                buf = data[b]
                if buf is None:
                    blk = blocks[b]
                    buf = data[b] = readers[shard].read_span(blk.start, blk.end, self._store.stats)
                raws.append(self._assemble(tables[shard], i, local, buf, span[1] - offset))
                uses[b] -= 1
                if not uses[b]:  # free it now: the next read reuses the memory
                    data[b] = None
                self._counts["samples"] += 1
                self._counts["cache_hits"] += readers[shard].cached
        finally:
            self._evict()
        return [self._transform(raw) for raw in raws]

    @staticmethod
    def _header_checks(
        located: list[tuple[int, int, int]],
        readers: dict[int, ShardReader],
        tables: dict[int, MemberTable],
        blocks: Sequence[Any],
        where: list[tuple[int, int]],
    ) -> list[Any] | None:
        """Per block, a check of the first-member header of every sample it holds, if verified."""
        headers: dict[int, list[tuple[int, str, int]]] = {}
        for (_, shard, local), (b, offset) in zip(located, where, strict=True):
            if readers[shard].verifies:
                name, size = tables[shard].first_member(local)
                headers.setdefault(b, []).append((offset, name, size))
        if not headers:
            return None
        return [
            header_check(headers[b], blk.start) if b in headers else None
            for b, blk in enumerate(blocks)
        ]

    # -- reference API ------------------------------------------------------------------------

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The shards as the reference lists them: dicts with ``url``, ``nsamples`` ..."""
        loaded = self._load()
        if loaded.shard_dicts is None:
            out = []
            for info, ds in zip(loaded.infos, loaded.dataset_of, strict=True):
                d: dict[str, Any] = {"url": info.url, "nsamples": info.nsamples}
                for k, v in (("filesize", info.size), ("md5sum", info.md5sum), ("etag", info.etag)):
                    if v is not None:
                        d[k] = v
                d["dataset"] = ds
                out.append(d)
            loaded.shard_dicts = out
        return loaded.shard_dicts

    @property
    def lengths(self) -> list[int]:
        """Samples per shard."""
        return list(self._load().lengths)

    @property
    def cum_lengths(self) -> np.ndarray:
        """Cumulative sample counts (``numpy.cumsum(lengths)``)."""
        return self._load().cum.copy()

    @property
    def total_length(self) -> int:
        """Total number of samples."""
        return int(self._load().cum[-1])

    @property
    def name(self) -> str:
        """The dataset's name (``""`` if none)."""
        return self._load().name

    @property
    def components(self) -> list[DatasetComponent]:
        """The (sub-)datasets as global sample ranges, for mixing samplers."""
        return list(self._load().components)

    def __len__(self) -> int:
        return self.total_length

    def __add__(self, other: Any) -> Any:
        """``ds1 + ds2`` as with a torch ``Dataset``: a ``torch.utils.data.ConcatDataset``."""
        from torch.utils.data import ConcatDataset

        return ConcatDataset([self, other])  # type: ignore[list-item]  # duck-typed

    def add_transform(self, transform: Transform) -> ShardListDataset:
        """Append a transformation (applied after the others). Returns ``self``."""
        if not callable(transform):
            raise TypeError(f"transform must be callable, not {transform!r}")
        self.transformations.append(transform)
        return self

    def get_shard(self, index: Any) -> tuple[_ShardView, int, dict[str, Any]]:
        """As the reference: ``(shard, index in shard, shard dict)`` for a global index.

        The shard object supports ``len()`` and ``shard[j]`` (a raw sample dict).
        """
        self._check_process()
        _, shard, local = self._locate(index)
        self._reader(shard)
        return _ShardView(self, shard), local, self.shards[shard]

    def get_stats(self) -> tuple[int, int]:
        """``(accesses, misses)`` of shard look-ups in this process, as the reference."""
        return self._counts["accesses"], self._counts["misses"]

    @property
    def stats(self) -> DatasetStats:
        """A snapshot of this process's counters."""
        io = self._store.stats
        c = self._counts
        return DatasetStats(
            samples=c["samples"],
            accesses=c["accesses"],
            misses=c["misses"],
            requests=io.requests,
            bytes_read=io.bytes_read,
            cache_hits=c["cache_hits"],
            retries=io.retries,
            errors=io.errors,
        )

    def close(self) -> None:
        """Close open readers; the dataset stays usable and reopens them when needed."""
        with self._lock:
            readers, self._readers = self._readers, OrderedDict()
            self._tables = {}
            for r in readers.values():
                r.close()

    def __repr__(self) -> str:
        what = display_url(self._src) if isinstance(self._src, (str, os.PathLike)) else "<list>"
        n = "?" if self._loaded is None else str(len(self))
        return f"ShardListDataset({what!r}, samples={n}, access={self.access!r})"


class _ShardView:
    """One shard of a dataset, as ``get_shard`` returns it: ``len()`` and raw ``[j]``."""

    def __init__(self, dataset: ShardListDataset, shard: int) -> None:
        self.dataset = dataset
        self.shard = shard
        self.url = dataset._load().infos[shard].url

    def __len__(self) -> int:
        return self.dataset._load().lengths[self.shard]

    def __getitem__(self, j: int) -> dict[str, Any]:
        n = len(self)
        j = operator.index(j)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"index {j} out of range for a shard of {n} samples")
        start = int(self.dataset._load().cum[self.shard - 1]) if self.shard else 0
        return self.dataset._raw(start + j)
