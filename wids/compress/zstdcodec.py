"""``.tar.zst`` shards: seek points from the seekable format's table, decoding with zstandard.

A seekable ``.tar.zst`` (:mod:`wids.compress.zstdwrite`, zstd's ``contrib/seekable_format``)
ends with a table of its frames; each frame that holds content is a seek point, needing no
window. Indexing (:meth:`ZstdCodec.indexing`) reads that table from the file's tail, then
decompresses the shard once, frame by frame, and checks that the frames it meets are the
table's: a table that disagrees with the data is refused before it is recorded.

Without a table the frames met while decompressing are the points (``pzstd`` output, a
seekable file whose table was cut off), at least ``spacing`` tar bytes apart (closer frames
are merged into one entry, so tiny frames cannot make the index larger than the spacing
allows); when that leaves one point, or the file is one frame (``tar --zstd -cf``, ``zstd``),
there are none and the shard is decompressed whole into the cache.

Decoding (:meth:`ZstdCodec.decode`) fetches the frames covering a range and checks each one
against the points before decoding it (:func:`~wids.compress.zstdframes.decode_frames`: its
length from its block headers, its declared content size, output bounded by the points).
:meth:`ZstdCodec.stream` decompresses a whole shard; truncated or corrupt data is
:class:`~wids.errors.CompressedDataError` with the compressed offset of the frame.

Needs ``zstandard`` (the ``compressed`` extra).
"""

from __future__ import annotations

import io
import os
import threading
from typing import IO, Any

from ..errors import CompressedDataError
from ..extras import missing
from .points import SeekPoints
from .zstdframes import (
    FOOTER_SIZE,
    decode_frames,
    parse_footer,
    parse_seek_table,
)

__all__ = ["CODEC", "ZstdCodec", "ZstdStream"]

# Compressed bytes fed to the decoder at once. One call's output is bounded by what this much
# input can claim (hostile RLE blocks: 4 bytes for 128 KiB, so at most 256 MiB here).
_FEED = 1 << 13


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError as e:
        raise missing("zstandard", "reading .tar.zst shards", e) from None
    return zstandard


def _bounds(points: SeekPoints, k: int, j: int) -> tuple[list[int], list[int]]:
    """Points ``k`` to ``j`` (inclusive) as a frame table, the ends appended when ``j`` is past."""
    compressed = points.compressed[k : j + 1].tolist()
    content = points.uncompressed[k : j + 1].tolist()
    if j == len(points):
        compressed.append(points.compressed_size)
        content.append(points.uncompressed_size)
    return compressed, content


class ZstdCodec:
    """The zstd :class:`~wids.compress.codec.Codec` (see the module's doc).

    It keeps one ``zstandard`` decompression context per thread: making one cost 43 us here,
    decoding a 33 KB sample's frame 58 us, and a context is not thread-safe.
    """

    kind = "zstd"

    def __init__(self) -> None:
        self._local = threading.local()

    def _dctx(self) -> Any:
        dctx = getattr(self._local, "dctx", None)
        if dctx is None:
            dctx = self._local.dctx = _zstandard().ZstdDecompressor()
        return dctx

    def compressed_range(self, points: SeekPoints, start: int, stop: int) -> tuple[int, int]:
        """The frames covering the tar's ``[start, stop)``: one contiguous compressed range."""
        k, j = points.cover(start, stop)
        c_stop = int(points.compressed[j]) if j < len(points) else points.compressed_size
        return int(points.compressed[k]), c_stop

    def decode(self, points: SeekPoints, data: bytes, start: int, stop: int) -> bytes:
        """Decode the frames in ``data`` (the file's :meth:`compressed_range`), checked.

        Frames are decoded whole only (no ``decodes_prefix``): a frame's checksum is at its
        end, and incompressible data (JPEG, video) is stored in raw blocks that nothing but
        that checksum checks.
        """
        k, j = points.cover(start, stop)
        compressed, content = _bounds(points, k, j)
        base = content[0]
        out = decode_frames(compressed, content, data, 0, j - k, dctx=self._dctx())
        return out[start - base : stop - base]

    def indexing(self, fileobj: IO[bytes], spacing: int) -> ZstdIndexing:
        """Read ``fileobj``'s seek table, if any, and start decoding it.

        ``spacing``: the least tar bytes between points of a file without a seek table (a
        table's frames are kept as its writer cut them).
        """
        return ZstdIndexing(fileobj, spacing)

    def stream(self, fileobj: IO[bytes]) -> IO[bytes]:
        """The whole tar: every frame decoded and checked, truncation an error."""
        return ZstdStream(fileobj)  # type: ignore[return-value]


class ZstdStream(io.RawIOBase):
    """The decompressed tar of a zstd file read sequentially, recording where its frames are.

    Frames are decoded one after the other (skippable ones skipped); a file that ends inside a
    frame, or bytes that are not a frame, raise :class:`~wids.errors.CompressedDataError`
    naming the compressed offset of the frame. ``frames`` lists ``(compressed_start,
    content_start, content_size)`` of every frame met so far; ``compressed_end`` is where the
    last complete frame ended.
    """

    def __init__(self, fileobj: IO[bytes]) -> None:
        zstandard = _zstandard()
        self._raw = fileobj
        self._dctx = zstandard.ZstdDecompressor()
        self._error = zstandard.ZstdError
        self._obj: Any = None
        self._pending = b""  # compressed bytes read but not yet fed
        self._buf = b""
        self._pos = 0
        self._eof = False
        self.frames: list[tuple[int, int, int]] = []
        self.compressed_end = 0  # the end of the last complete frame
        self._fed = 0  # compressed bytes fed to decoders
        self.content_size = 0  # content bytes produced so far

    def readable(self) -> bool:
        """Always: it is a reader."""
        return True

    def readinto(self, b: Any) -> int:
        """Fill ``b`` with the next decompressed bytes; 0 at the end of the data."""
        view = memoryview(b).cast("B")
        while self._pos >= len(self._buf) and not self._eof:
            self._buf, self._pos = self._more(), 0
        n = min(len(view), len(self._buf) - self._pos)
        view[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def _more(self) -> bytes:
        if not self._pending:
            self._pending = self._raw.read(_FEED)
            if not self._pending:
                self._eof = True
                if self._obj is not None:
                    raise CompressedDataError(
                        "zstd data ends inside a frame: truncated", offset=self.compressed_end
                    )
                return b""
        if self._obj is None:
            self._obj = self._dctx.decompressobj()
            self.frames.append((self._fed, self.content_size, 0))
        piece, self._pending = self._pending, b""
        try:
            out: bytes = self._obj.decompress(piece)
        except self._error as e:
            raise CompressedDataError(
                f"zstd frame does not decode ({e})", offset=self.compressed_end
            ) from None
        self._fed += len(piece)
        self.content_size += len(out)
        if self._obj.eof:
            rest = self._obj.unused_data
            self._fed -= len(rest)
            self._pending = rest + self._pending
            start, content_start, _ = self.frames[-1]
            self.frames[-1] = (start, content_start, self.content_size - content_start)
            self.compressed_end = self._fed
            self._obj = None
        return out


class ZstdIndexing:
    """One pass over a ``.tar.zst``: the table from its tail, then its frames (see the module)."""

    def __init__(self, fileobj: IO[bytes], spacing: int = 1) -> None:
        _zstandard()
        if spacing < 1:
            raise ValueError(f"zstd seek point spacing must be positive, not {spacing}")
        self._spacing = spacing
        self._size = os.fstat(fileobj.fileno()).st_size
        self._table = None
        if self._size >= FOOTER_SIZE:
            fileobj.seek(self._size - FOOTER_SIZE)
            parsed = parse_footer(fileobj.read(FOOTER_SIZE))
            if parsed is not None:
                table_bytes = min(parsed[0], self._size)
                fileobj.seek(self._size - table_bytes)
                self._table = parse_seek_table(fileobj.read(table_bytes), self._size)
            fileobj.seek(0)
        self._stream = ZstdStream(fileobj)
        self.stream: IO[bytes] = self._stream  # type: ignore[assignment]

    def points(self) -> SeekPoints:
        """The frames with content, checked against the seek table when there is one."""
        met = self._stream
        frames = [(c, u) for c, u, n in met.frames if n > 0]
        usize = met.content_size
        if met.compressed_end != self._size:
            raise CompressedDataError(
                "zstd data stops before the end of the file", offset=met.compressed_end
            )
        if self._table is None:
            kept = frames[:1]
            for c, u in frames[1:]:
                if u - kept[-1][1] >= self._spacing:
                    kept.append((c, u))
            if len(kept) < 2:  # one frame: it cannot be sought, read whole
                return SeekPoints("zstd", self._size, usize)
            cs, us = zip(*kept, strict=True)
            return SeekPoints("zstd", self._size, usize, cs, us)
        c_table, u_table = self._table.points()
        if (
            self._table.content_size != usize
            or len(c_table) != len(frames)
            or any((int(a), int(b)) != f for a, b, f in zip(c_table, u_table, frames, strict=True))
        ):
            at = next(
                (f[0] for f, a in zip(frames, c_table, strict=False) if f[0] != int(a)),
                self._table.table_offset,
            )
            raise CompressedDataError(
                "the seek table does not list the file's frames", offset=int(at)
            )
        return SeekPoints("zstd", self._table.table_offset, usize, c_table, u_table)

    def close(self) -> None:
        """Nothing to release (the file is the caller's)."""


CODEC = ZstdCodec()
