"""Writing seekable zstd: a binary stream that compresses into frames cut where the caller says.

:class:`SeekableZstdWriter` wraps a writable binary file. Bytes written go into the current
zstd frame; :meth:`~SeekableZstdWriter.end_frame` closes it (the writer of a shard does so after
every sample, or every few), and a frame is also cut at the format's 1 GiB of content.
:meth:`~SeekableZstdWriter.close` ends the last frame and appends the seek table
(:func:`~wids.compress.zstdframes.encode_seek_table`), with each frame's checksum: the frames
carry zstd's own content checksum, which is the same number the table records (the low 32 bits
of the content's XXH64), so no second hash is computed.

The result is an ordinary zstd stream for every zstd decoder, and the seek table lets a reader
fetch one frame by byte range.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from ..extras import missing
from .zstdframes import MAX_FRAME_CONTENT, SeekTable, encode_seek_table

__all__ = ["DEFAULT_LEVEL", "SeekableZstdWriter"]

DEFAULT_LEVEL = 3  # zstd's own default


class _Writable(Protocol):
    def write(self, data: bytes, /) -> Any: ...


class SeekableZstdWriter:
    """A write-only binary stream of zstd frames with a seek table at the end.

    Args:
        fileobj: Where the compressed bytes go (written from its position, not closed).
        level: zstd compression level (1-22; negative levels are the fast ones).

    Example:
        >>> import io
        >>> out = io.BytesIO()
        >>> w = SeekableZstdWriter(out)
        >>> _ = w.write(b"first"); w.end_frame(); _ = w.write(b"second")
        >>> len(w.close())
        2
    """

    def __init__(self, fileobj: _Writable, *, level: int = DEFAULT_LEVEL) -> None:
        try:
            import zstandard
        except ImportError as e:
            raise missing("zstandard", "writing .tar.zst shards", e) from None

        if not isinstance(level, int) or not -(1 << 17) <= level <= zstandard.MAX_COMPRESSION_LEVEL:
            raise ValueError(f"zstd level must be an int up to 22, not {level!r}")
        self._out = fileobj
        self._cctx = zstandard.ZstdCompressor(level=level, write_checksum=True)
        self._flush_finish = zstandard.COMPRESSOBJ_FLUSH_FINISH
        self._obj: Any = None
        self._frame_in = 0  # content bytes in the current frame
        self._frame_out = 0  # compressed bytes of the current frame so far
        self._last = b""  # the current frame's last compressed bytes (its checksum at the end)
        self._sizes: list[tuple[int, int]] = []
        self._checksums: list[int] = []
        self.content_offset = 0  # content bytes written so far
        self.compressed_offset = 0  # compressed bytes written so far
        self._closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Compress ``data`` into the current frame (cut at 1 GiB of content); returns its size."""
        if self._closed:
            raise ValueError("write to a closed SeekableZstdWriter")
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            room = MAX_FRAME_CONTENT - self._frame_in
            piece = view[done : done + room]
            if self._obj is None:
                self._obj = self._cctx.compressobj()
            self._emit(self._obj.compress(piece))
            self._frame_in += len(piece)
            done += len(piece)
            if self._frame_in == MAX_FRAME_CONTENT:
                self.end_frame()
        self.content_offset += done
        return done

    def end_frame(self) -> None:
        """End the current frame (nothing happens when it holds no bytes yet)."""
        if self._obj is None:
            return
        self._emit(self._obj.flush(self._flush_finish))
        self._obj = None
        tail = self._last[-4:]
        self._sizes.append((self._frame_out, self._frame_in))
        self._checksums.append(struct.unpack("<I", tail)[0])
        self._frame_in = self._frame_out = 0
        self._last = b""

    def _emit(self, chunk: bytes) -> None:
        if chunk:
            self._out.write(chunk)
            self._frame_out += len(chunk)
            self.compressed_offset += len(chunk)
            self._last = (self._last + chunk)[-4:]

    def table(self) -> SeekTable:
        """The frames ended so far, as a reader's seek table."""
        import numpy as np

        compressed = np.zeros(len(self._sizes) + 1, dtype=np.int64)
        content = np.zeros(len(self._sizes) + 1, dtype=np.int64)
        if self._sizes:
            sizes = np.array(self._sizes, dtype=np.int64)
            np.cumsum(sizes[:, 0], out=compressed[1:])
            np.cumsum(sizes[:, 1], out=content[1:])
        return SeekTable(compressed, content, np.array(self._checksums, dtype=np.uint32))

    def close(self) -> SeekTable:
        """End the last frame and write the seek table; returns it (the file is not closed)."""
        if not self._closed:
            self.end_frame()
            table = encode_seek_table(self._sizes, self._checksums)
            self._out.write(table)
            self._closed = True
        return self.table()
