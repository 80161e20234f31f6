"""Lookahead prefetch: a process reads early the batches the plan it was handed says come next.

The sampler hands out indices that carry their plan (:mod:`wids.plan`): a window of the
iteration's order and each index's position in it. A batch that reaches the dataset therefore
says where it stands and what follows, in whichever process reads it (the main process, or a
DataLoader worker under any start method; persistent workers; ``in_order=False``; a resumed
``StatefulDataLoader``). Nothing is predicted from a copy of the sampler.

Which of the following batches this process will be given is the DataLoader's choice, made
later (with ``in_order=False``: whichever worker has room). :class:`Lookahead` reads ahead the
batches at the *stride* this process has seen (the distance in positions between the last two
batches it was given in one iteration; before the second one, the batch size times the
workers: the DataLoader's workers take turns). A wrong guess costs no bytes: among the
DataLoader's workers, a batch is read ahead only by the one that *claimed* its position first,
and the worker given it takes the bytes from that sibling (:mod:`.claims`); a position already
read is claimed by its reader, so nobody reads it ahead later. A batch is read from
prefetched bytes only where its blocks are identical (same shard, same byte range) to blocks
prefetched for exactly its position in exactly its iteration; the rest is read directly.

:class:`Lookahead` keeps a bounded window of batches in flight in background threads
(``depth`` batches, ``max_bytes``, ``max_requests``): each is planned exactly as the read of
the batch will be (same readers, same merged blocks, same header checks: the pool's
``plan_reads``) and its remote blocks are read with :func:`~wids.storage.read_ranges`, so
prefetched bytes pass the same checks as direct reads (tar headers, ``Content-Range``, the
pinned etag). A failed prefetch is dropped and the block read directly (which raises the typed
error if the shard changed). Further ahead (the plan's window), shards of which the order
reads at least a share soon are announced to the pool, which starts their whole-shard
downloads early (``access="auto"`` with a cache, ``access="shard"``). :meth:`Lookahead.close`
stops the threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..plan import shard_shares
from ..storage import Window, read_ranges
from .claims import Claims, shared
from .readers import fetch_blocks

if TYPE_CHECKING:
    from ..plan import Plan
    from ..storage import Check, IOStats
    from .readers import Block, ShardReader

__all__ = ["Lookahead", "fetch_prefetched", "loader_workers"]

log = logging.getLogger(__name__)

Prefetched = dict["Block", bytes]


def loader_workers() -> int:
    """The number of DataLoader workers in a worker (torch's ``get_worker_info``), else 1."""
    import sys

    if "torch" not in sys.modules:
        return 1
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return 1 if info is None else max(1, int(info.num_workers))


class Lookahead:
    """A bounded window of the batches a plan says come next, read in background threads.

    Args:
        prepare: ``prepare(indices)`` plans the read of a batch as the pool will (opening the
            readers it needs) and returns its remote requests: ``[(block, source, check)]``.
        announce: ``announce(shard, share)``: the plan reads ``share`` of the shard's samples
            soon; the pool may start a whole-shard download (returns whether it did: then the
            shard's blocks are not prefetched by range).
        locate: ``locate(index) -> shard``.
        lengths: Samples per shard.
        depth: Batches read ahead at most.
        max_bytes: Prefetched bytes held or in flight at most.
        max_requests: Requests in flight at most.
        horizon: Positions ahead that count for ``announce`` (at most the plan's window).
        stats: I/O counters the prefetches count into.
        urls: The dataset's shards: they name it among the claims of sibling processes
            (:mod:`.claims`).
        token: The iteration it reads ahead for (``None``: whichever it is given; a new one
            replaces the last).
    """

    def __init__(
        self,
        prepare: Callable[[list[int]], list[tuple[Block, Any, Any]]],
        announce: Callable[[int, float], bool],
        locate: Callable[[int], int],
        lengths: Sequence[int],
        *,
        depth: int = 4,
        max_bytes: int = 64 << 20,
        max_requests: int = 32,
        horizon: int = 4096,
        stats: Any = None,
        urls: Sequence[str] = (),
        token: int | None = None,
    ) -> None:
        self._prepare, self._announce, self._locate = prepare, announce, locate
        self._lengths = lengths
        self.depth, self.max_bytes, self.max_requests = depth, max_bytes, max_requests
        self.horizon = horizon
        self.merge_gap = 0  # the dataset's, set before each batch
        self.announce_share = 0.5
        self._stats = stats
        self.token = token
        # where this process stands: the plan of its last batch, its position, size, stride
        self.plan: Plan | None = None
        self.position = self.size = self.stride = 0
        self.batches = 0  # batches observed
        self.exact = True  # the last batch was the plan's: batches are read ahead by range
        self.workers = 1  # the DataLoader's workers: this process and its siblings
        # claims on positions and hand-offs between siblings (DataLoader workers), made on
        # the first batch a worker of several is given
        names = "\n".join([*urls, repr(list(lengths))]).encode()
        self.key = hashlib.blake2b(names, digest_size=8).hexdigest()
        self._claims: Claims | None = None
        self._jobs: dict[tuple[int, int], Future[Prefetched]] = {}  # (token, position) -> job
        self._held = 0  # bytes held or in flight
        self._flying = 0  # prefetch requests out (a prefetch starts once its requests fit)
        self._started: set[tuple[int, int]] = set()  # prefetches whose requests went out
        self._waiting: set[tuple[int, int]] = set()  # prefetches waiting for room
        # the prefetches' requests take turns in one window (first come, first served): it
        # stays full while batches are queued, and the nearest batch's requests go first
        self._window = Window(max_requests)
        self._announced: set[int] = set()
        self._whole: set[int] = set()  # announced shards being fetched whole: not by range
        self._announcing: dict[int, Future[None]] = {}  # announcements not answered yet
        # what it did, for tests and benchmarks: batches served with prefetched blocks (its
        # own or a sibling's), and the most bytes and requests held or in flight at once
        self.hits = self.peak_bytes = 0
        self._mutex = threading.Lock()
        self._room = threading.Condition(self._mutex)  # a prefetch's requests fit now
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        # schedule_soon plans in its own thread: the batch that asked goes back meanwhile
        self._planner: ThreadPoolExecutor | None = None
        self._planning: Future[None] | None = None

    def observe(
        self, plan: Plan, position: int, size: int, exact: bool = True
    ) -> Prefetched | None:
        """The batch at ``position`` of ``plan``'s iteration: its prefetched blocks, if any.

        Its own prefetch, else (a DataLoader worker of several) the sibling's that claimed
        the position. Learns the stride (the positions between this process's batches).
        ``exact``: the batch is the plan's ``size`` indices from ``position``; a batch that is
        not (a sampler of the user's between reorders or drops indices) reads nothing ahead
        by range until one is again: batches at the plan's positions would not be the
        DataLoader's (read ahead, they moved 2.4x the bytes of plain reads). Shards are still
        announced: which shards come soon holds however the indices are shuffled locally.
        """
        self._wait_planning()  # one thread moves the position at a time
        self.exact = exact
        last = self.plan
        fresh = last is None or last.token != plan.token
        if fresh:  # a new iteration reads every shard again: announce them again
            with self._mutex:
                self._announced.clear()
                self._whole.clear()
            self.workers = loader_workers()
            if self.workers > 1 and self._claims is None and shared() and not self._closed:
                self._claims = Claims(self.key)
        if not fresh and position > self.position:
            self.stride = position - self.position
        else:  # a new iteration (or its start again): the DataLoader's workers take turns
            self.stride = size * self.workers
        first = self.batches == 0 and self._small(plan.batch(position, size) or [])
        self.plan, self.position, self.size = plan, position, size
        self.batches += 1
        # before this batch's reads: a shard fetched whole is not read by range too; but this
        # process's first batch, a small part of its shards, is read by range, and the shards
        # announced after it (schedule): it came a whole download later (2.5x webdataset's)
        if fresh and not first:
            self._look_far(plan)
        key = (plan.token, position)
        claims = self._claims
        # a sibling may still be given a batch behind this one (the loader dispatches ahead)
        behind = position - self.margin() if claims is not None else position
        with self._mutex:
            job = self._jobs.pop(key, None)
            mine = job is not None  # claimed here
            if mine and key not in self._started:  # not started: read it directly, now
                job = None
            # a sibling given a batch behind this one that is not read yet reads it itself
            stale = [
                k
                for k in self._jobs
                if k[0] != plan.token
                or k[1] < behind
                or (k[1] < position and k not in self._started)
                or self._handed(k)
            ]
            dropped = [self._jobs.pop(k) for k in stale]
            self._started.intersection_update(self._jobs)
            self._room.notify_all()  # the prefetches dropped stop waiting
        for f in dropped:
            self._discard(f)
        if claims is not None:
            claims.release_where(plan.token, behind)
            if not mine:  # a sibling's prefetch, or a tombstone: nobody reads it ahead now
                got = claims.take(plan.token, position)
                self.hits += bool(got)
                return got
        if job is None:
            return None
        try:
            got = job.result()
            if claims is not None:
                claims.taken(plan.token, position)
            self.hits += bool(got)
            return got
        except Exception as exc:  # read directly instead; that raises if it is for real
            log.debug("prefetch failed, reading directly: %s", exc)
            return None
        finally:
            self._release(job)

    def margin(self) -> int:
        """Positions behind this process's a sibling may still be given (and take from it)."""
        return 16 * self.workers * max(1, self.size)

    def _handed(self, key: tuple[int, int]) -> bool:
        """Whether the prefetch at ``key`` was handed to a sibling (under the mutex)."""
        claims = self._claims
        return claims is not None and claims.served(*key)

    def _small(self, batch: list[int]) -> bool:
        """Whether ``batch`` reads at most 1/20 of the samples of each of its shards."""
        counts: dict[int, int] = {}
        for i in batch:
            shard = self._locate(i)
            counts[shard] = counts.get(shard, 0) + 1
        return bool(counts) and all(20 * n <= self._lengths[s] for s, n in counts.items())

    def upcoming(self, depth: int) -> list[tuple[int, list[int]]]:
        """``(position, indices)`` of the next ``depth`` batches at the stride, in the plan."""
        plan, size, stride = self.plan, self.size, self.stride
        if plan is None or size < 1 or stride < 1:
            return []
        out = []
        for k in range(1, depth + 1):
            position = self.position + k * stride
            batch = plan.batch(position, size)
            if batch is None:
                break
            out.append((position, batch))
        return out

    def schedule(self, depth: int | None = None) -> None:
        """Claim and start prefetches of up to ``depth`` batches ahead; announce shards ahead.

        The batches at the stride, but those a sibling claimed (or read) already: after those,
        further ones at the stride, up to ``4 * depth`` tried.

        Args:
            depth: Batches ahead of this one to hold read or in flight (default :attr:`depth`).
        """
        depth = self.depth if depth is None else min(depth, self.depth)
        plan = self.plan
        if self._closed or plan is None:
            return
        if (self.batches - 1) % 8 == 0:  # from the first batch on, often enough
            self._look_far(plan)
        if not self.exact:
            return
        token, claims = plan.token, self._claims
        with self._mutex:
            held = sum(1 for t, p in self._jobs if t == token and p > self.position)
        want = depth - held
        for position, batch in self.upcoming(4 * depth):
            if want <= 0:
                break
            key = (token, position)
            with self._mutex:
                if key in self._jobs:
                    continue
            if claims is not None and not claims.claim(token, position):
                continue  # a sibling's (read ahead or read): not read twice
            with self._mutex:
                executor = self._threads()
                if executor is None:
                    break
                self._jobs[key] = executor.submit(self._fetch, batch, key)
            want -= 1

    def schedule_soon(self, depth: int | None = None) -> None:
        """:meth:`schedule` in a background thread; the next :meth:`observe` waits for it.

        Planning opens the readers of the batches ahead (their member tables, maybe a request
        each): done in the caller's thread, it held back the batch just read.
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
        except Exception as exc:  # the reads meet the problem themselves
            log.debug("lookahead: planning failed: %s", exc)

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

    def _look_far(self, plan: Plan) -> None:
        """Announce shards of which the plan's next ``horizon`` positions read a large share."""
        shares = shard_shares(
            plan, self.position, self.horizon, self._locate, self._lengths, self.announce_share
        )
        for shard, share in shares.items():
            if shard in self._announced:
                continue
            self._announced.add(shard)
            with self._mutex:
                executor = self._threads()
                if executor is None:
                    return
                self._whole.add(shard)  # until the pool says it is not fetched whole
                self._announcing[shard] = executor.submit(self._announce_one, shard, share)

    def settle(self, shards: Iterable[int]) -> None:
        """Wait for the announcements of ``shards`` still being made.

        A batch of a shard the plan announced is read once the pool has heard of it: then
        its reads wait for the shard's download instead of requesting it by range as well.
        """
        with self._mutex:
            pending = [f for f in map(self._announcing.get, set(shards)) if f is not None]
        for f in pending:
            with contextlib.suppress(CancelledError):
                f.result()

    def _announce_one(self, shard: int, share: float) -> None:
        try:
            whole = self._announce(shard, share)
        except Exception:
            whole = False
        finally:
            with self._mutex:
                self._announcing.pop(shard, None)
        if not whole:
            self._whole.discard(shard)

    def _fetch(self, batch: list[int], key: tuple[int, int]) -> Prefetched:
        """Plan and read the remote blocks of a claimed batch, within the window's bounds.

        A sibling given the batch takes them (:meth:`Claims.serve`): offered once read.
        """
        got: Prefetched | None = None
        try:
            got = self._read(batch, key)
            return got
        finally:
            if self._claims is not None:
                self._claims.serve(*key, got)

    def _read(self, batch: list[int], key: tuple[int, int]) -> Prefetched:
        """The batch's remote blocks, once its requests fit beside the prefetches in flight.

        Until then it has not started: the process given the batch reads it itself instead
        (this one, or a sibling: :meth:`Claims.take`), and it is not read here.
        """
        if self._closed:
            return {}
        requests = [r for r in self._prepare(batch) if r[0].shard not in self._whole]
        nbytes = sum(b.end - b.start for b, _, _ in requests)
        n = len(requests)
        with self._room:
            self._waiting.add(key)
            try:  # the nearest batch first
                while self._wanted(key) and (
                    min(self._waiting) != key or self._flying > self.max_requests
                ):
                    self._room.wait()
            finally:
                self._waiting.discard(key)
                self._room.notify_all()
            if not requests or not self._wanted(key):
                return {}
            if self._held and self._held + nbytes > self.max_bytes:
                return {}
            if self._claims is not None and not self._claims.start(*key):
                return {}  # the sibling given it reads it
            self._started.add(key)
            self._flying += n
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
        finally:
            with self._room:
                self._flying -= n
                self._room.notify_all()
        return {b: d for (b, _, _), d in zip(requests, data, strict=True)}

    def _wanted(self, key: tuple[int, int]) -> bool:
        """Whether the prefetch at ``key`` may still start (under the mutex)."""
        return not self._closed and key in self._jobs

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
        """Stop: drop the window and claims, cancel queued prefetches, wait for those running."""
        with self._mutex:
            self._closed = True
            executor, self._executor = self._executor, None
            planner, self._planner = self._planner, None
        if planner is not None:
            planner.shutdown(wait=True, cancel_futures=True)
        self._drop_all()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        claims, self._claims = self._claims, None
        if claims is not None:
            claims.close()


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
