"""How the dataset reads sample bytes from one shard, and how a batch becomes few requests.

A :class:`ShardReader` reads byte spans of one shard. :class:`RangeReader` sends one range
request per span through :mod:`wids.storage.source` (``os.pread`` for local files);
:class:`CachedReader` reads a shard the local cache (:mod:`wids.cache.shards`) holds. The dataset
keeps at most ``lru_size`` readers open per process and does not care which kind it holds.

:func:`plan_batch` turns the spans of a batch into requests: spans of the same shard that are
adjacent or closer than ``merge_gap`` bytes become one request; :func:`fetch_blocks` issues all
requests of a batch concurrently (``read_ranges``) where the reader has a ``source``.

Remote reads are verified end to end: a reader with ``verifies`` set is asked for 512 more
bytes before each sample, the tar header of the sample's first member, and
:func:`header_check` makes sure it names that member with its recorded size (every sample of
a merged block is checked: their headers are inside the block anyway). Bytes from anywhere
else fail the check (:class:`~wids.errors.CorruptReadError` after retries). Local files and
cached copies are not checked per read; :func:`download_check` checks a downloaded copy's
member headers before the cache publishes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import CorruptReadError
from ..storage import Check, DescriptorPool, IOStats, Source, Window, read_ranges, redact_url
from ..tar import header_mismatch

if TYPE_CHECKING:
    from ..index import ShardMembers

__all__ = [
    "Block",
    "CachedReader",
    "LocalReader",
    "RangeReader",
    "ShardReader",
    "download_check",
    "fetch_blocks",
    "header_check",
    "plan_batch",
]

HEADER = 512
"""Bytes of a tar header: a verified read starts this much before a sample's first member."""

DOWNLOAD_CHECKS = 256
"""At most this many member headers (first, last and evenly spread) are checked per download."""


class ShardReader:
    """Reads byte spans of one shard.

    Attributes:
        source: A :class:`~wids.storage.source.Source` that
            :func:`~wids.storage.batch.read_ranges` can read concurrently with other shards'
            spans, or ``None`` if only :meth:`read_span` works.
        cached: Whether reads are served from the local shard cache (counted as cache hits).
        verifies: Whether callers should verify each read (:func:`header_check`): the bytes
            come over a network, where a server, proxy or cache layer may send wrong ones.
    """

    source: Source | None = None
    cached: bool = False
    verifies: bool = False

    def read_span(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """Return exactly the bytes ``[start, end)`` of the shard.

        ``check`` (see :meth:`wids.storage.source.Source.read_range`) is applied by readers that
        ``verify``; others may ignore it.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release descriptors, locks or connections this reader holds."""


class RangeReader(ShardReader):
    """One range request per span, straight from the shard's storage (or ``os.pread``)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.verifies = not source.is_local

    def read_span(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """Return exactly the bytes ``[start, end)`` of the shard, with one request."""
        if self.source is None:  # for mypy: the base class allows None; range readers set it
            raise RuntimeError("range reader without a source")
        return self.source.read_range(start, end, stats, check)

    def close(self) -> None:
        """Close the local file descriptor, if one was opened."""
        if self.source is not None:
            self.source.close()

    def __repr__(self) -> str:
        return f"RangeReader({self.source!r})"


class LocalReader(RangeReader):
    """A local file read in place: a descriptor from the dataset's :class:`DescriptorPool`.

    The hot path of local random access: one ``pread`` per span on a descriptor the pool keeps
    open (bounded by the process's file limit, not by ``lru_size``), so a reader is only a
    path and the pool's reference, and reopening a shard costs at most one ``open``. Anything
    unusual (the file cannot be opened, a short read) goes through the ``Source``, which
    raises the right error.

    Args:
        source: The local file.
        descriptors: The pool to take its descriptor from (one per dataset and process).
    """

    def __init__(self, source: Source, descriptors: DescriptorPool) -> None:
        super().__init__(source)
        if source.local_path is None:
            raise ValueError(f"not a local file: {source!r}")
        self.path = source.local_path
        self.descriptors = descriptors

    def read_span(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """Return exactly the bytes ``[start, end)`` of the file, with one ``pread``."""
        n = end - start
        if start >= 0 and n >= 0:
            try:
                data = self.descriptors.pread(self.path, n, start)
            except OSError:
                data = b""
            if len(data) == n:
                if stats is not None:
                    stats.requests += 1
                    stats.bytes_read += n
                return data
        return super().read_span(start, end, stats)

    def __repr__(self) -> str:
        return f"LocalReader({self.source!r})"


class CachedReader(ShardReader):
    """Reads a shard held open by the local shard cache (a ``CachedShard``).

    Args:
        shard: An open ``wids.cache.handle.CachedShard`` (anything with ``read_range(start, end)``
            and ``close()``); closing the reader closes it, which makes the entry evictable.
    """

    cached = True

    def __init__(self, shard: Any) -> None:
        self.shard = shard

    def read_span(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """Return exactly the bytes ``[start, end)`` from the cached copy."""
        data: bytes = self.shard.read_range(start, end)
        return data

    def close(self) -> None:
        """Close the cached copy; the cache may evict it from now on."""
        self.shard.close()

    def __repr__(self) -> str:
        return f"CachedReader({self.shard!r})"


def header_check(headers: Sequence[tuple[int, str, int]], base: int) -> Check:
    """A check that a read holds the right tar headers (for ``read_range(check=...)``).

    Args:
        headers: ``(offset of the header in the read, member name, member size)`` of each
            member to check: a sample's first member, whose header is the 512 bytes before
            its data.
        base: Offset of the read in the shard (for messages).
    """
    todo = sorted(set(headers))

    def check(data: bytes) -> str | None:
        for off, name, size in todo:
            if off < 0:
                return f"the index puts member {name!r} at byte {base + off + HEADER}, too early"
            problem = header_mismatch(data[off : off + HEADER], name, size)
            if problem is not None:
                return f"at byte {base + off}, where member {name!r} begins, {problem}"
        return None

    return check


def download_check(
    members: ShardMembers, url: str, limit: int = DOWNLOAD_CHECKS
) -> Callable[[str], None]:
    """A check of a downloaded copy of a shard, for the cache to run before publishing it.

    Reads the headers of the first and the last member and of others evenly spread between
    them (``limit`` in all) and compares each with the member table.

    Args:
        members: The shard's member table.
        url: The shard's URL (for messages).
        limit: Most headers checked.

    Returns:
        ``verify(path)``, which raises :class:`~wids.errors.CorruptReadError` naming the
        shard and the first wrong header.
    """

    def verify(path: str) -> None:
        n = members.nmembers
        if n == 0:
            return
        k = min(limit, n)
        rows = sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(k)})
        samples = _sample_of_rows(members, rows)
        with open(path, "rb") as f:
            fd = f.fileno()
            for row, j in zip(rows, samples, strict=True):
                off = int(members.member_offset[row]) - HEADER
                name = members.key(j) + members.fields[int(members.member_field[row])]
                size = int(members.member_size[row])
                h = os.pread(fd, HEADER, off) if off >= 0 else b""
                problem = header_mismatch(h, name, size)
                if problem is not None:
                    raise CorruptReadError(
                        f"the downloaded copy is not what the index records: at byte {off}, "
                        f"where member {name!r} begins, {problem}; not cached",
                        shard=redact_url(url),
                    )

    return verify


def _sample_of_rows(members: ShardMembers, rows: Sequence[int]) -> list[int]:
    import numpy as np

    found = np.searchsorted(members.sample_start, np.asarray(rows, dtype=np.int64), "right")
    return (found - 1).tolist()  # type: ignore[no-any-return]


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
    checks: Sequence[Check | None] | None = None,
    window: Window | None = None,
) -> list[bytes | None]:
    """Read every block; those of remote shards go out concurrently.

    Args:
        blocks: The requests, as :func:`plan_batch` made them.
        readers: The open reader of every shard the blocks name.
        stats: I/O counters.
        defer_local: Leave blocks of local files and cached shards unread (``None``): the
            caller reads each just before slicing it, while its bytes are still in the CPU's
            cache.
        checks: A check per block (or ``None``) for the reads of readers that verify
            (:func:`header_check`).
        window: A lookahead's window of requests in flight: the remote blocks count in it
            (direct reads: they go before its queued prefetches).

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
    if len(remote) == 1 and window is None:
        b = blocks[remote[0]]
        check = checks[remote[0]] if checks else None
        out[remote[0]] = readers[b.shard].read_span(b.start, b.end, stats, check)
    elif remote:
        reqs = []
        for i in remote:
            b = blocks[i]
            src = readers[b.shard].source
            if src is None:  # remote blocks come from range readers, which always have one
                raise RuntimeError("internal error: remote block without a source")
            reqs.append((src, b.start, b.end))
        remote_checks = [checks[i] for i in remote] if checks else None
        got = read_ranges(reqs, stats, checks=remote_checks, window=window, direct=True)
        for i, data in zip(remote, got, strict=True):
            out[i] = data
    return out
