"""Many byte ranges at once: grouped by filesystem, concurrent where it is asynchronous.

A :class:`Window` bounds the requests in flight across many :func:`read_ranges` calls of a
process (a lookahead's prefetches, each from its own thread): first come, first served, so the
requests of an earlier call go out before a later call's, and the window stays full as long
as calls are queued, instead of a burst per call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any

from .answer import Check, check_range
from .retry import retry_async
from .source import Source
from .stats import IOStats

__all__ = ["Window", "read_ranges"]


def _nbytes(data: bytes) -> int:
    return len(data)


class Window:
    """At most ``size`` requests in flight at once, over any number of :func:`read_ranges` calls.

    Requests wait their turn in the order they were issued (FIFO), but a caller's *direct*
    reads (``read_ranges(..., direct=True)``: the batch it waits for now) go before every
    queued one: a lookahead's prefetches fill the places its batch's own reads leave, so the
    window is full from the first batch on and never holds more than ``size``. Used from the
    event loop the reads run on (fsspec's, one per process); ``peak`` is the most in flight
    at once.

    Args:
        size: Requests in flight at most.
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, not {size!r}")
        self.size = size
        self.in_flight = self.peak = 0
        self._first: deque[asyncio.Future[None]] = deque()  # direct reads waiting
        self._queue: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> None:
        await self._enter(self._queue)

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def direct(self) -> _Direct:
        """An ``async with`` place ahead of every queued request (a direct read)."""
        return _Direct(self)

    async def _enter(self, queue: deque[asyncio.Future[None]]) -> None:
        if (
            self.in_flight < self.size
            and not self._first
            and (queue is self._first or not self._queue)
        ):
            self._take()
            return
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await turn  # _release counted this request when it gave it the place
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given a place, then cancelled
                self._release()
            raise

    def _take(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _release(self) -> None:
        self.in_flight -= 1
        while self.in_flight < self.size:
            queue = self._first or self._queue
            if not queue:
                return
            turn = queue.popleft()
            if not turn.done():  # (a waiter cancelled meanwhile is skipped)
                self._take()
                turn.set_result(None)


class _Direct:
    """A place in a :class:`Window` ahead of its queued requests (see :meth:`Window.direct`)."""

    __slots__ = ("window",)

    def __init__(self, window: Window) -> None:
        self.window = window

    async def __aenter__(self) -> None:
        await self.window._enter(self.window._first)

    async def __aexit__(self, *exc: object) -> None:
        self.window._release()


def read_ranges(
    requests: Sequence[tuple[Source, int, int]],
    stats: IOStats | None = None,
    max_concurrency: int = 32,
    checks: Sequence[Check | None] | None = None,
    window: Window | None = None,
    direct: bool = False,
) -> list[bytes]:
    """Read many byte ranges, concurrently where the filesystem is asynchronous.

    Ranges are grouped by filesystem; each remote range is one request with its own retries (so
    only failed ones are repeated), at most ``max_concurrency`` in flight; local ranges are read
    with ``os.pread``. ``checks`` (one per request, or ``None``) are passed to each remote
    read as :meth:`Source.read_range` describes. Without ``stats``, each range counts into its
    source's store. With a ``window``, the remote requests take their turns in it (shared with
    other calls) instead of ``max_concurrency``; ``direct`` ones go before its queued requests
    (:meth:`Window.direct`).

    Returns:
        One ``bytes`` per request, in order, each exactly ``end - start`` long.

    Raises:
        The first error (in request order) of a range that failed for good; see
        :mod:`wids.storage.source`.
    """
    if max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1")
    if checks is not None and len(checks) != len(requests):
        raise ValueError("checks must have one entry per request")
    out: list[bytes | None] = [None] * len(requests)
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, (src, start, end) in enumerate(requests):
        check_range(start, end)
        if src.is_local or start == end:
            out[i] = src.read_range(start, end, stats)
            continue
        transport = src.transport()  # made (or checked) once per source and call
        fs = transport.fs if transport.asynchronous else None
        groups.setdefault(id(fs), (fs, []))[1].append(i)
    for fs, idxs in groups.values():
        if fs is not None:
            jobs = [(*requests[i], checks[i] if checks else None) for i in idxs]
            gate = window.direct() if window is not None and direct else window
            import fsspec.asyn  # here, not at import: local reads never need it

            results = fsspec.asyn.sync(fs.loop, _gather, jobs, stats, max_concurrency, gate)
            for i, data in zip(idxs, results, strict=True):
                out[i] = data
        else:
            for i in idxs:
                src, start, end = requests[i]
                out[i] = src.read_range(start, end, stats, checks[i] if checks else None)
    return out  # type: ignore[return-value]  # every slot was filled


async def _gather(
    jobs: list[tuple[Source, int, int, Check | None]],
    stats: IOStats | None,
    max_concurrency: int,
    window: Window | _Direct | None,
) -> list[bytes]:
    # a gate only when there are more jobs than may be in flight: it costs per request
    gate: Any = window
    if gate is None and len(jobs) > max_concurrency:
        gate = asyncio.Semaphore(max_concurrency)

    async def one(src: Source, start: int, end: int, check: Check | None) -> bytes:
        attempts = src.attempts(f"could not read bytes {start}-{end}", stats)

        def op() -> Any:
            return src.read_async(start, end, check)

        if gate is None:
            return await retry_async(attempts, op, _nbytes, None)
        async with gate:
            return await retry_async(attempts, op, _nbytes, None)

    # the transport's client, once per batch and before any attempt's clock starts
    await jobs[0][0].transport().prepare()

    results = await asyncio.gather(*(one(*job) for job in jobs), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
