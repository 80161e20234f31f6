"""Header hopping: walking a remote tar of large members with one small ranged read per header."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import starmap

from .header import BLOCK
from .member import TarMember, _member_of
from .walk import _walk

__all__ = ["HOP_BLOCK", "header_stride", "iter_members_hopping"]

HOP_BLOCK = 8192
"""Bytes read from each header on: the small members that follow a large one (a sample's
``.json`` and ``.cls`` after its ``.mp4``) come with it, in the same request."""


def iter_members_hopping(
    fetch: Callable[[int, int], bytes],
    file_size: int,
    *,
    shard: str | None = None,
    head: bytes = b"",
    block: int = HOP_BLOCK,
) -> Iterator[TarMember]:
    """Iterate the members of a tar by hopping from header to header with ranged reads.

    One ``fetch`` per header that is not in bytes already read, of ``block`` bytes from that
    header on (headers within ``block`` of each other come in one request); member data
    beyond that is never read. For archives of large members this reads a small fraction
    of the file; for small members a stream (:func:`iter_members_stream`) is cheaper.

    Args:
        fetch: ``fetch(start, end)`` returns exactly the archive's bytes ``[start, end)``.
        file_size: The archive's size; reads are clamped to it.
        shard: Name used in error messages.
        head: The archive's first bytes, if already read (served without a fetch).
        block: Bytes read from each header on.

    Yields:
        Every entry except pax and GNU extension records, in archive order.

    Raises:
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """
    read = _Hops(fetch, file_size, head, block)
    for rows in _walk(read, BLOCK, shard, file_size):
        yield from starmap(_member_of, rows)


class _Beyond(Exception):  # noqa: N818 - control flow inside header_stride, never escapes
    def __init__(self, offset: int) -> None:
        self.offset = offset


def header_stride(head: bytes, file_size: int, *, shard: str | None = None) -> float | None:
    """Archive bytes per member among the first members whose headers are in ``head``.

    Args:
        head: The archive's first bytes.
        file_size: The archive's size.
        shard: Name used in error messages.

    Returns:
        The offset of the first header past ``head`` divided by the members before it
        (large when members are large, which makes hopping from header to header pay), or
        ``None`` when ``head`` holds every header of the archive.

    Raises:
        TarFormatError: What the headers in ``head`` show is not a valid tar.
    """

    def beyond(start: int, end: int) -> bytes:
        raise _Beyond(start)

    n = 0
    try:
        for _ in iter_members_hopping(beyond, file_size, shard=shard, head=head):
            n += 1
    except _Beyond as e:
        return e.offset / max(1, n)
    return None


class _Hops:
    """``read(n, off)`` over ranged reads: ``head`` first, then ``block`` bytes per call."""

    def __init__(
        self, fetch: Callable[[int, int], bytes], size: int, head: bytes, block: int
    ) -> None:
        self.fetch = fetch
        self.size = size
        self.head = head
        self.block = block

    def __call__(self, n: int, off: int) -> bytes:
        if off >= self.size:
            return b""
        if off + min(n, self.size - off) <= len(self.head):
            return self.head[off:]
        return self.fetch(off, min(self.size, off + max(n, self.block)))
