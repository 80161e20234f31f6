"""``.tar.gz`` / ``.tgz`` shards: seek points from indexed_gzip, decoding with zlib.

Indexing (:meth:`GzipCodec.indexing`) decompresses the shard once with ``indexed_gzip`` (the
``compressed`` extra), which records a point every ``spacing`` uncompressed bytes at a deflate
block boundary: the compressed byte and bit where the block starts and the 32 KiB of output
before it (deflate refers back that far). Its exported index (the ``GZIDX`` layout, version 1)
is read into :class:`~wids.compress.points.SeekPoints`, windows zlib-compressed.

Decoding (:meth:`GzipCodec.decode`) needs only zlib: a raw inflater primed with the point's
leading bits (``inflatePrime``, :mod:`.zlibprime`) and its window runs until the range is out,
crossing into the next gzip member where the shard has several (``pigz``, concatenated
files; those later members' CRCs are checked). The member the point is in is not verified by
CRC (a range is part of it); the caller checks the tar header in what comes out.
:meth:`GzipCodec.stream` (whole shards) verifies every member's CRC and length.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from typing import IO, Any

from ..errors import CompressedDataError
from ..extras import missing
from . import zlibprime
from .points import WINDOW, SeekPoints

__all__ = ["CODEC", "DEFAULT_SPACING", "GzipCodec", "points_from_gzidx"]

DEFAULT_SPACING = 1 << 20
"""Uncompressed bytes between gzip seek points: a random read decodes 0.5 MiB more than it
needs on average (about 2-4 ms of inflate, or of transfer at 100-250 MB/s: below one request's
latency), and the windows cost about 32 KiB per MiB of tar before their own compression."""

_GZIDX = struct.Struct("<5sBBQQIII")
_POINT = struct.Struct("<QQBB")


def points_from_gzidx(data: bytes, compressed_size: int) -> SeekPoints:
    """Seek points from an index exported by ``indexed_gzip`` (``GZIDX`` version 1).

    Args:
        data: The exported index.
        compressed_size: The shard's size in bytes.

    Raises:
        CompressedDataError: The export is not of the expected layout.
    """
    try:
        magic, version, _flags, _csize, usize, _spacing, wsize, n = _GZIDX.unpack_from(data)
    except struct.error:
        raise CompressedDataError("indexed_gzip's index is too short") from None
    if magic != b"GZIDX" or version != 1 or wsize < WINDOW:
        raise CompressedDataError(f"indexed_gzip's index: unknown layout {magic!r} v{version}")
    off = _GZIDX.size
    rows = []
    for _ in range(n):
        rows.append(_POINT.unpack_from(data, off))
        off += _POINT.size
    comp: list[int] = []
    uncomp: list[int] = []
    bits: list[int] = []
    windows: list[bytes] = []
    for cmp_off, uncmp_off, nbits, has_window in rows:
        window = b""
        if has_window:
            window = data[off + wsize - WINDOW : off + wsize]
            off += wsize
        if uncmp_off >= usize:  # a point at the very end serves no read
            continue
        if comp and uncmp_off <= uncomp[-1]:  # a point at the same tar byte: keep the later
            comp.pop(), uncomp.pop(), bits.pop(), windows.pop()
        comp.append(cmp_off)
        uncomp.append(uncmp_off)
        bits.append(nbits)
        windows.append(zlib.compress(window, 1) if window else b"")  # level 6: 3x the time, 3% less
    if off != len(data):
        raise CompressedDataError("indexed_gzip's index: its length does not match its points")
    return SeekPoints("gzip", compressed_size, usize, comp, uncomp, bits, windows)


def _start(points: SeekPoints, k: int) -> int:
    """The point decoding starts from for point ``k``.

    Itself; or, without ``inflatePrime`` (no loadable zlib), the nearest byte-aligned point
    before it.
    """
    if points.bits[k] == 0 or zlibprime.available():
        return k
    while k > 0 and points.bits[k] != 0:
        k -= 1
    if points.bits[k] != 0:
        raise CompressedDataError(
            "no byte-aligned gzip seek point to decode from, and zlib's inflatePrime is not "
            "loadable here",
            offset=int(points.compressed[k]),
        )
    return k


def _c_start(points: SeekPoints, k: int) -> int:
    return int(points.compressed[k]) - (1 if points.bits[k] else 0)


def _inflate(points: SeekPoints, k: int, data: bytes, need: int) -> tuple[bytes, bool]:
    """Up to ``need`` bytes of tar from point ``k``; ``data`` is the file from ``_c_start``.

    Returns the output and whether ``data`` ended exactly after a whole gzip member (its
    trailer included; zero padding after it allowed, as ``gzip`` allows).

    Raises:
        CompressedDataError: The data does not decode (offset: the byte where it failed).
    """
    base = _c_start(points, k)
    out, pos, ended, err = zlibprime.inflate_from(data, int(points.bits[k]), points.window(k), need)
    if err is not None:
        raise CompressedDataError(
            f"gzip data does not decode from seek point {k} ({err})", offset=base + pos
        )
    parts, got = [out], len(out)
    if ended:  # a raw stream: its member's trailer (CRC, length) follows
        if len(data) - pos < 8:
            return out, False
        pos += 8
    while ended and got < need and pos < len(data):
        rest = data[pos:]
        if not rest.strip(b"\0"):  # zero padding after the last member
            pos = len(data)
            break
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)  # a whole member: its CRC is checked
        try:
            more = d.decompress(rest, need - got)
        except zlib.error as e:
            raise CompressedDataError(f"corrupt gzip data ({e})", offset=base + pos) from None
        parts.append(more)
        got += len(more)
        ended = d.eof
        pos = len(data) - len(d.unused_data if ended else d.unconsumed_tail)
    return b"".join(parts), ended and (pos == len(data) or not data[pos:].strip(b"\0"))


def _deflate_start(head: bytes) -> int:
    """Where the first member's deflate data starts, after its gzip header (RFC 1952).

    Raises:
        CompressedDataError: Not a gzip header, or one longer than ``head``.
    """
    if len(head) < 10 or head[:3] != b"\x1f\x8b\x08":
        raise CompressedDataError("not a gzip header", offset=0)
    flags, at = head[3], 10
    if flags & 4:  # FEXTRA
        if len(head) < at + 2:
            raise CompressedDataError("truncated gzip header", offset=at)
        at += 2 + int.from_bytes(head[at : at + 2], "little")
    for bit in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            end = head.find(b"\0", at)
            if end < 0:
                raise CompressedDataError("gzip header name or comment too long", offset=at)
            at = end + 1
    if flags & 2:  # FHCRC
        at += 2
    if at >= len(head):
        raise CompressedDataError("truncated gzip header", offset=at)
    return at


def _check_end(points: SeekPoints, tail: bytes, c_start: int) -> None:
    """The file's bytes from the last point on decode to the tar's end, members all whole."""
    k = _start(points, len(points) - 1)
    need = points.uncompressed_size - int(points.uncompressed[k])
    out, whole = _inflate(points, k, tail, need + 1)
    if len(out) < need or not whole:
        where = "inside a deflate stream" if len(out) < need else "inside a member's trailer"
        raise CompressedDataError(
            f"truncated gzip data: the file ends {where}", offset=c_start + len(tail)
        )
    if len(out) != need:
        raise CompressedDataError(
            f"the gzip data decodes to {len(out) - need:+,} bytes against indexed_gzip's count",
            offset=c_start,
        )


class GzipCodec:
    """The gzip :class:`~wids.compress.codec.Codec` (see the module's doc)."""

    kind = "gzip"
    decodes_prefix = True
    """``decode`` takes a prefix of :meth:`compressed_range` too (a reader may read less, by
    an estimate): short of the range's end it raises :class:`CompressedDataError`."""

    def compressed_range(self, points: SeekPoints, start: int, stop: int) -> tuple[int, int]:
        """The bytes to fetch for the tar's ``[start, stop)``: from the point before on."""
        k, j = points.cover(start, stop)
        c_start = _c_start(points, _start(points, k))
        # a block boundary's bits lie in the bytes before its offset: those suffice
        c_stop = int(points.compressed[j]) if j < len(points) else points.compressed_size
        return c_start, max(c_stop, c_start)

    def decode(self, points: SeekPoints, data: bytes, start: int, stop: int) -> bytes:
        """Inflate ``data`` (the file's :meth:`compressed_range`) into the tar's bytes."""
        k = _start(points, points.cover(start, stop)[0])
        skip, need = start - int(points.uncompressed[k]), stop - int(points.uncompressed[k])
        out, _ = _inflate(points, k, bytes(data), need)
        if len(out) < need:
            raise CompressedDataError(
                f"gzip data ends {need - len(out)} bytes short of the tar's byte {stop} "
                f"(decoding from seek point {k}): truncated",
                offset=_c_start(points, k) + len(data),
            )
        return out[skip:need]

    def indexing(self, fileobj: IO[bytes], spacing: int) -> _GzipIndexing:
        """Index ``fileobj`` with indexed_gzip, a point every ``spacing`` tar bytes."""
        return _GzipIndexing(fileobj, spacing)

    def stream(self, fileobj: IO[bytes]) -> IO[bytes]:
        """The whole tar, CRC and length of every member checked (Python's ``gzip``)."""
        return _Errors(gzip.GzipFile(fileobj=fileobj, mode="rb"), fileobj)  # type: ignore[return-value]


class _Errors(io.RawIOBase):
    """A decompressing reader whose failures are :class:`CompressedDataError`."""

    def __init__(self, inner: Any, raw: IO[bytes]) -> None:
        self._inner, self._raw = inner, raw

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            data: bytes = self._inner.read(size)
            return data
        except (OSError, EOFError, ValueError, zlib.error) as e:
            try:
                where: int | None = self._raw.tell()
            except (OSError, ValueError):
                where = None
            if isinstance(e, EOFError):  # gzip's type for a file that ends early
                what = f"truncated gzip data ({e})"
            else:
                what = f"corrupt gzip data ({e})"
            raise CompressedDataError(what, offset=where) from None

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


class _GzipIndexing:
    def __init__(self, fileobj: IO[bytes], spacing: int) -> None:
        try:
            import indexed_gzip
        except ImportError as e:
            raise missing("indexed_gzip", "indexing .tar.gz shards", e) from None
        if spacing < WINDOW:
            raise ValueError(f"gzip seek point spacing {spacing} is below {WINDOW} bytes")
        self._fd = fileobj.fileno()
        self._size = os.fstat(self._fd).st_size
        self._igz = indexed_gzip.IndexedGzipFile(
            fileobj=fileobj, spacing=spacing, readbuf_size=1 << 20, buffer_size=1 << 20
        )
        self.stream: IO[bytes] = _Errors(self._igz, fileobj)  # type: ignore[assignment]

    def points(self) -> SeekPoints:
        buf = io.BytesIO()
        self._igz.export_index(fileobj=buf)
        points = points_from_gzidx(buf.getvalue(), self._size)
        if not points.seekable or int(points.uncompressed[0]) != 0:
            # indexed_gzip made none (files under about 0.5 MB): one at the first deflate byte
            start = _deflate_start(os.pread(self._fd, 65536 + 10, 0))
            ends = points.window_end.tolist()
            starts = [0, *ends[:-1]] if ends else []
            windows = [points.window_blob[a:b] for a, b in zip(starts, ends, strict=True)]
            points = SeekPoints(
                "gzip",
                self._size,
                points.uncompressed_size,
                [start, *points.compressed.tolist()],
                [0, *points.uncompressed.tolist()],
                [0, *points.bits.tolist()],
                [b"", *windows],
            )
        # indexed_gzip ends a truncated file quietly (no trailer, so no CRC to fail): the
        # last stretch must decode to the end of the tar and end with a whole trailer.
        c_start = _c_start(points, _start(points, len(points) - 1))
        tail = os.pread(self._fd, self._size - c_start, c_start)
        _check_end(points, tail, c_start)
        return points

    def close(self) -> None:
        self._igz.close()


CODEC = GzipCodec()
