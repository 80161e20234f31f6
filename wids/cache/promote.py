"""Background fetches into the cache, and promotion for ``access="auto"``.

:class:`BackgroundFetches` is the cache's small thread pool (``ShardCache.prefetch``): one fetch
per URL at a time. :class:`Promoter` counts the bytes a dataset requests by range from each
remote shard and, past a share of the shard's size, has the local shard cache
(:mod:`wids.cache.shards`, through the :class:`PromotionCache` protocol) fetch the whole shard
in the background; later reads then come from the cached copy.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..storage import redact_url

if TYPE_CHECKING:
    from ..index import Fingerprint
    from ..storage import IOStats, Source
    from .handle import CachedShard

__all__ = ["BackgroundFetches", "PromotionCache", "Promoter"]

log = logging.getLogger(__name__)


class BackgroundFetches:
    """Runs fetch jobs in two background threads, one job per URL at a time.

    Args:
        thread_name_prefix: Names the threads (started on first use).
    """

    def __init__(self, thread_name_prefix: str) -> None:
        self._prefix = thread_name_prefix
        self._executor: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future[None]] = {}
        self._mutex = threading.Lock()

    def submit(self, url: str, job: Callable[[], None]) -> Future[None]:
        """Run ``job`` for ``url``, or return the future of the one already running for it."""
        with self._mutex:
            self._pending = {u: f for u, f in self._pending.items() if not f.done()}
            pending = self._pending.get(url)
            if pending is not None:
                return pending
            if self._executor is None:
                self._executor = ThreadPoolExecutor(2, thread_name_prefix=self._prefix)
            future = self._executor.submit(job)
            self._pending[url] = future
            return future

    def wait(self) -> None:
        """Wait for the jobs submitted so far (done, failed or cancelled)."""
        with self._mutex:
            pending = list(self._pending.values())
        wait_futures(pending)

    def close(self) -> None:
        """Stop: cancel queued jobs, wait for those running."""
        with self._mutex:
            executor, self._executor = self._executor, None
            self._pending.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


class PromotionCache(Protocol):
    """What a :class:`Promoter` needs of the cache (``wids.cache.ShardCache`` has it)."""

    max_bytes: int | None
    lock_timeout: float

    def prefetch(
        self,
        source: Source,
        *,
        expected: Fingerprint | None = None,
        stats: IOStats | None = None,
        verify: Callable[[str], None] | None = None,
        ahead: bool = True,
    ) -> Future[None]:
        """Fetch ``source`` into the cache in the background (``ahead``: of its reads)."""
        ...

    def open_cached(
        self,
        url: str,
        *,
        expected: Fingerprint | None = None,
    ) -> CachedShard | None:
        """The cached copy of ``url`` if it is cached now, else ``None``."""
        ...

    def open(
        self,
        source: Source,
        *,
        expected: Fingerprint | None = None,
        stats: IOStats | None = None,
        verify: Callable[[str], None] | None = None,
    ) -> CachedShard:
        """The cached copy of ``source``, fetched first if needed (waits for other fetchers)."""
        ...

    def close(self) -> None:
        """Stop background fetches."""
        ...

    def roomy(self, shard_bytes: int) -> bool:
        """Whether the budget holds two shards of this size per reader active now."""
        ...

    def may_fetch_ahead(self, url: str, size: int) -> bool:
        """Whether ``url`` may be fetched ahead of its reads now (counted ahead if so)."""
        ...


@dataclass(frozen=True)
class _Fetch:
    """What a promotion fetches: the arguments of :meth:`PromotionCache.prefetch`."""

    source: Source
    shard_bytes: int
    expected: Fingerprint | None
    stats: IOStats | None
    verify: Callable[[str], None] | None


class Promoter:
    """Moves remote shards that are read by range requests into the cache (``access="auto"``).

    A whole-shard download pays only when most of the shard is read while the copy is cached,
    so a shard is promoted on evidence that it will be:

    - :meth:`planned`: the sampler's plan (:mod:`wids.dataset.lookahead`) says that at least
      ``plan_share`` of the shard's samples come soon; the download starts at once, before
      the first of them is read, so it overlaps with reading the shard before;
    - :meth:`requested`: without a plan, the bytes requested by range from the shard reach
      ``share`` of its size *and* the shard drew at least ``focus`` of this process's last
      ``window`` range requests. A chunked order reads one shard at a time
      (nearly all of the traffic); a random order over many shards spreads it, and is never
      promoted (it would download whole shards for a few samples each).

    The reads that start a promotion go on by range, so the first samples come as fast as
    with ``access="range"``: a shard promoted on evidence is promoted by the batch whose reads
    gave the evidence, and one promoted on a plan is announced after the batch that starts the
    plan. Later reads of a promoted shard wait for the download (up to the cache's
    ``lock_timeout``; a slower one is read by range meanwhile) instead of requesting the
    shard twice; with ``wait=True`` every read of a shard being fetched waits. A failed fetch
    is logged and the shard stays on range requests. A shard that must be promoted again by
    :meth:`requested` (its copy was evicted) needs twice the share each time, so a cache too
    small for the access pattern does not turn into repeated whole-shard downloads. One per
    process (holds threads and futures).

    Args:
        cache: Where promoted shards go.
        share: Fraction (0 to 1) of a shard's bytes requested by range before it is fetched
            whole; ``0`` fetches on first use (regardless of ``focus``).
        wait: Reads of a shard being fetched wait for the fetch instead of going on by range.
        focus: Least share of the recent range traffic a shard must draw to be promoted
            without a plan.
        window: Range requests that make up the recent traffic.
        plan_share: Share of a shard's samples a plan must announce to promote it at once.

    Raises:
        ValueError: ``share``, ``focus`` or ``plan_share`` is outside ``[0, 1]``.
    """

    def __init__(
        self,
        cache: PromotionCache,
        share: float = 0.05,
        *,
        wait: bool = False,
        focus: float = 0.25,
        window: int = 64,
        plan_share: float = 0.5,
    ) -> None:
        for name, value in (("share", share), ("focus", focus), ("plan_share", plan_share)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
        self.cache = cache
        self.share = float(share)
        self.wait = bool(wait)
        self.focus = float(focus)
        self.plan_share = float(plan_share)
        self._requested: dict[str, int] = {}
        self._recent: deque[str] = deque()
        self._recent_count: dict[str, int] = {}
        self._window = max(1, int(window))
        self._futures: dict[str, Future[None]] = {}
        self._failed: set[str] = set()
        self._promotions: dict[str, int] = {}
        self._slow: set[str] = set()
        self._planned: set[str] = set()  # promoted on a plan: most of it comes next, so wait
        # announced by a plan when this process's share of the budget had no room: fetched
        # whole when room frees (in the plan's order) or when its reads begin, never by range
        self._deferred: dict[str, _Fetch] = {}
        self._jobs: dict[str, _Fetch] = {}  # what each promotion of _futures fetches
        self._mutex = threading.Lock()

    def requested(
        self,
        source: Source,
        nbytes: int,
        *,
        shard_bytes: int,
        expected: Fingerprint | None = None,
        stats: IOStats | None = None,
        verify: Callable[[str], None] | None = None,
    ) -> None:
        """Count ``nbytes`` requested by range from ``source``; start the fetch at the share.

        Args:
            source: The remote shard.
            nbytes: Bytes just requested.
            shard_bytes: The shard's size, or an estimate (the end of its last member).
            expected: What the index says the shard is (``ShardInfo.fingerprint``), verified
                after the fetch.
            stats: I/O counters for the fetch.
            verify: Checks the downloaded copy before the cache publishes it (raises if
                it is wrong); see :meth:`ShardCache.open`.
        """
        url = source.url
        with self._mutex:
            focused = self._count_recent(url)
            if url in self._futures or url in self._failed:
                return
            if url in self._deferred:  # a plan announced it: its reads begin, fetch it now
                self._start_deferred(url, ahead=False)
                return
            total = self._requested.get(url, 0) + nbytes
            self._requested[url] = total
            if total < self.share * 2 ** self._promotions.get(url, 0) * shard_bytes:
                return
            if self.share > 0 and not focused:  # spread over many shards: range reads win
                return
            # the evidence says most of the shard comes next: like a plan's, later reads of it
            # wait for the download rather than request it again by range
            if self._start(source, shard_bytes, expected, stats, verify):
                self._planned.add(url)

    def planned(
        self,
        source: Source,
        share: float,
        *,
        wait: bool = True,
        shard_bytes: int,
        expected: Fingerprint | None = None,
        stats: IOStats | None = None,
        verify: Callable[[str], None] | None = None,
    ) -> bool:
        """A plan says ``share`` of the shard's samples come soon: promote it now if enough.

        ``wait``: this process's reads of the shard wait for the download (they come next);
        without, they go on by range until it is done (a warm-up: others read it first).
        Other arguments as for :meth:`requested`.

        Returns:
            Whether the shard is being promoted (now or already).
        """
        url = source.url
        with self._mutex:
            if url in self._futures:
                if wait and share >= self.plan_share:
                    self._planned.add(url)
                return True
            if url in self._deferred:
                return True
            if url in self._failed or share < self.plan_share:
                return False
            if wait:
                self._planned.add(url)
            if self._start(source, shard_bytes, expected, stats, verify):
                return True
            if url in self._deferred:  # fetched whole later: not by range meanwhile
                return True
            self._planned.discard(url)
            return False

    def reading(self, url: str, *, cached: bool = False) -> None:
        """The reads of ``url`` begin: a shard a plan announced (deferred) is fetched now.

        Its reads then wait for the download (:meth:`open_if_ready`) rather than request the
        shard by range as well: the budget holds two shards per reader (checked when it was
        announced and again now), so its copy stays while it is read. ``cached``: they read
        a copy another process fetched, so it is not fetched here (nor later).
        """
        with self._mutex:
            if url not in self._deferred:
                return
            if cached:
                del self._deferred[url]
                self._planned.discard(url)
            else:
                self._start_deferred(url, ahead=False)

    def _start_deferred(self, url: str, *, ahead: bool) -> bool:
        """Start a deferred shard's fetch (under the mutex); ``ahead``: only if its share allows."""
        job = self._deferred[url]
        if not ahead:
            if not self.cache.roomy(job.shard_bytes):
                del self._deferred[url]  # readers came meanwhile: it goes by range after all
                self._planned.discard(url)
                return False
            del self._deferred[url]
            self._planned.add(url)
            self._launch(job, ahead=False)
            return True
        return self._start(job.source, job.shard_bytes, job.expected, job.stats, job.verify)

    def _start_next(self) -> None:
        """Room freed (a shard fetched ahead was opened): fetch the next deferred ones, in order."""
        with self._mutex:
            for url in list(self._deferred):
                if not self._start_deferred(url, ahead=True):
                    break

    def fetching(self, url: str) -> bool:
        """Whether a promotion of ``url`` was started and not yet handed out."""
        with self._mutex:
            return url in self._futures

    def _count_recent(self, url: str) -> bool:
        """Add a request to the recent traffic; whether ``url`` drew ``focus`` of it.

        Counted in requests over a full window (a window not yet full counts its empty
        places as other shards), so the first requests of a process are no evidence.
        """
        self._recent.append(url)
        self._recent_count[url] = self._recent_count.get(url, 0) + 1
        while len(self._recent) > self._window:
            old = self._recent.popleft()
            left = self._recent_count[old] - 1
            if left:
                self._recent_count[old] = left
            else:
                del self._recent_count[old]
        return self._recent_count[url] >= self.focus * self._window

    def _start(
        self,
        source: Source,
        shard_bytes: int,
        expected: Fingerprint | None,
        stats: IOStats | None,
        verify: Callable[[str], None] | None,
    ) -> bool:
        """Start the fetch (under the mutex); ``False`` if the shard would never fit."""
        url = source.url
        if self.cache.max_bytes is not None and shard_bytes > self.cache.max_bytes:
            self._failed.add(url)  # would never fit: stay on range requests
            return False
        if not self.cache.roomy(shard_bytes):
            # fewer than two shards per reader active at once: promoted copies would be
            # evicted before they are read, and fetched again; range reads move fewer bytes
            return False
        job = _Fetch(source, shard_bytes, expected, stats, verify)
        if not self.cache.may_fetch_ahead(url, shard_bytes):
            # this process's share of the budget is taken by shards fetched ahead and not
            # read yet: fetched when room frees or its reads begin (reading), not now
            self._deferred[url] = job
            return False
        self._deferred.pop(url, None)
        self._launch(job, ahead=True)
        return True

    def _launch(self, job: _Fetch, *, ahead: bool) -> None:
        """Hand the fetch to the cache's background threads (under the mutex)."""
        url = job.source.url
        log.debug("promoting %s into the cache", redact_url(url))
        self._jobs[url] = job
        self._futures[url] = self.cache.prefetch(
            job.source, expected=job.expected, stats=job.stats, verify=job.verify, ahead=ahead
        )

    def open_if_ready(
        self,
        url: str,
        *,
        expected: Fingerprint | None = None,
    ) -> CachedShard | None:
        """The cached copy of a shard being promoted, once its fetch has finished.

        ``expected`` as for :meth:`requested`.

        Returns:
            The open cached shard; ``None`` if the shard is not being promoted, its fetch is
            still running (and ``wait`` is off) or failed.
        """
        with self._mutex:
            future = self._futures.get(url)
        if future is None:
            return None
        if (self.wait or url in self._planned) and not future.done() and url not in self._slow:
            wait_futures([future], timeout=self.cache.lock_timeout)
            if not future.done():  # a very slow fetch: read by range meanwhile, do not wait again
                log.warning(
                    "promoting %s takes long; reading it by range meanwhile", redact_url(url)
                )
                self._slow.add(url)
        with self._mutex:
            if not future.done() or self._futures.get(url) is not future:
                return None
            del self._futures[url]
            job = self._jobs.pop(url)
            planned = url in self._planned
            self._planned.discard(url)
            if future.cancelled():  # the cache was closed
                return None
            error = future.exception()
            if error is not None:
                self._failed.add(url)
                log.warning("could not promote %s into the cache: %s", redact_url(url), error)
                return None
            self._requested.pop(url, None)
            self._promotions[url] = self._promotions.get(url, 0) + 1
        cached = self.cache.open_cached(url, expected=expected)
        if cached is None and planned and self.cache.roomy(job.shard_bytes):
            # not there now: another process is still writing it, or it was evicted or not
            # fetched ahead after all; most of it is read next, so wait for it or fetch it
            cached = self._open_now(job)
        if self._deferred:  # opening it freed its room in this process's share
            self._start_next()
        return cached

    def _open_now(self, job: _Fetch) -> CachedShard | None:
        """A planned shard opened from the cache, fetched now if needed; ``None`` on failure."""
        url = job.source.url
        try:
            return self.cache.open(
                job.source, expected=job.expected, stats=job.stats, verify=job.verify
            )
        except Exception as error:  # read by range instead; a real problem shows there
            with self._mutex:
                self._failed.add(url)
            log.warning("could not promote %s into the cache: %s", redact_url(url), error)
            return None

    def wait_all(self, timeout: float | None = None) -> bool:
        """Wait until every promotion started so far has finished (done, failed or cancelled).

        :meth:`close` cancels downloads still queued: wait first to have them all.

        Returns:
            Whether they all finished within ``timeout`` seconds (``None``: no limit).
        """
        with self._mutex:
            futures = list(self._futures.values())
        return not wait_futures(futures, timeout=timeout).not_done

    def close(self) -> None:
        """Stop background fetches: downloads under way finish, those queued are cancelled."""
        self.cache.close()
