"""Walking a tar archive: the three entry points and the header walker they share."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from itertools import starmap
from typing import BinaryIO

from ..errors import ShardNotFoundError, TarFormatError, TruncatedTarError
from .header import (
    _EXT_TYPES,
    _ZERO,
    BLOCK,
    _bad_checksum,
    _check,
    _compressed,
    _Ext,
    _extension,
    _member,
    _number,
    _truncated,
    _unsigned_sum,
    _verify_batch,
)
from .member import Row, TarMember, _member_of

__all__ = ["iter_members_fetch", "iter_members_stream", "scan_local", "scan_local_rows"]

STREAM_CHUNK = 1 << 20
# scan_local reads this much per pread: small members' headers then arrive with the one before.
LOCAL_WINDOW = 3072
# Types after which tarfile does not skip data blocks (all other types have data).
_NO_DATA = frozenset("123456")

_adler32 = zlib.adler32
_BATCH = 4096


def iter_members_fetch(
    fetch: Callable[[int, int], bytes],
    *,
    shard: str | None = None,
    file_size: int | None = None,
) -> Iterator[TarMember]:
    """Iterate the members of a tar through random-access reads.

    Reads each 512-byte header with one call, and the data of pax and GNU long-name records;
    seeks past member data.

    Args:
        fetch: ``fetch(start, end)`` returns the archive's bytes ``[start, end)``; fewer bytes
            (or none) at the end of the file.
        shard: Name used in error messages.
        file_size: The archive's size, if known. Reads are then clamped to it and truncation is
            reported before asking ``fetch`` for bytes past the end.

    Yields:
        Every entry except pax and GNU extension records, in archive order.

    Raises:
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """

    def read(n: int, off: int) -> bytes:
        end = off + n
        if file_size is not None:
            if off >= file_size:
                return b""
            end = min(end, file_size)
        return fetch(off, end)

    for rows in _walk(read, BLOCK, shard, file_size):
        yield from starmap(_member_of, rows)


def iter_members_stream(stream: BinaryIO, *, shard: str | None = None) -> Iterator[TarMember]:
    """Iterate the members of a tar in one sequential pass over a stream.

    The stream is read in chunks of about 1 MiB, member data is discarded, and nothing is
    seeked; after the end-of-archive block the rest of the stream is read and discarded, so the
    bytes read equal the stream's length. Members come in batches of a few thousand (their
    header checksums are verified together).

    Args:
        stream: A binary file-like object with ``read(n)``; need not be seekable.
        shard: Name used in error messages.

    Yields:
        Every entry except pax and GNU extension records, in archive order.

    Raises:
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """
    reader = _StreamReader(stream)
    for rows in _walk(reader, BLOCK, shard, None, defer=True):
        yield from starmap(_member_of, rows)
    reader.drain()


def scan_local(path: str | os.PathLike[str], *, shard: str | None = None) -> list[TarMember]:
    """List the members of a local tar file, reading only around its headers.

    Args:
        path: A local file path.
        shard: Name used in error messages (default: ``path``).

    Returns:
        Every entry except pax and GNU extension records, in archive order.

    Raises:
        ShardNotFoundError: ``path`` does not exist.
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """
    return list(starmap(_member_of, scan_local_rows(path, shard=shard)))


def scan_local_rows(path: str | os.PathLike[str], *, shard: str | None = None) -> list[Row]:
    """Like :func:`scan_local`, as plain tuples, for bulk consumers such as the index builder.

    Building a frozen dataclass per member costs about as much as parsing its header; callers
    that turn members into arrays anyway can take tuples.

    Args:
        path: A local file path.
        shard: Name used in error messages (default: ``path``).

    Returns:
        ``(name, offset, size, type, header_offset)`` per member, the fields of
        :class:`TarMember` in order (``TarMember(*row)`` builds one).

    Raises:
        ShardNotFoundError: ``path`` does not exist.
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY)
    except FileNotFoundError:
        raise ShardNotFoundError(f"no such file: {name}", shard=shard or name) from None
    try:
        size = os.fstat(fd).st_size
        out: list[Row] = []
        for rows in _walk(partial(os.pread, fd), LOCAL_WINDOW, shard or name, size, defer=True):
            out += rows
        return out
    finally:
        os.close(fd)


class _StreamReader:
    """``read(n, off)`` over a forward-only stream: bytes from ``off``, at least ``n`` unless EOF.

    Offsets must not decrease. Returned bytes may run past ``off + n`` (to the end of the
    current chunk), which lets the walker parse many headers from one buffer.
    """

    def __init__(self, stream: BinaryIO, chunk: int = STREAM_CHUNK) -> None:
        self.stream = stream
        self.chunk = chunk
        self.buf = b""
        self.base = 0  # archive offset of buf[0]
        self.eof = False
        self.pos = 0  # bytes read from the stream so far

    @property
    def known_size(self) -> int | None:
        """The stream's length, once its end has been reached."""
        return self.pos if self.eof else None

    def _next_chunk(self) -> bytes:
        if self.eof:
            return b""
        data = self.stream.read(self.chunk)
        if not data:
            self.eof = True
            return b""
        self.pos += len(data)
        return data

    def __call__(self, n: int, off: int) -> bytes:
        buf, base = self.buf, self.base
        if off >= base + len(buf):
            base += len(buf)
            buf = b""
            while base < off:  # discard member data, chunk by chunk
                data = self._next_chunk()
                if not data:
                    break
                if base + len(data) > off:
                    buf = data[off - base :]
                    base = off
                else:
                    base += len(data)
        elif off > base:
            buf = buf[off - base :]
            base = off
        while len(buf) < n:
            data = self._next_chunk()
            if not data:
                break
            buf += data
        self.buf, self.base = buf, base
        return buf if base == off else b""

    def drain(self) -> None:
        """Read the stream to its end (the padding after the end-of-archive block)."""
        self.buf = b""
        while self._next_chunk():
            pass


def _walk(
    read: Callable[[int, int], bytes],
    window: int,
    shard: str | None,
    file_size: int | None,
    defer: bool = False,
) -> Iterator[list[Row]]:
    """Yield lists of ``(name, offset, size, type, header_offset)``, every entry of an archive.

    ``read(n, off)`` returns bytes starting at ``off``: at least ``n`` unless the file ends first
    (more is fine). ``window`` (>= 512) is what to ask for per header. The common case, a regular
    file with an ASCII header and no extension records, runs inline; the rest in helpers.

    Rows are handed out (a new list each time) before each ``read``. With ``defer``, header
    checksums are verified in batches of :data:`_BATCH` with numpy instead of one by one (a
    third of the per-header cost); rows are held back until their headers are verified, and an
    error raised meanwhile is replaced by the checksum error of an earlier or the same header,
    as if each had been checked first. Extension headers, whose sizes decide what is read, are
    checked at once.
    """
    off = base = blen = 0
    buf = b""
    ext = _Ext()  # pending pax x / GNU L state, and pax g globals
    rows: list[Row] = []
    emit = rows.append
    hdrs: list[bytes] = []  # defer: the headers of ``rows``, not verified yet
    flush_at = _BATCH if defer else 1
    plain = True  # no extension record pending, no pax globals: the hot path applies
    try:
        while True:
            p = off - base
            if p + BLOCK > blen:
                if len(rows) >= flush_at:
                    if hdrs:
                        _verify_batch(hdrs, rows, off, shard)
                    yield rows
                    rows = []
                    emit = rows.append
                buf = read(window, off)
                base, p, blen = off, 0, len(buf)
                if blen < BLOCK:
                    _short_header(buf, off, shard, _size_at_end(read, off, blen, file_size), ext)
            h = buf[p : p + BLOCK]
            if defer:
                if not h[0] and h == _ZERO:
                    if ext.pending():
                        _bad_checksum(h, 256, off, shard, ext)  # raises
                    break
                hdrs.append(h)
            else:
                # Every byte < 128 makes the sum < 65521, so adler32 gives it exactly.
                u = (
                    (_adler32(h[156:], _adler32(h[:148])) & 0xFFFF) + 255
                    if h.isascii()
                    else _unsigned_sum(h)
                )
                if b"%06o\0 " % u != h[148:156] and _bad_checksum(h, u, off, shard, ext):
                    break  # the end-of-archive block
            t = h[156]
            if (t == 48 or t == 0) and plain:  # "0" or "\0": regular file, the hot path
                try:  # 11 octal digits and a NUL, as tarfile and GNU tar write it
                    size = int(h[124:135], 8) if h[135] == 0 else _number(h, off, shard)
                except ValueError:  # a NUL or space inside, or base-256
                    size = _number(h, off, shard)
                if size < 0:
                    _member(h, off, off, shard, ext)  # raises, naming the member
                name = h[:100].partition(b"\0")[0]
                if t == 0 and name.endswith(b"/"):  # v7 directory
                    row = _member(h, off, off, shard, ext)
                    off = row[1]
                    emit(row)
                    continue
                if h[345]:
                    name = h[345:500].partition(b"\0")[0] + b"/" + name
                data = off + BLOCK
                emit((name.decode("utf-8", "surrogateescape"), data, size, "0", off))
                off = data + ((size + 511) & ~511)
            elif t in _EXT_TYPES:
                if defer:
                    hdrs.pop()
                    _check(h, off, shard, ext)
                off = _extension(t, h, off, read, buf, base, shard, file_size, ext)
                plain = False
            else:
                row = _member(h, off, ext.hoff if ext.hoff >= 0 else off, shard, ext)
                data = off + BLOCK
                size = row[2]
                off = data + ((size + 511) & ~511) if row[3] not in _NO_DATA else data
                emit(row)
                plain = not ext.active
        if hdrs:
            _verify_batch(hdrs, rows, off, shard)
    except TarFormatError:
        if hdrs:  # a bad checksum before (or at) the failure explains it better
            _verify_batch(hdrs, rows, off, shard)
        raise
    if rows:
        yield rows


def _size_at_end(
    read: Callable[[int, int], bytes], off: int, got: int, file_size: int | None
) -> int | None:
    """The file's size, for error messages, once a read came back short."""
    if file_size is not None:
        return file_size
    known = getattr(read, "known_size", None)  # a stream knows, once it has ended
    if known is not None or got or off == 0:
        return known if known is not None else off + got
    try:  # random access: does the file end exactly at ``off``, or before?
        return off if len(read(1, off - 1)) == 1 else None
    except Exception:  # noqa: BLE001 - a probe for a better message, nothing more
        return None


def _short_header(
    buf: bytes, off: int, shard: str | None, file_size: int | None, ext: _Ext
) -> None:
    """Raise for a read that ended before a whole header block."""
    if off == 0:
        if not buf:
            raise TarFormatError("empty file (0 bytes); not a tar archive", shard=shard, offset=0)
        _compressed(buf, shard)
        raise TruncatedTarError(
            f"truncated or not a tar archive: {len(buf)} bytes, less than one header",
            shard=shard,
            offset=0,
        )
    if buf:
        where = "inside a header block"
    elif file_size is None or off > file_size:
        where = "inside member data"
    elif ext.pending():
        where = "after an extension record, before its member's header"
    else:
        where = "without an end-of-archive block"
    _truncated(off + len(buf), shard, file_size, where)
