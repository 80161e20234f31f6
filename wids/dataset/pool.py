"""A dataset's open shard readers: which kind to open, how many to keep, and reads through them.

:class:`ReaderPool` holds at most ``lru_size`` remote or cached readers per process (least
recently used closed first, never during a read); a local shard's reader is only its path and
member-table view over a descriptor in the pool's :class:`~wids.storage.DescriptorPool`
(bounded by the process's file limit, not by ``lru_size``), kept once opened. It decides, per
the ``access`` mode, how a shard is read: in place (local files), by range requests, or from
the local shard cache (``access="shard"``, offline, or a shard promoted by ``access="auto"``:
see :class:`~wids.cache.Promoter`). A shard is checked against the index by the catalog when
its reader opens first in a process. Reads end in
:meth:`~wids.dataset.tables.MemberTable.sample`, one sample or a batch at a time.

A batch that carries its sampler's plan (:mod:`wids.plan`) also drives this process's
:class:`~wids.dataset.lookahead.Lookahead`: the batches the plan says come next are read early,
and shards the plan reads most of soon are announced for promotion (:meth:`ReaderPool.planned`).
The plan of a batch's reads (:meth:`ReaderPool.plan_reads`) is the one both the direct reads
and the prefetches use.

Readers, member tables, the promoter, the lookahead and their threads belong to one process:
never pickled, dropped after a fork, stopped by :meth:`ReaderPool.close`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import RangeNotSupportedError
from ..plan import shard_shares
from ..storage import DescriptorPool, is_local, strip_credentials
from .catalog import Catalog
from .compressed import compressed_reader
from .localread import LocalShard, read_local_batch
from .lookahead import Lookahead, fetch_prefetched
from .readers import (
    HEADER,
    Block,
    CachedReader,
    LocalReader,
    RangeReader,
    ShardReader,
    download_check,
    header_check,
    plan_batch,
)
from .stats import DatasetStats
from .tables import MemberTable
from .wholeshard import probe_range, whole_reader

if TYPE_CHECKING:
    from ..cache import Promoter
    from ..index import ShardInfo, ShardMembers
    from ..plan import Plan
    from ..storage import Check

Located = Sequence[tuple[int, int, int]]

__all__ = ["ACCESS_MODES", "LOOKAHEADS", "WARM_GRACE", "WARM_SHARDS", "ReaderPool"]

log = logging.getLogger(__name__)

ACCESS_MODES = ("auto", "range", "shard")

LOOKAHEADS = 2
"""Iterations a process reads ahead for at once, each with its own lookahead (the most recent
ones): a training and a validation loader iterated alternately in one process (``num_workers=0``)
each keep theirs. With one lookahead, each switch dropped the other's prefetches and stride (1.6x
the bytes of the two read one after the other, batches of the two taking turns every 5)."""
WARM_SHARDS = 8
"""At most this many shards are fetched by a warm-up (``ReaderPool.warm``): the first ones an
iteration reads, while a DataLoader's workers start; the workers' own plans fetch the rest."""
WARM_GRACE = 0.3
"""Seconds a warm-up first waits for readers: forked DataLoader workers read (and mark
themselves readers) within this, and fetch for themselves; a main process downloading beside
them slowed them (the natural sampler's order under fork: 0.67-0.86x the samples/s, three runs
of ``tools/bench_startmethods.py --contexts '' --offpath fork``). Forkserver and spawn workers
import torch first, a second or more: the warm-up fills that."""


class ReaderPool:
    """The open shard readers of one dataset in one process, and the counts of their use.

    Args:
        catalog: The dataset's shards, member tables and first-touch checks.
        lru_size: Remote or cached readers kept open (local ones: ``descriptors`` bounds them).
        access: ``"auto"``, ``"range"`` or ``"shard"`` (see ``ShardListDataset``).
        promote_share: With ``access="auto"`` and a cache directory, the share of a remote
            shard's bytes requested by range before it is fetched whole.

    Attributes:
        counts: ``samples``, ``accesses``, ``misses`` (look-ups that opened a reader) and
            ``cache_hits`` so far, but for local shards' fast-path reads (:meth:`totals`).
    """

    def __init__(
        self, catalog: Catalog, *, lru_size: int, access: str, promote_share: float
    ) -> None:
        self.catalog = catalog
        self.local = catalog.local
        self.lru_size = lru_size
        self.access = access
        self.promote_share = float(promote_share)
        bound = catalog.max_sample_bytes  # the one bound of ds[i]'s sample sizes
        self.max_sample = bound if bound is not None else 1 << 63
        # range reads are counted towards promotion only in this configuration
        self._promotable = access == "auto" and self.local.cache_dir is not None
        self.counts = {"samples": 0, "accesses": 0, "misses": 0, "cache_hits": 0}
        # the lookahead's bounds (depth, max_bytes, max_requests, horizon), if not its defaults
        self.lookahead_limits: dict[str, int] = {}
        self.descriptors = DescriptorPool()  # of local shards; checks its process itself
        self.reset_process()

    def reset_process(self) -> None:
        """Drop the readers of another process (after a fork or unpickling), never using them."""
        if "fast" in self.__dict__:  # the fast path's reads stay counted (inherited by a fork)
            self.counts = self.totals()
        self.readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._tables: dict[int, MemberTable] = {}
        self._local: dict[int, ShardReader] = {}  # local shards' readers: never evicted
        # their fast path (wids.dataset.localread), after this process's first-touch checks
        self.fast: dict[int, LocalShard] = {}
        self.descriptors.check_process()  # after a fork: the parent's descriptors closed
        self._lock = threading.RLock()
        self._swaps = [threading.Lock() for _ in range(16)]  # range -> cached reader, by shard
        self._promoter: Promoter | None = None
        self._reading = False  # marked a reader of the cache (get_promoter)
        self._warming: int | None = None  # the plan token of the warm-up under way (warm)
        self._lookahead: Lookahead | None = None  # the one of the last batch read ahead for
        self._lookaheads: OrderedDict[int, Lookahead] = OrderedDict()  # by plan token

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in (
            "readers",
            "_tables",
            "_local",
            "fast",
            "_lock",
            "_swaps",
            "_promoter",
            "_reading",
            "_warming",
            "_lookahead",
            "_lookaheads",
        ):
            del state[k]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.reset_process()

    @property
    def promoter(self) -> Promoter | None:
        """This process's promoter (``access="auto"`` with a cache), once a read started it."""
        return self._promoter

    def totals(self) -> dict[str, int]:
        """:attr:`counts` with the reads of local shards' fast path (each counts its own)."""
        c = dict(self.counts)
        for ls in list(self.fast.values()):
            c["accesses"] += ls.reads
            c["samples"] += ls.reads - ls.failed
        return c

    def stats(self) -> DatasetStats:
        """A snapshot of this process's counters."""
        io = self.catalog.store.stats
        c = self.totals()
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
        """Close every reader, stop promotions and the shard cache's background fetches.

        The pool stays usable: readers reopen (and promotion restarts) when needed.
        """
        self._warming = None  # a warm-up still waiting starts nothing
        with self._lock:
            lookaheads, self._lookaheads = list(self._lookaheads.values()), OrderedDict()
            self._lookahead = None
        for lookahead in lookaheads:
            lookahead.close()  # first: its threads use the readers
        with self._lock:
            readers, self.readers = self.readers, OrderedDict()
            self._tables = {}
            local, self._local = self._local, {}
            self.counts = self.totals()
            self.fast = {}
            promoter, self._promoter = self._promoter, None
            for r in [*readers.values(), *local.values()]:
                r.close()
            self.descriptors.close()
        if promoter is not None:
            promoter.close()  # waits for a fetch under way
        self.local.close()
        self.catalog.store.close_idle()  # kept-alive plain HTTP connections (storage/http1.py)

    # -- reads --------------------------------------------------------------------------------

    def read(self, i: int, shard: int, local: int) -> dict[str, Any]:
        """Sample ``local`` of ``shard`` (global index ``i``), untransformed."""
        # The hot path of random access: keep it flat (see tools/bench_read.py).
        fast = self.fast.get(shard)
        if fast is not None:  # a local shard, opened and checked: one pread
            return fast.read(i, local)
        reader = self.readers.get(shard)
        if reader is not None and self._promoter is None:  # the fast path of reader()
            self.counts["accesses"] += 1
            try:
                self.readers.move_to_end(shard)
            except KeyError:  # another thread has just evicted it
                pass
        else:
            reader = self._local.get(shard)
            if reader is None:
                reader = self.reader(shard)
            else:  # a local file's: a path over the descriptor pool, not in the LRU
                self.counts["accesses"] += 1
        table = self._tables[shard]
        start, end = table.span(local)
        if end - start > self.max_sample:
            raise self.catalog.too_large(shard, local, end - start)
        check = None
        start -= HEADER  # with every member's header (MemberTable.sample checks them all)
        if reader.verifies:  # the first one also with the read (a wrong answer is retried)
            check = header_check(((0, *table.first_member(local)),), start)
        start = max(start, 0) if check is None else start
        try:
            if self._promotable:  # before the read: a promotion then overlaps with it
                self.requested(shard, reader, end - start)
            try:
                buf = reader.read_span(start, end, self.catalog.store.stats, check)
            except RangeNotSupportedError:  # the same error again unless reopened whole
                reader = self.without_range({shard: reader}).get(shard, reader)
                buf = reader.read_span(start, end, self.catalog.store.stats, check)
        finally:
            self.evict()  # beyond lru_size, and copies the cache evicted (an fstat each)
        counts = self.counts
        counts["samples"] += 1
        if reader.cached:
            counts["cache_hits"] += 1
        return table.sample(local, i, buf, start)

    def read_batch(
        self, located: Located, merge_gap: int, plan: tuple[Plan, int] | None = None
    ) -> list[dict[str, Any]]:
        """The samples ``(global index, shard, index in shard)``, untransformed, in order.

        Samples of one shard whose spans are adjacent or within ``merge_gap`` bytes are read
        with one request; all requests are issued concurrently. ``plan``: the batch's plan and
        its position in it (:func:`wids.plan.plan_of`), which the lookahead reads ahead from.
        """
        local_raws = self._read_local(located)  # local shards: few preads
        if local_raws is not None:
            return local_raws
        self.catalog.prefetch_members(shard for _, shard, _ in located)
        ahead = self._ahead(merge_gap, plan[0].token) if plan is not None else None
        prefetched = None
        if ahead is not None and plan is not None:
            size = len(located)
            exact = plan[0].batch(plan[1], size) == [i for i, _, _ in located]
            prefetched = ahead.observe(plan[0], plan[1], size, exact)
            ahead.settle(shard for _, shard, _ in located)
        # the next batches are planned once this one's reads are out: before, the first
        # batch's own requests queued behind a round of prefetches in the window
        window = ahead.window if ahead is not None else None
        readers, tables, spans, blocks, where, checks = self.plan_reads(located, merge_gap)
        raws = []
        try:  # readers stay open until every block is read: evict only afterwards
            if self._promotable:  # before the reads: a promotion then overlaps with them
                for blk in blocks:
                    self.requested(blk.shard, readers[blk.shard], blk.end - blk.start)
            stats = self.catalog.store.stats
            try:
                data = fetch_prefetched(
                    blocks, readers, stats, checks=checks, prefetched=prefetched, window=window
                )
            except RangeNotSupportedError:  # read whole, one block at a time (below)
                readers.update(self.without_range(readers))
                data = [None] * len(blocks)
            uses = [0] * len(blocks)
            for b, _ in where:
                uses[b] += 1
            for (i, shard, local), (b, offset), span in zip(located, where, spans, strict=True):
                buf = data[b]
                if buf is None:
                    blk = blocks[b]
                    check = checks[b] if checks else None  # compressed shards' (verifying)
                    buf = data[b] = readers[shard].read_span(blk.start, blk.end, stats, check)
                raws.append(tables[shard].sample(local, i, buf, span[1] - offset))
                uses[b] -= 1
                if not uses[b]:  # free it now: the next read reuses the memory
                    data[b] = None
                self.counts["samples"] += 1
                self.counts["cache_hits"] += readers[shard].cached
        finally:
            self.evict()
            if ahead is not None:
                ahead.schedule_soon()
        return raws

    def _read_local(self, located: Located) -> list[dict[str, Any]] | None:
        """A batch read by the fast path if every shard of it is local, else ``None``.

        A local shard not open yet is opened (and checked) here, as the other reads would;
        ``accesses``, ``misses`` and ``samples`` are counted as by them. Local shards are read
        in place: nothing is read ahead for them.
        """
        fast, counts = self.fast, self.counts
        for _, shard, _ in located:
            if shard not in fast:
                if shard in self._tables or not is_local(self.catalog.load().infos[shard].url):
                    return None
                self.reader(shard, count=False)
                counts["misses"] += 1
                if shard not in fast:
                    return None
        return read_local_batch(fast, located)

    def plan_reads(
        self, located: Located, merge_gap: int, count: bool = True
    ) -> tuple[
        dict[int, ShardReader],
        dict[int, MemberTable],
        list[tuple[int, int, int, int]],
        list[Block],
        list[tuple[int, int]],
        list[Check | None] | None,
    ]:
        """The one plan of a batch's reads: readers, tables, spans, blocks, places, checks.

        Opens (or finds) the readers of the batch's shards, computes each sample's byte span
        (512 bytes earlier where the reader verifies, for the first member's tar header),
        merges them into blocks (:func:`~wids.dataset.readers.plan_batch`) and makes the header
        check of each block. The direct reads and the lookahead's prefetches both use it, so
        prefetched blocks are the very blocks, with the very checks, of the direct read.

        Args:
            located: ``(global index, shard, index in shard)`` of each sample, in batch order.
            merge_gap: As for :func:`~wids.dataset.readers.plan_batch`.
            count: Count the shard look-ups in ``accesses`` (not for prefetches).
        """
        readers = {shard: self.reader(shard, count) for _, shard, _ in located}
        tables = {shard: self._tables[shard] for shard in readers}
        spans = []
        for _, shard, local in located:
            start, end = tables[shard].span(local)
            if end - start > self.max_sample:
                raise self.catalog.too_large(shard, local, end - start)
            start -= HEADER  # with every member's header, as read() (the same checks)
            start = start if readers[shard].verifies else max(start, 0)
            spans.append((shard, start, end, local))
        blocks, where = plan_batch(spans, merge_gap)
        headers: dict[int, list[tuple[int, str, int]]] = {}
        for (_, shard, local), (b, offset) in zip(located, where, strict=True):
            if readers[shard].verifies:
                name, size = tables[shard].first_member(local)
                headers.setdefault(b, []).append((offset, name, size))
        checks = None
        if headers:
            checks = [
                header_check(headers[b], blk.start) if b in headers else None
                for b, blk in enumerate(blocks)
            ]
        return readers, tables, spans, blocks, where, checks

    # -- readers ------------------------------------------------------------------------------

    def reader(self, shard: int, count: bool = True) -> ShardReader:
        """The open reader of a shard (opening and verifying it if needed); counts an access."""
        if count:
            self.counts["accesses"] += 1
        reader = self.readers.get(shard)
        if reader is None and shard in self._local:
            return self._local[shard]
        if reader is not None and self._promoter is not None and not reader.cached:
            reader = self._promoted(shard, reader)
        if reader is not None:
            try:
                self.readers.move_to_end(shard)
            except KeyError:  # another thread has just evicted it
                pass
            return reader
        with self._lock:
            if shard in self._tables:  # opened meanwhile by another thread (the lookahead's)
                return self.readers.get(shard) or self._local[shard]
            self.counts["misses"] += count
            catalog = self.catalog
            loaded = catalog.load()
            info = loaded.infos[shard]
            members = catalog.members(shard)
            check = catalog.needs_check(shard)
            reader = self._open_reader(info, members, check)
            if check:
                try:
                    catalog.check_header(shard, members[0], reader)
                except BaseException:
                    reader.close()
                    raise
            # __shard__ names the shard without credentials: samples reach batches and logs
            url, dataset = strip_credentials(info.url), loaded.dataset_of[shard]
            stats = catalog.store.stats
            if isinstance(reader, LocalReader) and not catalog.oversized(shard):
                fast = LocalShard(reader, members[0], url, dataset, stats)  # its table too
                self._tables[shard] = self.fast[shard] = fast
                self._local[shard] = reader
            elif isinstance(reader, LocalReader):  # a sample over the bound: checked reads
                self._tables[shard] = MemberTable(members[0], url, dataset)
                self._local[shard] = reader
            else:
                self._tables[shard] = MemberTable(members[0], url, dataset)
                self.readers[shard] = reader
        if self._promoter is not None and not isinstance(reader, LocalReader):  # first reads too
            return self._promoted(shard, reader)
        return reader

    def evict(self) -> None:
        """Close the least recently used readers beyond ``lru_size``, and evicted copies.

        Called after a read, never during one: a batch may use more shards than that.
        """
        evicted = self._evicted_copies()
        if len(self.readers) <= self.lru_size and not evicted:
            return
        with self._lock:
            while len(self.readers) > self.lru_size or evicted:
                if evicted:
                    shard = evicted.pop()
                    old = self.readers.pop(shard, None)
                    if old is None:
                        continue
                else:
                    shard, old = self.readers.popitem(last=False)
                self._tables.pop(shard, None)
                src = old.source
                # a reopened reader reads the version its store pinned (Store.pin), if any
                if src is not None and not src.is_local and not src.pins_version:
                    self.catalog.forget_check(shard)  # nothing ties reads to a version
                old.close()

    def _evicted_copies(self) -> list[int]:
        """Shards read from copies the cache evicted (but the last used): closed after a read."""
        readers = list(self.readers.items())[:-1]
        return [s for s, r in readers if isinstance(r, CachedReader) and r.shard.evicted]

    def _open_reader(
        self,
        info: ShardInfo,
        table: tuple[ShardMembers, int],
        check: bool = False,
    ) -> ShardReader:
        """A reader of the shard; with ``check``, its fingerprint is checked first (first touch).

        A range reader's check is its first answer where that says the size and etag: each
        answer is checked against the index's values (``Catalog.check_fingerprint``), so no
        stat precedes it.
        """
        members, data_end = table
        catalog = self.catalog
        source = catalog.source(info.url, info)
        if members.seek is not None:  # .tar.gz, .tar.zst
            return compressed_reader(catalog, info, members, source, check, self.access)
        expected = info.fingerprint  # what a cached copy must be
        local = self.local
        uses_cache = local.cache_dir is not None and self.access != "range"
        if uses_cache and not source.is_local:
            if self.access == "shard" or local.offline:
                if check:
                    catalog.check_fingerprint(info, data_end)
                verify = download_check(members, info.url)
                shard = local.open_whole(
                    source, expected=expected, stats=catalog.store.stats, verify=verify
                )
                return CachedReader(shard)
            # fetched earlier (promoted, or warmed by the process that iterates the sampler):
            # the cache opens only a copy that is the index's version (size, etag or
            # Last-Modified, md5), so the first touch needs no stat of the remote file
            cached = local.shard_cache().open_cached(info.url, expected=expected)
            if cached is not None:
                return CachedReader(cached)
        if not source.is_local and local.ranges.ignores(info.url):  # seen by without_range
            return whole_reader(catalog, source, info, table, check)
        local.check_online(info.url)
        if check:
            catalog.check_fingerprint(info, data_end, None if source.is_local else source)
        if source.is_local:
            return LocalReader(source, self.descriptors)
        return RangeReader(source)

    def without_range(self, readers: dict[int, ShardReader]) -> dict[int, ShardReader]:
        """A server ignored ``Range``: reopen whole the shards it serves (:mod:`.wholeshard`)."""
        infos, out = self.catalog.load().infos, {}
        for shard, old in readers.items():
            if isinstance(old, RangeReader) and probe_range(infos[shard].url, old, self.local):
                with self._lock:
                    self.readers.pop(shard, None), self._tables.pop(shard, None)
                old.close()
                out[shard] = self.reader(shard, count=False)
        return out

    # -- promotion (access="auto") ------------------------------------------------------------

    def get_promoter(self, *, reading: bool = True) -> Promoter:
        """This process's promoter (``access="auto"`` with a cache), started on first use.

        ``reading``: this process reads through it, and is marked a reader of the cache (its
        budget's share per reader counts it); a warm-up alone (:meth:`warm`) does not count.
        """
        with self._lock:
            if self._promoter is None:
                from ..cache import Promoter

                self._promoter = Promoter(self.local.shard_cache(), self.promote_share)
            if reading and not self._reading:
                self.local.reading_cache()  # marks this process a reader
                self._reading = True
            return self._promoter

    def requested(self, shard: int, reader: ShardReader, nbytes: int) -> None:
        """``access="auto"``: count ``nbytes`` read by range from ``shard`` towards promotion."""
        if not self._promotable or reader.cached:
            return
        source = reader.source
        if source is None or source.is_local:
            return
        self.get_promoter().requested(source, nbytes, **self._whole_fetch(shard))

    def planned(self, shard: int, share: float, *, reading: bool = True) -> bool:
        """The plan reads ``share`` of the samples of ``shard`` soon: start its download early.

        ``reading=False``: a warm-up (:meth:`warm`); this process is not counted a reader of
        the cache for it, and its own reads of the shard do not wait for the download.

        Returns:
            Whether the shard is fetched whole (its reads will come from the cache): promoted
            (``auto``: now, or once room frees) or downloading (``shard``).
        """
        local = self.local
        if local.cache_dir is None or local.offline or self.access == "range":
            return False
        info = self.catalog.load().infos[shard]
        source = self.catalog.source(info.url, info)
        if source.is_local or self.catalog.members(shard)[0].seek is not None:
            return False  # compressed shards: decompressed into the cache by the first read
        fetch = self._whole_fetch(shard)
        if self.access == "shard":  # read whole anyway: start the download before the first read
            del fetch["shard_bytes"]
            cache = local.reading_cache() if reading else local.shard_cache()
            cache.prefetch(source, **fetch)
            return True
        promoter = self.get_promoter(reading=reading)
        return promoter.planned(source, share, wait=reading, **fetch)

    def warm(self, plan: Plan) -> None:
        """A sampler's iteration begins here with ``plan``: fetch its first shards into the cache.

        The shards of which the plan's window reads at least half (in the order's order, at
        most :data:`WARM_SHARDS`) are announced as by a read's lookahead, one after the other
        from a daemon thread (loading their member tables may take requests; an interpreter
        exiting meanwhile waits for the download under way, not for the rest), until a process
        marks itself a reader of the cache, the iteration ends or is dropped (:meth:`cool`) or
        the pool closes: under a DataLoader this is the main process, so the downloads fill the
        time the workers take to start, and their reads take over.
        Within the cache's rules (budget, this process's share of it); without a cache, with
        ``access="range"`` or offline, nothing happens.
        """
        local = self.local
        if local.cache_dir is None or local.offline or self.access == "range":
            return
        if self._reading:  # it read here before (a look at ds[0]): now it hands out batches
            with self._lock:  # and counts no more against the budget's share per reader; if
                self._reading = False  # it reads them itself, its first read marks it again
                local.stop_reading()
        self._warming = plan.token
        thread = threading.Thread(target=self._warm, args=(plan,), name="wids-warm", daemon=True)
        thread.start()

    def cool(self, plan: Plan) -> None:
        """The iteration ``plan`` belongs to ended here: its warm-up starts nothing more."""
        if self._warming == plan.token:
            self._warming = None

    def _stop_warming(self, plan: Plan, cache: Any) -> bool:
        """Whether a warm-up ends: its iteration ended, the pool closed, or anyone reads."""
        return self._warming != plan.token or self._reading or bool(cache.marked_readers())

    def _warm(self, plan: Plan) -> None:
        try:
            catalog = self.catalog
            lengths = [int(n) for n in catalog.counts().lengths]
            shares = shard_shares(
                plan, plan.start, len(plan.order), lambda i: catalog.locate(i)[1], lengths, 0.5
            )
            started, cache = 0, self.local.shard_cache()
            deadline = time.monotonic() + WARM_GRACE
            while time.monotonic() < deadline and not self._stop_warming(plan, cache):
                time.sleep(0.02)
            for shard, share in shares.items():  # first read first, one after another: a
                # process that exits waits for one download, not all; once a process reads
                # through the cache (a worker started, or this one), the readers' plans go on
                if started >= WARM_SHARDS or self._stop_warming(plan, cache):
                    break
                if self.planned(shard, share, reading=False):
                    started += 1
                    self._wait_fetches()
        except Exception as error:  # the reads fetch what they need themselves
            log.debug("warm-up of the cache stopped: %s", error)

    def _wait_fetches(self) -> None:
        """Wait for this process's downloads into the cache started so far."""
        if self._promoter is not None:
            self._promoter.wait_all()
        else:
            self.local.shard_cache().wait_fetches()

    def _whole_fetch(self, shard: int) -> dict[str, Any]:
        """What a download of the whole shard is checked against: size, fingerprint, headers."""
        info = self.catalog.load().infos[shard]
        members, data_end = self.catalog.members(shard)
        return {
            "shard_bytes": info.size if info.size is not None else data_end,
            "expected": info.fingerprint,
            "stats": self.catalog.store.stats,
            "verify": download_check(members, info.url),
        }

    def _ahead(self, merge_gap: int, token: int) -> Lookahead:
        """The lookahead of iteration ``token`` in this process, made on its first batch.

        The :data:`LOOKAHEADS` most recently read iterations keep theirs; an older one is closed.
        """
        ahead = self._lookahead
        if ahead is None or ahead.token != token:
            old = []
            with self._lock:
                ahead = self._lookaheads.get(token)
                if ahead is None:
                    ahead = self._lookaheads[token] = self._start_lookahead(token)
                    while len(self._lookaheads) > LOOKAHEADS:
                        old.append(self._lookaheads.popitem(last=False)[1])
                else:
                    self._lookaheads.move_to_end(token)
                self._lookahead = ahead
            for stale in old:
                stale.close()
        ahead.merge_gap = merge_gap
        return ahead

    def _start_lookahead(self, token: int) -> Lookahead:
        catalog = self.catalog
        loaded = catalog.load()
        ahead: Lookahead

        def prepare(indices: list[int]) -> list[tuple[Block, Any, Any]]:
            located = [catalog.locate(i) for i in indices]
            if all(is_local(loaded.infos[shard].url) for _, shard, _ in located):
                return []  # read in place: nothing to read ahead
            readers, _, _, blocks, _, checks = self.plan_reads(located, ahead.merge_gap, False)
            out = []
            for k, b in enumerate(blocks):
                reader = readers[b.shard]
                src = reader.source
                if src is not None and not src.is_local and not reader.cached:
                    out.append((b, src, checks[k] if checks else None))
            return out

        lengths = [int(n) for n in catalog.counts().lengths]
        ahead = Lookahead(
            prepare,
            self.planned,
            lambda i: catalog.locate(i)[1],
            lengths,
            stats=catalog.store.stats,
            urls=[info.url for info in loaded.infos],  # names it among siblings' claims
            token=token,
            **self.lookahead_limits,
        )
        return ahead

    def _promoted(self, shard: int, reader: ShardReader) -> ShardReader:
        """Swap a range reader for the cached copy once its promotion has finished."""
        info, promoter = self.catalog.load().infos[shard], self._promoter
        if promoter is None:  # closed meanwhile by another thread
            return reader
        # one thread per shard: another found the promotion handed out, and read by range
        with self._swaps[shard % len(self._swaps)]:
            current = self.readers.get(shard)
            if current is not None and current.cached:  # swapped by another thread (or cached)
                promoter.reading(info.url, cached=True)  # by another process: not fetched here
                return current
            promoter.reading(info.url)  # announced by a plan: fetched now, and waited for
            cached = promoter.open_if_ready(info.url, expected=info.fingerprint)
            if cached is None:
                return reader
            with self._lock:
                reader.close()
                new = self.readers[shard] = CachedReader(cached)
                return new
