"""Seek points of a compressed shard: where decoding may start, and what it needs there.

A compressed shard's member table keeps *uncompressed* tar offsets (every tar-header check
works unchanged); :class:`SeekPoints` maps an uncompressed byte range to the compressed bytes
to fetch and decode. Point ``k`` says: decoding that starts at compressed byte
``compressed[k]`` (gzip: minus one byte when ``bits[k]`` is not 0, whose top ``bits[k]`` bits
come first) yields the tar from uncompressed byte ``uncompressed[k]`` on; gzip also needs
the 32 KiB of tar before the point (``window(k)``, stored zlib-compressed), zstd frames need
nothing. A shard without points (``seekable`` false: a single-frame ``.tar.zst``, a gzip
indexed without them) is decompressed whole.

On disk (:meth:`SeekPoints.to_bytes`, little-endian; every index backend stores these bytes)::

    0   8 bytes  MAGIC  ``WIDSSEEK``
    8   uint16   VERSION (1)
    10  uint8    kind (1 gzip, 2 zstd)
    11  uint8    flags (0)
    12  uint32   n, the number of points
    16  uint64   compressed_size: where the compressed stream of the tar ends in the file
    24  uint64   uncompressed_size: the tar's size once decoded
    32  int64[n] compressed, int64[n] uncompressed, uint8[n] bits, int64[n] window_end,
        then the windows (zlib), window ``k`` ``blob[window_end[k-1]:window_end[k]]``

:meth:`SeekPoints.from_bytes` is the one reader of it and treats it as hostile input: exact
length, bounded counts, offsets rising inside the sizes, windows bounded when inflated.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np

from ..errors import IndexFormatError

__all__ = ["KINDS", "MAGIC", "MAX_POINTS", "VERSION", "WINDOW", "SeekPoints"]

MAGIC = b"WIDSSEEK"
VERSION = 1
KINDS = {"gzip": 1, "zstd": 2}
"""Compression kinds and their codes on disk."""
WINDOW = 32768
"""Bytes of history a deflate stream may refer back to: a gzip point's window."""
MAX_POINTS = 1 << 24
"""Most points one shard may have (16 M: a 1 TiB shard at 64 KiB spacing)."""
_MAX_OFFSET = 1 << 62
_HEAD = struct.Struct("<8sHBBIQQ")


class SeekPoints:
    """Where decoding of one compressed shard may start (see the module's doc).

    Args:
        kind: ``"gzip"`` or ``"zstd"``.
        compressed_size: End of the compressed stream in the file (at most the file's size).
        uncompressed_size: Size of the decoded tar.
        compressed: Compressed byte offset of each point (int64, non-decreasing).
        uncompressed: Uncompressed byte offset of each point (int64, strictly rising).
        bits: gzip: bits of the byte before ``compressed[k]`` that belong to point ``k``
            (0-7); zstd: zeros. ``None``: zeros.
        windows: gzip: each point's window, zlib-compressed (``b""``: none, a stream start);
            ``None``: none.

    Raises:
        IndexFormatError: The values are inconsistent (they may come from an index file).
    """

    __slots__ = (
        "bits",
        "compressed",
        "compressed_size",
        "kind",
        "uncompressed",
        "uncompressed_size",
        "window_blob",
        "window_end",
    )

    def __init__(
        self,
        kind: str,
        compressed_size: int,
        uncompressed_size: int,
        compressed: Any = (),
        uncompressed: Any = (),
        bits: Any = None,
        windows: list[bytes] | tuple[bytes, ...] | None = None,
    ) -> None:
        self.kind = kind
        self.compressed_size = compressed_size
        self.uncompressed_size = uncompressed_size
        self.compressed = np.asarray(compressed, dtype=np.int64).reshape(-1)
        self.uncompressed = np.asarray(uncompressed, dtype=np.int64).reshape(-1)
        n = len(self.compressed)
        self.bits = np.zeros(n, np.uint8) if bits is None else np.asarray(bits, np.uint8)
        wins = list(windows) if windows is not None else [b""] * n
        if len(wins) != n:
            raise IndexFormatError(f"seek points: {len(wins)} windows for {n} points")
        self.window_blob = b"".join(wins)
        self.window_end = np.cumsum([len(w) for w in wins], dtype=np.int64).reshape(-1)
        problem = self._problem()
        if problem:
            raise IndexFormatError(f"seek points: {problem}")

    def _problem(self) -> str | None:
        if self.kind not in KINDS:
            return f"unknown compression {self.kind!r}"
        for name in ("compressed_size", "uncompressed_size"):
            v = getattr(self, name)
            if type(v) is not int or not 0 <= v < _MAX_OFFSET:
                return f"{name} {v!r} is not a size"
        c, u, n = self.compressed, self.uncompressed, len(self.compressed)
        if n > MAX_POINTS:
            return f"{n} points (limit {MAX_POINTS})"
        if len(u) != n or len(self.bits) != n:
            return "compressed, uncompressed and bits differ in length"
        if not n:
            return None
        if int(c.min()) < 0 or int(c.max()) > self.compressed_size:
            return f"compressed offsets outside [0, {self.compressed_size}]"
        if int(u[0]) != 0 and self.kind == "zstd":
            return "the first zstd frame must start at byte 0 of the tar"
        if int(u.min()) < 0 or int(u.max()) >= max(1, self.uncompressed_size):
            return f"uncompressed offsets outside [0, {self.uncompressed_size})"
        if n > 1 and (bool(np.any(np.diff(u) <= 0)) or bool(np.any(np.diff(c) < 0))):
            return "points must rise in both offsets"
        if int(self.bits.max()) > 7:
            return "bits must be 0-7"
        if bool(np.any((self.bits > 0) & (c == 0))):
            return "a point with bits needs the byte before it"
        return None

    # -- queries ----------------------------------------------------------------------------

    @property
    def seekable(self) -> bool:
        """Whether decoding can start inside the shard (else it is decompressed whole)."""
        return len(self.compressed) > 0

    def __len__(self) -> int:
        return len(self.compressed)

    def __repr__(self) -> str:
        return (
            f"SeekPoints({self.kind}, {len(self)} points, {self.compressed_size} -> "
            f"{self.uncompressed_size} bytes)"
        )

    def cover(self, start: int, stop: int) -> tuple[int, int]:
        """The points around the uncompressed range ``[start, stop)``: ``(k, j)``.

        ``k`` is the last point at or before ``start`` (decoding starts there); ``j`` the first
        point at or after ``stop`` (``len(self)`` if none: decoding may run to the end).

        Raises:
            ValueError: No points, or the range is not inside the tar.
        """
        if not self.seekable:
            raise ValueError("no seek points: the shard is decompressed whole")
        if not 0 <= start <= stop <= self.uncompressed_size:
            raise ValueError(f"range [{start}, {stop}) outside the {self.uncompressed_size} bytes")
        k = int(np.searchsorted(self.uncompressed, start, "right")) - 1
        if k < 0:
            raise ValueError(f"no seek point at or before byte {start}")
        j = int(np.searchsorted(self.uncompressed, stop, "left"))
        return k, j

    def window(self, k: int) -> bytes:
        """Point ``k``'s window, inflated (at most :data:`WINDOW` bytes; ``b""``: none).

        Raises:
            IndexFormatError: The stored window does not inflate to at most 32 KiB.
        """
        lo = int(self.window_end[k - 1]) if k else 0
        packed = self.window_blob[lo : int(self.window_end[k])]
        if not packed:
            return b""
        d = zlib.decompressobj()
        try:
            out = d.decompress(packed, WINDOW + 1)
        except zlib.error as e:
            raise IndexFormatError(f"seek point {k}: its window does not inflate ({e})") from None
        if len(out) > WINDOW or not d.eof:
            raise IndexFormatError(f"seek point {k}: its window is not at most {WINDOW} bytes")
        return out

    # -- encoding ---------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The points as stored in an index (the module's layout)."""
        head = _HEAD.pack(
            MAGIC,
            VERSION,
            KINDS[self.kind],
            0,
            len(self),
            self.compressed_size,
            self.uncompressed_size,
        )
        return b"".join(
            (
                head,
                self.compressed.astype("<i8").tobytes(),
                self.uncompressed.astype("<i8").tobytes(),
                self.bits.tobytes(),
                self.window_end.astype("<i8").tobytes(),
                self.window_blob,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SeekPoints:
        """Read points stored by :meth:`to_bytes`, validating everything.

        Raises:
            IndexFormatError: Not seek points of this version, or inconsistent.
        """
        if len(data) < _HEAD.size:
            raise IndexFormatError("seek points: too short")
        magic, version, code, flags, n, csize, usize = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise IndexFormatError("seek points: not seek points (bad magic)")
        if version != VERSION or flags != 0:
            raise IndexFormatError(
                f"seek points: version {version} flags {flags}; this wids reads version "
                f"{VERSION}: upgrade wids, or rebuild the index"
            )
        kind = {v: k for k, v in KINDS.items()}.get(code)
        if kind is None:
            raise IndexFormatError(f"seek points: unknown compression code {code}")
        if n > MAX_POINTS:
            raise IndexFormatError(f"seek points: {n} points (limit {MAX_POINTS})")
        fixed = _HEAD.size + 25 * n
        if len(data) < fixed:
            raise IndexFormatError("seek points: shorter than their point count says")
        off = _HEAD.size
        arrays = []
        for dtype, size in (("<i8", 8), ("<i8", 8), ("u1", 1), ("<i8", 8)):
            arrays.append(np.frombuffer(data, dtype, n, off).astype(np.int64))
            off += size * n
        comp, uncomp, bits, wend = arrays
        blob = data[off:]
        if n and (
            int(wend.min()) < 0 or bool(np.any(np.diff(wend) < 0)) or int(wend[-1]) != len(blob)
        ):
            raise IndexFormatError("seek points: window offsets do not match the windows")
        if not n and blob:
            raise IndexFormatError("seek points: bytes after the points")
        if bool(np.any(bits > 7)):
            raise IndexFormatError("seek points: bits must be 0-7")
        pts = cls(kind, csize, usize, comp, uncomp, bits.astype(np.uint8))
        pts.window_blob, pts.window_end = blob, wend
        return pts

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeekPoints):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]
