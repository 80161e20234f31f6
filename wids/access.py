"""How the dataset reads sample bytes from one shard, and how a batch becomes few requests.

A :class:`ShardReader` reads byte spans of one shard. :class:`RangeReader` sends one range
request per span through :mod:`wids.remote` (``os.pread`` for local files);
:class:`CachedReader` reads a shard the local cache (:mod:`wids.cache`) holds. The dataset
keeps at most ``lru_size`` readers open per process and does not care which kind it holds.

:func:`plan_batch` turns the spans of a batch into requests: spans of the same shard that are
adjacent or closer than ``merge_gap`` bytes become one request; :func:`fetch_blocks` issues all
requests of a batch concurrently (``read_ranges``) where the reader has a ``source``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from .remote import IOStats, Source, read_ranges

__all__ = [
    "Block",
    "CachedReader",
    "LocalReader",
    "RangeReader",
    "ShardReader",
    "fetch_blocks",
    "plan_batch",
]


class ShardReader:
    """Reads byte spans of one shard.

    Attributes:
        source: A :class:`~wids.remote.Source` that :func:`~wids.remote.read_ranges` can read
            concurrently with other shards' spans, or ``None`` if only :meth:`read_span` works.
        cached: Whether reads are served from the local shard cache (counted as cache hits).
    """

    source: Source | None = None
    cached: bool = False

    def read_span(self, start: int, end: int, stats: IOStats | None = None) -> bytes:
        """Return exactly the bytes ``[start, end)`` of the shard."""
        raise NotImplementedError

    def close(self) -> None:
        """Release descriptors, locks or connections this reader holds."""


class RangeReader(ShardReader):
    """One range request per span, straight from the shard's storage (or ``os.pread``)."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def read_span(self, start: int, end: int, stats: IOStats | None = None) -> bytes:
        """Return exactly the bytes ``[start, end)`` of the shard, with one request."""
        if self.source is None:  # for mypy: the base class allows None; range readers set it
            raise RuntimeError("range reader without a source")
        return self.source.read_range(start, end, stats)

    def close(self) -> None:
        """Close the local file descriptor, if one was opened."""
        if self.source is not None:
            self.source.close()

    def __repr__(self) -> str:
        return f"RangeReader({self.source!r})"


class LocalReader(RangeReader):
    """A local file read in place with ``os.pread`` on a descriptor of its own.

    The hot path of local random access: one ``pread`` per span and nothing else. Anything
    unusual (the file cannot be opened, a short read) goes through the ``Source``, which
    raises the right error.
    """

    # No per-call pid check: a descriptor inherited through fork stays valid for pread (which
    # has no shared file offset), and the dataset drops its readers in a new process anyway.

    def __init__(self, source: Source) -> None:
        super().__init__(source)
        self._fd: int | None = None
        self._pid = 0

    def _open(self) -> int | None:
        if self.source is None or self.source.local_path is None:
            raise RuntimeError("local reader without a local path")
        try:
            self._fd = os.open(self.source.local_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        self._pid = os.getpid()
        return self._fd

    def read_span(self, start: int, end: int, stats: IOStats | None = None) -> bytes:
        """Return exactly the bytes ``[start, end)`` of the file, with one ``pread``."""
        fd = self._fd
        if fd is None:
            fd = self._open()
        n = end - start
        if fd is None or start < 0 or n < 0:
            return super().read_span(start, end, stats)
        data = os.pread(fd, n, start)
        if len(data) != n:
            return super().read_span(start, end, stats)
        if stats is not None:
            stats.requests += 1
            stats.bytes_read += n
        return data

    def close(self) -> None:
        """Close the descriptor (if this process opened it)."""
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            os.close(fd)
        super().close()

    def __repr__(self) -> str:
        return f"LocalReader({self.source!r})"


class CachedReader(ShardReader):
    """Reads a shard held open by the local shard cache (a ``CachedShard``).

    Args:
        shard: An open ``wids.cache.CachedShard`` (anything with ``read_range(start, end)``
            and ``close()``); closing the reader closes it, which makes the entry evictable.
    """

    cached = True

    def __init__(self, shard: Any) -> None:
        self.shard = shard

    def read_span(self, start: int, end: int, stats: IOStats | None = None) -> bytes:
        """Return exactly the bytes ``[start, end)`` from the cached copy."""
        return self.shard.read_range(start, end)

    def close(self) -> None:
        """Close the cached copy; the cache may evict it from now on."""
        self.shard.close()

    def __repr__(self) -> str:
        return f"CachedReader({self.shard!r})"


class Block(NamedTuple):
    """One request of a batch: bytes ``[start, end)`` of shard number ``shard``."""

    shard: int
    start: int
    end: int


def plan_batch(
    spans: Sequence[tuple[int, int, int, int]], merge_gap: int
) -> tuple[list[Block], list[tuple[int, int]]]:
    """Merge the spans of a batch into requests.

    Args:
        spans: ``(shard, start, end, sample)`` of each sample, in batch order (repeats
            allowed); ``sample`` is the index in the shard.
        merge_gap: Spans of one shard whose gap is at most this many bytes share a request
            (the gap's bytes are read and discarded). Consecutive samples of a shard always
            share one: only tar headers lie between them.

    Returns:
        ``(blocks, where)``: the requests, ordered by shard and offset, and for each input
        span ``(block number, offset of the span inside the block)``.
    """
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    blocks: list[Block] = []
    where: list[tuple[int, int]] = [(0, 0)] * len(spans)
    cur: list[int] | None = None  # [shard, start, end, last sample] of the block being grown
    members: list[int] = []

    def flush() -> None:
        if cur is not None:
            blocks.append(Block(cur[0], cur[1], cur[2]))
            for i in members:
                where[i] = (len(blocks) - 1, spans[i][1] - cur[1])

    for i in order:
        shard, start, end, sample = spans[i]
        if (
            cur is not None
            and shard == cur[0]
            and (sample <= cur[3] + 1 or start <= cur[2] + merge_gap)
        ):
            cur[2] = max(cur[2], end)
            cur[3] = sample
            members.append(i)
            continue
        flush()
        cur, members = [shard, start, end, sample], [i]
    flush()
    return blocks, where


def fetch_blocks(
    blocks: Sequence[Block],
    readers: dict[int, ShardReader],
    stats: IOStats | None = None,
    *,
    defer_local: bool = False,
) -> list[bytes | None]:
    """Read every block; those of remote shards go out concurrently.

    Args:
        blocks: The requests, as :func:`plan_batch` made them.
        readers: The open reader of every shard the blocks name.
        stats: I/O counters.
        defer_local: Leave blocks of local files and cached shards unread (``None``): the
            caller reads each just before slicing it, while its bytes are still in the CPU's
            cache.

    Returns:
        The bytes of each block, in order (``None`` for deferred ones).
    """
    out: list[bytes | None] = [None] * len(blocks)
    remote: list[int] = []
    for i, b in enumerate(blocks):
        reader = readers[b.shard]
        if reader.source is not None and not reader.source.is_local:
            remote.append(i)
        elif not defer_local:
            out[i] = reader.read_span(b.start, b.end, stats)
    if len(remote) == 1:
        b = blocks[remote[0]]
        out[remote[0]] = readers[b.shard].read_span(b.start, b.end, stats)
    elif remote:
        reqs = []
        for i in remote:
            b = blocks[i]
            src = readers[b.shard].source
            if src is None:  # remote blocks come from range readers, which always have one
                raise RuntimeError("internal error: remote block without a source")
            reqs.append((src, b.start, b.end))
        for i, data in zip(remote, read_ranges(reqs, stats), strict=True):
            out[i] = data
    return out
