"""Lookahead prefetch: a process predicts the batches it will be asked for, and reads them early.

The samplers know their order ahead of time. A sampler built on a dataset offers itself to it
(``ChunkedSampler._offer_plan``; the dataset keeps it as ``ReaderPool.plan``), so every
DataLoader worker gets a copy of the sampler as it is when the worker starts (forked or
pickled): epoch, seed and resume position. A worker regenerates the sampler's order, cuts it
into batches of the size of the first batch it receives, and takes those the DataLoader sends
it: batch ``k`` goes to worker ``k % num_workers``. In the main process (``num_workers=0``) the
live sampler's position says where the batch came from.

Every batch received is compared with the prediction. Persistent workers keep their copy
of the sampler across epochs: when a worker's batch differs from the prediction (its epoch
ended, or the sampler was set to another epoch), the worker tries the next epochs of the same
sampler (and the same epoch again, for a sampler whose epoch was not set), from the start, and
follows the one whose batch for this worker is the batch received. A batch that fits none (a
sampler of the user's own) turns the lookahead off for good in the worker, silently: reads then
happen as without it. In the main process the live sampler is asked again once it moved on.

:class:`Lookahead` keeps a bounded window of the predicted batches in flight in background
threads (``depth`` batches, ``max_bytes``, ``max_requests``): each is planned exactly as the
read of the batch will be (same readers, same merged blocks, same header checks) and its
remote blocks are read with :func:`~wids.storage.read_ranges`, so prefetched bytes pass the
same checks as direct reads (tar headers, ``Content-Range``, the pinned etag). The read of a
batch then takes the prefetched blocks that are identical (same shard, same byte range) and
reads the rest directly; a failed prefetch is dropped and the block read directly (which
raises the typed error if the shard changed). Batches the window has passed are dropped.
Further ahead (``horizon`` samples), shards of which the plan reads at least a share soon are
announced to the pool, which starts their whole-shard downloads early (``access="auto"`` with
a cache, ``access="shard"``). :meth:`Lookahead.close` stops the threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..storage import Window, is_local, read_ranges
from .batchplan import plan_reads
from .prediction import PlannedBatches
from .promotion import planned
from .readers import fetch_blocks

if TYPE_CHECKING:
    from ..storage import Check, IOStats
    from .catalog import Catalog
    from .readers import Block, ShardReader

__all__ = ["Lookahead", "fetch_prefetched", "start_lookahead"]

log = logging.getLogger(__name__)

Prefetched = dict["Block", bytes]


class Lookahead:
    """A bounded window of predicted batches read ahead in background threads (one process).

    Args:
        plan: The predicted batches.
        prepare: ``prepare(indices)`` plans the read of a batch as the pool will (opening the
            readers it needs) and returns its remote requests: ``[(block, source, check)]``.
        announce: ``announce(shard, share)``: the plan reads ``share`` of the shard's samples
            within the horizon; the pool may start a whole-shard download (returns whether
            it did: then the shard's blocks are not prefetched by range).
        lengths: Samples per shard; ``locate(index) -> shard``.
        depth: Batches read ahead at most.
        max_bytes: Prefetched bytes held or in flight at most.
        max_requests: Requests in flight at most.
        horizon: Samples ahead that count for :func:`announce`.
        stats: I/O counters the prefetches count into.
    """

    def __init__(
        self,
        plan: PlannedBatches,
        prepare: Callable[[list[int]], list[tuple[Block, Any, Any]]],
        announce: Callable[[int, float], bool],
        locate: Callable[[int], int],
        lengths: Sequence[int],
        *,
        depth: int = 4,
        max_bytes: int = 64 << 20,
        max_requests: int = 32,
        horizon: int = 2048,
        stats: Any = None,
    ) -> None:
        self.plan = plan
        self._prepare, self._announce, self._locate = prepare, announce, locate
        self._lengths = lengths
        self.depth, self.max_bytes, self.max_requests = depth, max_bytes, max_requests
        self.horizon = horizon
        self.merge_gap = 0  # the dataset's, set before each batch
        self.announce_share = 0.5
        self._stats = stats
        self._jobs: dict[int, Future[Prefetched]] = {}  # batch number -> its prefetch
        self._held = 0  # bytes held or in flight
        # the prefetches' requests take turns in one window (first come, first served): it
        # stays full while batches are queued, and the nearest batch's requests go first
        self._window = Window(max_requests)
        self._announced: set[int] = set()
        self._whole: set[int] = set()  # announced shards being fetched whole: not by range
        # what it did, for tests and benchmarks: batches served with prefetched blocks, and
        # the most bytes and requests held or in flight at once
        self.hits = self.peak_bytes = 0
        self._mutex = threading.Lock()
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        # schedule_soon plans in its own thread: the batch that asked goes back meanwhile
        self._planner: ThreadPoolExecutor | None = None
        self._planning: Future[None] | None = None

    def observe(self, batch: list[int]) -> Prefetched | None:
        """The batch being read: its prefetched blocks, or ``None`` (mispredicted or none)."""
        self._wait_planning()  # the plan is not walked by two threads at once
        number, generation = self.plan.seen, self.plan.generation
        if not self.plan.observe(batch):
            self._drop_all()
            return None
        if self.plan.generation != generation:  # another epoch: the window predicted the old
            self._drop_all()
            return None
        with self._mutex:
            stale = [k for k in self._jobs if k < number]
            job = self._jobs.pop(number, None)
            dropped = [self._jobs.pop(k) for k in stale]
        for f in dropped:
            self._discard(f)
        if job is None:
            return None
        try:
            got = job.result()
            self.hits += bool(got)
            return got
        except Exception as exc:  # read directly instead; that raises if it is for real
            log.debug("prefetch failed, reading directly: %s", exc)
            return None
        finally:
            self._release(job)

    def schedule(self, depth: int | None = None) -> None:
        """Start prefetches for the next ``depth`` predicted batches; announce shards ahead.

        Args:
            depth: Batches to prefetch this time (default and at most :attr:`depth`).
        """
        depth = self.depth if depth is None else min(depth, self.depth)
        if self._closed or not self.plan.ok:
            return
        first = self.plan.seen
        if (first - 1) % 8 == 0:  # from the first batch on, often enough: the horizon is longer
            self._look_far()
        upcoming = self.plan.upcoming(max(depth, 1))
        for k, batch in enumerate(upcoming[:depth]):
            number = first + k
            with self._mutex:
                executor = self._threads()
                if number in self._jobs or executor is None:
                    continue
                self._jobs[number] = executor.submit(self._fetch, batch)

    def schedule_soon(self, depth: int | None = None) -> None:
        """:meth:`schedule` in a background thread; the next :meth:`observe` waits for it.

        Planning walks the sampler's order (a whole epoch's, the first time in a process) and
        the horizon's shards: done in the caller's thread, it held back the batch just read,
        the first one most.
        """
        with self._mutex:
            if self._closed:
                return
            if self._planner is None:
                self._planner = ThreadPoolExecutor(1, thread_name_prefix="wids-lookahead-plan")
            self._planning = self._planner.submit(self._schedule_quietly, depth)

    def _schedule_quietly(self, depth: int | None = None) -> None:
        try:
            self.schedule(depth)
        except Exception as exc:  # a sampler that cannot be replayed: read without lookahead
            log.debug("lookahead off: planning failed: %s", exc)
            self.plan.ok = False

    def _wait_planning(self) -> None:
        planning, self._planning = self._planning, None
        if planning is not None:
            planning.result()

    def _threads(self) -> ThreadPoolExecutor | None:
        """The background threads (started on first use; ``None`` once closed), under the mutex."""
        if self._closed:
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max(1, self.depth), thread_name_prefix="wids-lookahead"
            )
        return self._executor

    def _look_far(self) -> None:
        """Announce shards of which the horizon's batches read a large share."""
        size = self.plan.size
        if not size:
            return
        counts: dict[int, int] = {}
        for batch in self.plan.upcoming(max(1, self.horizon // size)):
            for i in batch:
                shard = self._locate(i)
                counts[shard] = counts.get(shard, 0) + 1
        for shard, n in counts.items():
            if shard in self._announced or n < self.announce_share * self._lengths[shard]:
                continue
            self._announced.add(shard)
            with self._mutex:
                executor = self._threads()
                if executor is None:
                    return
                self._whole.add(shard)  # until the pool says it is not fetched whole
                executor.submit(self._announce_one, shard, n / self._lengths[shard])

    def _announce_one(self, shard: int, share: float) -> None:
        try:
            whole = self._announce(shard, share)
        except Exception:
            whole = False
        if not whole:
            self._whole.discard(shard)

    def _fetch(self, batch: list[int]) -> Prefetched:
        """Plan and read the remote blocks of a predicted batch, within the window's bounds."""
        if self._closed:
            return {}
        requests = [r for r in self._prepare(batch) if r[0].shard not in self._whole]
        nbytes = sum(b.end - b.start for b, _, _ in requests)
        with self._mutex:
            if not requests or (self._held and (self._held + nbytes > self.max_bytes)):
                return {}
            self._held += nbytes
            self.peak_bytes = max(self.peak_bytes, self._held)
        try:
            data = read_ranges(
                [(src, b.start, b.end) for b, src, _ in requests],
                self._stats,
                checks=[check for _, _, check in requests],
                window=self._window,
            )
        except BaseException:
            with self._mutex:
                self._held -= nbytes
            raise
        return {b: d for (b, _, _), d in zip(requests, data, strict=True)}

    @property
    def window(self) -> Window:
        """The requests in flight: the prefetches' turns, and the direct reads beside them."""
        return self._window

    @property
    def peak_requests(self) -> int:
        """The most prefetch requests in flight at once."""
        return self._window.peak

    def _release(self, job: Future[Prefetched]) -> None:
        if job.cancelled() or not job.done() or job.exception() is not None:
            return
        nbytes = sum(len(d) for d in job.result().values())
        with self._mutex:
            self._held -= nbytes

    def _discard(self, job: Future[Prefetched]) -> None:
        """Drop a prefetch: cancelled if queued, its bytes released once it ends if running."""
        if not job.cancel():
            job.add_done_callback(self._release)

    def _drop_all(self) -> None:
        with self._mutex:
            jobs, self._jobs = list(self._jobs.values()), {}
        for f in jobs:
            self._discard(f)

    def close(self) -> None:
        """Stop: drop the window, cancel queued prefetches, wait for those running."""
        with self._mutex:
            self._closed = True
            executor, self._executor = self._executor, None
            planner, self._planner = self._planner, None
        if planner is not None:
            planner.shutdown(wait=True, cancel_futures=True)
        self._drop_all()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def fetch_prefetched(
    blocks: Sequence[Block],
    readers: dict[int, ShardReader],
    stats: IOStats | None,
    *,
    checks: Sequence[Check | None] | None,
    prefetched: Prefetched | None,
    window: Window | None = None,
) -> list[bytes | None]:
    """:func:`~wids.dataset.readers.fetch_blocks`, taking identical blocks from ``prefetched``.

    The rest are read directly and count in the lookahead's ``window``.
    """
    if not prefetched:
        return fetch_blocks(blocks, readers, stats, defer_local=True, checks=checks, window=window)
    out: list[bytes | None] = [prefetched.get(b) for b in blocks]
    rest = [i for i, data in enumerate(out) if data is None]
    if rest:
        got = fetch_blocks(
            [blocks[i] for i in rest],
            readers,
            stats,
            defer_local=True,
            checks=[checks[i] for i in rest] if checks else None,
            window=window,
        )
        for i, data in zip(rest, got, strict=True):
            out[i] = data
    return out


def start_lookahead(
    pool: Any, located: Sequence[tuple[int, int, int]], plan: PlannedBatches | None = None
) -> Lookahead:
    """The lookahead of a ``ReaderPool`` in this process (off for local shards).

    ``pool`` is the dataset's :class:`~wids.dataset.pool.ReaderPool` (not imported: it
    imports this module); ``plan``: a prediction already begun (:mod:`.warmstart`).
    """
    catalog: Catalog = pool.catalog
    loaded = catalog.load()
    plan = plan if plan is not None else PlannedBatches(pool.plan)
    if not located or is_local(loaded.infos[located[0][1]].url):
        plan.ok = False
    ahead: Lookahead

    def prepare(indices: list[int]) -> list[tuple[Block, Any, Any]]:
        located = [catalog.locate(i) for i in indices]
        readers, _, _, blocks, _, checks = plan_reads(pool, located, ahead.merge_gap, False)
        out = []
        for k, b in enumerate(blocks):
            reader = readers[b.shard]
            src = reader.source
            if src is not None and not src.is_local and not reader.cached:
                out.append((b, src, checks[k] if checks else None))
        return out

    def announce(shard: int, share: float) -> bool:
        return planned(pool, shard, share)

    def locate(i: int) -> int:
        return catalog.locate(i)[1]

    lengths = [int(n) for n in loaded.lengths]
    limits = getattr(pool, "lookahead_limits", None) or {}  # depth, max_bytes, ... (tests)
    ahead = Lookahead(plan, prepare, announce, locate, lengths, stats=catalog.store.stats, **limits)
    return ahead
