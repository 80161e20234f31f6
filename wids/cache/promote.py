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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
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
    ) -> Future[None]:
        """Fetch ``source`` into the cache in the background."""
        ...

    def open_cached(
        self,
        url: str,
        *,
        expected: Fingerprint | None = None,
    ) -> CachedShard | None:
        """The cached copy of ``url`` if it is cached now, else ``None``."""
        ...

    def close(self) -> None:
        """Stop background fetches."""
        ...


class Promoter:
    """Moves remote shards that are read by range requests into the cache (``access="auto"``).

    The dataset reports the bytes it requests from each remote shard; once they reach
    ``share`` of the shard's size, the shard is fetched into the cache in a background thread
    (:meth:`ShardCache.prefetch`), and :meth:`open_if_ready` hands out the cached copy (with
    ``wait``, waiting for the fetch rather than requesting more of the shard by range, so
    about ``1 + share`` of the shard is downloaded). A chunked sampler reads most of a shard in
    a row, so the first samples come fast by range requests and the rest from local disk;
    other shards are read meanwhile. A failed fetch is logged and the shard stays on range
    requests. A shard that must be promoted again (its copy was evicted:
    the access is random, or the budget small) needs twice the share each time, so a cache
    too small for the access pattern does not turn into repeated whole-shard downloads. One
    per process (holds threads and futures).

    Args:
        cache: Where promoted shards go.
        share: Fraction (0 to 1) of a shard's bytes requested before it is fetched whole;
            ``0`` fetches on first use.
        wait: Once a shard's fetch has started, :meth:`open_if_ready` waits for it (up to the
            cache's ``lock_timeout``); ``False`` returns ``None`` until it is done, so range
            reads go on meanwhile (faster when requests are cheap, but more bytes).

    Raises:
        ValueError: ``share`` is outside ``[0, 1]``.
    """

    def __init__(self, cache: PromotionCache, share: float = 0.05, *, wait: bool = True) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be between 0 and 1, got {share!r}")
        self.cache = cache
        self.share = float(share)
        self.wait = bool(wait)
        self._requested: dict[str, int] = {}
        self._futures: dict[str, Future[None]] = {}
        self._failed: set[str] = set()
        self._promotions: dict[str, int] = {}
        self._slow: set[str] = set()
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
            if url in self._futures or url in self._failed:
                return
            total = self._requested.get(url, 0) + nbytes
            self._requested[url] = total
            if total < self.share * 2 ** self._promotions.get(url, 0) * shard_bytes:
                return
            if self.cache.max_bytes is not None and shard_bytes > self.cache.max_bytes:
                self._failed.add(url)  # would never fit: stay on range requests
                return
            log.debug("promoting %s into the cache", redact_url(url))
            self._futures[url] = self.cache.prefetch(
                source, expected=expected, stats=stats, verify=verify
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
        if self.wait and not future.done() and url not in self._slow:
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
            if future.cancelled():  # the cache was closed
                return None
            error = future.exception()
            if error is not None:
                self._failed.add(url)
                log.warning("could not promote %s into the cache: %s", redact_url(url), error)
                return None
            self._requested.pop(url, None)
            self._promotions[url] = self._promotions.get(url, 0) + 1
        return self.cache.open_cached(url, expected=expected)

    def close(self) -> None:
        """Stop background fetches."""
        self.cache.close()
