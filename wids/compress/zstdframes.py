"""Seekable zstd: the seek table at a file's end, frame boundaries, and decoding a range.

The seekable format (zstd's ``contrib/seekable_format``) is an ordinary zstd stream of
independent frames followed by one *skippable* frame that lists every frame's compressed and
decompressed size. Any zstd decoder (``zstd -d``, ``tar --zstd``, webdataset's) skips that last
frame, so a seekable ``.tar.zst`` reads as a plain one; a reader that knows the table fetches and
decodes only the frames covering the bytes it wants. Layout of the table frame, little-endian::

    u32 0x184D2A5E          skippable-frame magic
    u32 frame_size          bytes that follow this field: entries + 9
    entries                 per frame: u32 compressed size, u32 decompressed size
                            [, u32 low 32 bits of the XXH64 of the frame's content]
    u32 number_of_frames
    u8  descriptor          bit 7 checksums present; bits 6-2 reserved, must be 0
    u32 0x8F92EAB1          seekable magic: the file's last four bytes

Everything read from a file is hostile input: :func:`parse_seek_table` checks the table
against the file's size (the frames must tile the bytes before the table exactly) in work
proportional to the table, and :func:`decode_frames` checks each frame's own length against
the table (walking its block headers) and its decompressed length before trusting it, with the
output bounded by the table. Errors are :class:`~wids.errors.CompressedDataError` naming the
shard and the compressed offset.

No I/O here: callers hand in bytes (the tail, a frame range) read however they read.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CompressedDataError

__all__ = [
    "FOOTER_SIZE",
    "MAX_FRAME_CONTENT",
    "SEEKABLE_MAGIC",
    "SKIPPABLE_MAGIC",
    "ZSTD_MAGIC",
    "SeekTable",
    "decode_frames",
    "encode_seek_table",
    "is_zstd",
    "parse_footer",
    "parse_seek_table",
]

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MAGIC = 0x184D2A5E  # the one the seekable format uses (0x184D2A50-5F are skippable)
SEEKABLE_MAGIC = 0x8F92EAB1
FOOTER_SIZE = 9
# zstd's seekable implementation refuses more frames, and frames holding more than 1 GiB.
MAX_FRAMES = 0x8000000
MAX_FRAME_CONTENT = 1 << 30
_CHECKSUM_FLAG = 0x80
_RESERVED_BITS = 0x7C
_ZSTD_HEAD = struct.pack("<I", ZSTD_MAGIC)


def is_zstd(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts a zstd stream (a zstd or skippable frame)."""
    if len(head) < 4:
        return False
    magic = struct.unpack_from("<I", head)[0]
    return bool(magic == ZSTD_MAGIC or (magic & 0xFFFFFFF0) == 0x184D2A50)


@dataclass(frozen=True, eq=False)
class SeekTable:
    """Where each frame of a seekable zstd file starts, compressed and decompressed.

    Attributes:
        compressed: int64, ``frames + 1`` entries: frame ``i`` is bytes
            ``[compressed[i], compressed[i + 1])`` of the file; the last is where the table starts.
        content: int64, ``frames + 1`` entries: frame ``i`` decodes to bytes
            ``[content[i], content[i + 1])`` of the tar.
        checksums: uint32 per frame (low 32 bits of XXH64 of its content), or ``None``.
    """

    compressed: np.ndarray[Any, np.dtype[np.int64]]
    content: np.ndarray[Any, np.dtype[np.int64]]
    checksums: np.ndarray[Any, np.dtype[np.uint32]] | None = None

    def __len__(self) -> int:
        return len(self.compressed) - 1

    @property
    def content_size(self) -> int:
        """Bytes of the decompressed stream (the tar)."""
        return int(self.content[-1])

    @property
    def table_offset(self) -> int:
        """Where the seek table's skippable frame starts (the end of the data frames)."""
        return int(self.compressed[-1])

    def frames(self, start: int, stop: int) -> tuple[int, int]:
        """The frames ``[first, last)`` whose content covers tar bytes ``[start, stop)``.

        Raises:
            ValueError: The range is empty or outside the content.
        """
        if not 0 <= start < stop <= self.content_size:
            raise ValueError(f"range [{start}, {stop}) is not inside [0, {self.content_size})")
        first = int(np.searchsorted(self.content, start, side="right")) - 1
        last = int(np.searchsorted(self.content, stop, side="left"))
        return first, last

    def span(self, start: int, stop: int) -> tuple[int, int, int]:
        """What to read for tar bytes ``[start, stop)``: ``(c_start, c_stop, content_start)``.

        ``[c_start, c_stop)`` is the one compressed range to fetch; it decodes to tar bytes
        from ``content_start`` on.
        """
        first, last = self.frames(start, stop)
        return int(self.compressed[first]), int(self.compressed[last]), int(self.content[first])

    def decode(
        self, data: bytes | memoryview, first: int, last: int, *, shard: str | None = None
    ) -> bytes:
        """Decode frames ``[first, last)`` from their compressed bytes (:func:`decode_frames`)."""
        return decode_frames(
            self.compressed, self.content, data, first, last, checksums=self.checksums, shard=shard
        )

    def points(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Compressed and tar offsets of the frames that hold content: where decoding may start.

        Frames without content (skippable ones, empty ones) are dropped: they belong to the
        entry before them when these offsets are read back as a frame table.
        """
        keep = np.flatnonzero(np.diff(self.content) > 0)
        return self.compressed[keep], self.content[keep]


def parse_footer(footer: bytes, *, shard: str | None = None) -> tuple[int, int] | None:
    """The table frame's total size and entry size from a file's last 9 bytes.

    Returns:
        ``(table_bytes, entry_size)`` (the skippable frame's size with its 8-byte header), or
        ``None`` when the bytes do not end with the seekable magic (a plain zstd file).

    Raises:
        CompressedDataError: The magic is there but the descriptor is not one this reader
            knows (reserved bits set) or the frame count is over the format's limit.
    """
    if len(footer) != FOOTER_SIZE:
        raise ValueError(f"a seek table footer is {FOOTER_SIZE} bytes, not {len(footer)}")
    nframes, descriptor, magic = struct.unpack("<IBI", footer)
    if magic != SEEKABLE_MAGIC:
        return None
    if descriptor & _RESERVED_BITS:
        raise CompressedDataError(
            f"seek table descriptor {descriptor:#04x} has reserved bits set", shard=shard
        )
    if nframes > MAX_FRAMES:
        raise CompressedDataError(
            f"seek table lists {nframes} frames, over the format's {MAX_FRAMES}", shard=shard
        )
    entry = 12 if descriptor & _CHECKSUM_FLAG else 8
    return 8 + nframes * entry + FOOTER_SIZE, entry


def parse_seek_table(data: bytes, file_size: int, *, shard: str | None = None) -> SeekTable:
    """Parse and check a seek table: ``data`` is the file's last bytes, at least the table frame.

    Use :func:`parse_footer` on the last 9 bytes first to learn how many bytes to read.

    Raises:
        CompressedDataError: No seekable magic, a table larger than the file, a skippable
            header that does not frame the table, or frames that do not tile the bytes before
            it (their compressed sizes must add up to the table's offset), or a frame over the
            format's 1 GiB of content.
    """
    where = file_size - FOOTER_SIZE
    if file_size < 8 + FOOTER_SIZE or len(data) < FOOTER_SIZE:
        raise CompressedDataError("too short for a seek table", shard=shard, offset=0)
    parsed = parse_footer(bytes(data[-FOOTER_SIZE:]), shard=shard)
    if parsed is None:
        raise CompressedDataError("no seekable zstd magic at the end", shard=shard, offset=where)
    table_bytes, entry = parsed
    table_at = file_size - table_bytes
    if table_at < 0 or len(data) < table_bytes:
        raise CompressedDataError(
            f"seek table of {table_bytes} bytes does not fit", shard=shard, offset=where
        )
    table = memoryview(data)[len(data) - table_bytes :]
    magic, frame_size = struct.unpack_from("<II", table)
    if magic != SKIPPABLE_MAGIC or frame_size != table_bytes - 8:
        raise CompressedDataError(
            "seek table is not framed by a skippable frame header", shard=shard, offset=table_at
        )
    nframes = (table_bytes - 8 - FOOTER_SIZE) // entry
    rows = np.frombuffer(table, dtype="<u4", count=nframes * entry // 4, offset=8)
    rows = rows.reshape(nframes, entry // 4)
    compressed = np.zeros(nframes + 1, dtype=np.int64)
    np.cumsum(rows[:, 0], dtype=np.int64, out=compressed[1:])
    content = np.zeros(nframes + 1, dtype=np.int64)
    np.cumsum(rows[:, 1], dtype=np.int64, out=content[1:])
    if compressed[-1] != table_at:
        raise CompressedDataError(
            f"seek table's frames end at byte {int(compressed[-1])}, the table starts at "
            f"{table_at}",
            shard=shard,
            offset=table_at,
        )
    big = np.flatnonzero(rows[:, 1] > MAX_FRAME_CONTENT)
    if len(big):
        i = int(big[0])
        raise CompressedDataError(
            f"frame {i} claims {int(rows[i, 1])} bytes of content, over 1 GiB",
            shard=shard,
            offset=int(compressed[i]),
        )
    checksums = rows[:, 2].astype(np.uint32) if entry == 12 else None
    return SeekTable(compressed, content, checksums)


def encode_seek_table(sizes: list[tuple[int, int]], checksums: list[int] | None = None) -> bytes:
    """The seek table frame for frames of ``(compressed, decompressed)`` sizes, in order.

    Args:
        sizes: One pair per frame.
        checksums: Low 32 bits of each frame content's XXH64, or ``None`` for no checksums.
    """
    if checksums is not None and len(checksums) != len(sizes):
        raise ValueError("one checksum per frame")
    if len(sizes) > MAX_FRAMES:
        raise ValueError(f"at most {MAX_FRAMES} frames")
    flag = _CHECKSUM_FLAG if checksums is not None else 0
    parts = []
    for i, (csize, dsize) in enumerate(sizes):
        if not (0 <= csize < 1 << 32 and 0 <= dsize <= MAX_FRAME_CONTENT):
            raise ValueError(f"frame {i}: sizes {csize}, {dsize} do not fit the seek table")
        parts.append(struct.pack("<II", csize, dsize))
        if checksums is not None:
            parts.append(struct.pack("<I", checksums[i] & 0xFFFFFFFF))
    body = b"".join(parts) + struct.pack("<IBI", len(sizes), flag, SEEKABLE_MAGIC)
    return struct.pack("<II", SKIPPABLE_MAGIC, len(body)) + body


def _frame_length(
    frame: memoryview, *, shard: str | None, offset: int
) -> tuple[int, bool, bool, int | None]:
    """The length of the zstd or skippable frame ``frame`` starts with, from its block headers.

    Returns:
        ``(length, is_zstd, has_checksum, declared content size or None)``.

    Raises:
        CompressedDataError: Not a frame, or its blocks run past the bytes given.
    """
    import zstandard

    magic = struct.unpack_from("<I", frame)[0] if len(frame) >= 4 else None
    if magic is not None and (magic & 0xFFFFFFF0) == 0x184D2A50:
        if len(frame) < 8:
            raise CompressedDataError("truncated skippable frame", shard=shard, offset=offset)
        return 8 + struct.unpack_from("<I", frame, 4)[0], False, False, 0
    if magic != ZSTD_MAGIC:
        raise CompressedDataError("not a zstd frame", shard=shard, offset=offset)
    try:
        head = bytes(frame[:18])
        pos = zstandard.frame_header_size(head)
        params = zstandard.get_frame_parameters(head)
        checksum = bool(params.has_checksum)
        size = params.content_size
        declared = None if size == zstandard.CONTENTSIZE_UNKNOWN else int(size)
    except zstandard.ZstdError as e:
        raise CompressedDataError(
            f"bad zstd frame header: {e}", shard=shard, offset=offset
        ) from None
    end = len(frame)
    while True:
        if pos + 3 > end:
            raise CompressedDataError("zstd frame is truncated", shard=shard, offset=offset)
        block = frame[pos] | frame[pos + 1] << 8 | frame[pos + 2] << 16
        kind, size = (block >> 1) & 3, block >> 3
        if kind == 3:
            raise CompressedDataError("reserved zstd block type", shard=shard, offset=offset)
        pos += 3 + (1 if kind == 1 else size)
        if block & 1:
            break
    return pos + (4 if checksum else 0), True, checksum, declared


def decode_frames(
    compressed: Sequence[int] | np.ndarray[Any, Any],
    content: Sequence[int] | np.ndarray[Any, Any],
    data: bytes | memoryview,
    first: int,
    last: int,
    *,
    checksums: np.ndarray[Any, Any] | None = None,
    shard: str | None = None,
    dctx: Any = None,
) -> bytes:
    """Decode entries ``[first, last)`` of a frame table from their compressed bytes ``data``.

    Entry ``i`` is compressed bytes ``[compressed[i], compressed[i + 1])`` decoding to tar bytes
    ``[content[i], content[i + 1])`` (a :class:`SeekTable`'s arrays, or seek points with their
    ends appended). An entry holds one zstd frame, as the seekable format writes it, or several
    frames and skippable frames (points merged, skippable frames dropped). ``data`` is exactly
    ``[compressed[first], compressed[last])``. Each frame is checked before it is decoded: its
    length, walked from its block headers, must end inside its entry; the content size its
    header declares must fit what the entry has left; its output is bounded by that; the
    entry's content must come out exactly. A seekable table's checksum, where given, must be
    the frame's own (which zstd then verifies against the content).

    ``dctx``: a ``zstandard.ZstdDecompressor`` to use (one costs about as much to make as a
    100 KB frame to decode), else a new one.

    Returns:
        The content of those entries, ``content[last] - content[first]`` bytes.

    Raises:
        CompressedDataError: A frame disagrees with the table, is truncated or corrupt;
            ``offset`` is the frame's start in the file.
    """
    base = int(compressed[first])
    view = memoryview(data).cast("B")
    if len(view) != int(compressed[last]) - base:
        raise ValueError("data must be exactly the entries' compressed bytes")
    if dctx is None:
        import zstandard

        dctx = zstandard.ZstdDecompressor()
    out: list[bytes] = []
    for i in range(first, last):
        entry = view[int(compressed[i]) - base : int(compressed[i + 1]) - base]
        want = int(content[i + 1]) - int(content[i])
        check = None if checksums is None else int(checksums[i])
        out.extend(_decode_entry(entry, want, int(compressed[i]), check, shard, dctx))
    return out[0] if len(out) == 1 else b"".join(out)


def _decode_frame(
    frame: memoryview, declared: int | None, left: int, offset: int, shard: str | None, dctx: Any
) -> bytes:
    """One whole zstd frame (its length checked), its output bounded by ``left``."""
    import zstandard

    if declared is not None and declared > left:
        raise CompressedDataError(
            f"frame declares {declared} bytes of content, its entry has {left} left",
            shard=shard,
            offset=offset,
        )
    try:
        data: bytes = dctx.decompress(frame, max_output_size=max(left, 1))
    except zstandard.ZstdError as e:
        raise CompressedDataError(f"frame does not decode: {e}", shard=shard, offset=offset) from e
    return data


def _decode_entry(
    entry: memoryview, want: int, at: int, checksum: int | None, shard: str | None, dctx: Any
) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while pos < len(entry) or (want and pos == 0):  # no bytes for content: an error below
        offset = at + pos
        length, is_frame, has_checksum, declared = _frame_length(
            entry[pos:], shard=shard, offset=offset
        )
        if pos + length > len(entry):
            raise CompressedDataError(
                f"frame of {length} bytes runs past its entry's end ({len(entry) - pos} left)",
                shard=shard,
                offset=offset,
            )
        frame = entry[pos : pos + length]
        pos += length
        if not is_frame:
            continue
        if checksum is not None and has_checksum:
            if struct.unpack_from("<I", frame, length - 4)[0] != checksum:
                raise CompressedDataError(
                    "the frame's checksum is not its seek table entry's",
                    shard=shard,
                    offset=offset,
                )
        left = want - sum(len(c) for c in out)
        out.append(_decode_frame(frame, declared, left, offset, shard, dctx))
    got = sum(len(c) for c in out)
    if got != want:
        raise CompressedDataError(
            f"frames at byte {at} decode to {got} bytes, the table says {want}",
            shard=shard,
            offset=at,
        )
    return out
