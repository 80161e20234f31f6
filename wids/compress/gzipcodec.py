"""``.tar.gz`` / ``.tgz`` shards: seek points from indexed_gzip, decoding with zlib.

Indexing (:meth:`GzipCodec.indexing`) decompresses the shard once with ``indexed_gzip`` (the
``compressed`` extra), which records a point every ``spacing`` uncompressed bytes at a deflate
block boundary: the compressed byte and bit where the block starts and the 32 KiB of output
before it (deflate refers back that far). Its exported index (the ``GZIDX`` layout, version 1)
is read into :class:`~wids.compress.points.SeekPoints`, windows zlib-compressed.

Decoding (:meth:`GzipCodec.decode`) needs only zlib and numpy: the fetched bytes are shifted
so the point's first bit is bit 0 of a byte (``inflatePrime`` is not in Python's zlib), and a
raw inflater primed with the window (``zdict``) runs until the range is out, crossing into
the next gzip member where the shard has several (``pigz``, concatenated files). Nothing is
verified by CRC there (a range is part of a member); the caller checks the tar header in
what comes out. :meth:`GzipCodec.stream` (whole shards) verifies every member's CRC and length.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from typing import IO, Any

import numpy as np

from ..errors import CompressedDataError
from ..extras import missing
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
        windows.append(zlib.compress(window, 6) if window else b"")
    if off != len(data):
        raise CompressedDataError("indexed_gzip's index: its length does not match its points")
    return SeekPoints("gzip", compressed_size, usize, comp, uncomp, bits, windows)


def _aligned(data: bytes, nbits: int) -> bytes:
    """``data`` from its first byte's top ``nbits`` bits on, shifted to start at a byte."""
    s = 8 - nbits
    a = np.frombuffer(data, np.uint8).astype(np.uint16)
    out = a >> s
    out[:-1] |= (a[1:] << (8 - s)) & 0xFF
    return out.astype(np.uint8).tobytes()


def _next_member(data: bytes, unused: bytes, nbits: int) -> bytes:
    """The bytes after a gzip member's 8-byte trailer, given what the inflater left unused.

    Without a shift (``nbits`` 0) ``unused`` is ``data``'s own tail. With one, ``unused``
    is shifted like the rest: the member ended in the last byte the inflater took, whose bits
    straddle a byte of ``data``; its trailer starts at that byte or the next, and the next
    member's magic after the trailer says which.
    """
    if not nbits:
        return unused[8:]
    end = len(data) - len(unused)
    for start in (end, end + 1):
        after = data[start + 8 :]
        if after[:2] == b"\x1f\x8b":
            return after
    return b""


def _check_end(points: SeekPoints, tail: bytes, c_start: int) -> None:
    """The file's bytes from the last point on decode to the tar's end, members all whole."""
    k = len(points) - 1
    nbits = int(points.bits[k])
    buf = _aligned(tail, nbits) if nbits else tail
    window = points.window(k)
    d = zlib.decompressobj(-15, zdict=window) if window else zlib.decompressobj(-15)
    got, need = 0, points.uncompressed_size - int(points.uncompressed[k])
    try:
        while True:
            got += len(d.decompress(buf, need + 1 - got))
            buf = d.unconsumed_tail
            if got > need:
                break
            if not d.eof:
                if buf:
                    continue
                raise CompressedDataError(
                    "truncated gzip data: the file ends inside a deflate stream",
                    offset=c_start + len(tail),
                )
            unused = d.unused_data
            if len(unused) < 8:
                raise CompressedDataError(
                    "truncated gzip data: the file ends inside a member's trailer",
                    offset=c_start + len(tail),
                )
            rest = _next_member(tail, unused, nbits)
            nbits = 0
            if not rest:
                break
            d, buf = zlib.decompressobj(zlib.MAX_WBITS | 16), rest
    except zlib.error as e:
        raise CompressedDataError(f"corrupt gzip data ({e})", offset=c_start) from None
    if got != need:
        raise CompressedDataError(
            f"the gzip data decodes to {got - need:+,} bytes against indexed_gzip's count",
            offset=c_start,
        )


class GzipCodec:
    """The gzip :class:`~wids.compress.codec.Codec` (see the module's doc)."""

    kind = "gzip"

    def compressed_range(self, points: SeekPoints, start: int, stop: int) -> tuple[int, int]:
        """The bytes to fetch for the tar's ``[start, stop)``: from the point before on."""
        k, j = points.cover(start, stop)
        c_start = int(points.compressed[k]) - (1 if points.bits[k] else 0)
        # a block boundary's bits lie in the bytes before its offset: those suffice
        c_stop = int(points.compressed[j]) if j < len(points) else points.compressed_size
        return c_start, max(c_stop, c_start)

    def decode(self, points: SeekPoints, data: bytes, start: int, stop: int) -> bytes:
        """Inflate ``data`` (the file's :meth:`compressed_range`) into the tar's bytes."""
        k, _ = points.cover(start, stop)
        nbits = int(points.bits[k])
        c_start = int(points.compressed[k]) - (1 if nbits else 0)
        skip, need = start - int(points.uncompressed[k]), stop - int(points.uncompressed[k])
        buf = _aligned(data, nbits) if nbits else bytes(data)
        window = points.window(k)
        d = zlib.decompressobj(-15, zdict=window) if window else zlib.decompressobj(-15)
        parts: list[bytes] = []
        got = 0
        try:
            while got < need:
                out = d.decompress(buf, need - got)
                parts.append(out)
                got += len(out)
                buf = d.unconsumed_tail
                if got >= need:
                    break
                if d.eof:  # the member ended: skip its trailer, go on with the next member
                    rest = _next_member(data, d.unused_data, nbits)
                    nbits = 0  # the next member starts at a byte of data
                    if not rest:
                        break
                    d, buf = zlib.decompressobj(zlib.MAX_WBITS | 16), rest
                elif not buf:
                    break
        except zlib.error as e:
            raise CompressedDataError(
                f"gzip data does not decode from seek point {k} ({e})", offset=c_start
            ) from None
        if got < need:
            raise CompressedDataError(
                f"gzip data ends {need - got} bytes short of the tar's byte {stop} "
                f"(decoding from seek point {k}): truncated",
                offset=c_start + len(data),
            )
        return b"".join(parts)[skip:need]

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
            if isinstance(e, EOFError) or "EOF" in str(e) or "truncated" in str(e).lower():
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
        if not points.seekable:
            raise CompressedDataError("gzip data without a deflate stream", offset=0)
        # indexed_gzip ends a truncated file quietly (no trailer, so no CRC to fail): the
        # last stretch must decode to the end of the tar and end with a whole trailer.
        k = len(points) - 1
        c_start = int(points.compressed[k]) - (1 if points.bits[k] else 0)
        tail = os.pread(self._fd, self._size - c_start, c_start)
        _check_end(points, tail, c_start)
        return points

    def close(self) -> None:
        self._igz.close()


CODEC = GzipCodec()
