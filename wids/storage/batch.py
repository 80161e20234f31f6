"""Many byte ranges at once: grouped by filesystem, concurrent where it is asynchronous."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import fsspec.asyn

from .retry import retry_async
from .source import Check, Source, check_range
from .stats import IOStats

__all__ = ["read_ranges"]


def _nbytes(data: bytes) -> int:
    return len(data)


def read_ranges(
    requests: Sequence[tuple[Source, int, int]],
    stats: IOStats | None = None,
    max_concurrency: int = 32,
    checks: Sequence[Check | None] | None = None,
) -> list[bytes]:
    """Read many byte ranges, concurrently where the filesystem is asynchronous.

    Ranges are grouped by filesystem; each remote range is one request with its own retries (so
    only failed ones are repeated), at most ``max_concurrency`` in flight; local ranges are read
    with ``os.pread``. ``checks`` (one per request, or ``None``) are passed to each remote
    read as :meth:`Source.read_range` describes. Without ``stats``, each range counts into its
    source's store.

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
        fs, _ = src._filesystem()
        groups.setdefault(id(fs), (fs, []))[1].append(i)
    for fs, idxs in groups.values():
        if fs.async_impl:
            jobs = [(*requests[i], checks[i] if checks else None) for i in idxs]
            results = fsspec.asyn.sync(fs.loop, _gather, jobs, stats, max_concurrency)
            for i, data in zip(idxs, results, strict=True):
                out[i] = data
        else:
            for i in idxs:
                src, start, end = requests[i]
                out[i] = src.read_range(start, end, stats, checks[i] if checks else None)
    return out  # type: ignore[return-value]  # every slot was filled


async def _gather(
    jobs: list[tuple[Source, int, int, Check | None]], stats: IOStats | None, max_concurrency: int
) -> list[bytes]:
    gate = asyncio.Semaphore(max_concurrency)

    async def one(src: Source, start: int, end: int, check: Check | None) -> bytes:
        fs, path = src._filesystem()
        attempts = src.attempts(f"could not read bytes {start}-{end}", stats)
        async with gate:
            op = src._aread_op(fs, path, start, end, check)
            return await retry_async(attempts, op, _nbytes, fs)

    results = await asyncio.gather(*(one(*job) for job in jobs), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
