"""Seekable zstd files: written by our writer, read by the real zstd and GNU tar binaries and by
tarfile; seek tables parsed back and ranges decoded equal to the bytes; hostile tables and frames
refused with a typed error naming the shard and the offset."""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

zstandard = pytest.importorskip("zstandard")

from wids.compress.zstdframes import (  # noqa: E402
    FOOTER_SIZE,
    SEEKABLE_MAGIC,
    SKIPPABLE_MAGIC,
    SeekTable,
    decode_frames,
    encode_seek_table,
    is_zstd,
    parse_footer,
    parse_seek_table,
)
from wids.compress.zstdwrite import SeekableZstdWriter  # noqa: E402
from wids.errors import CompressedDataError, TarFormatError  # noqa: E402

SHARD = "file:///data/shard-000.tar.zst"


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (apt-get install {tool})")
    return path


def _seekable(chunks: list[bytes], *, level: int = 3) -> tuple[bytes, SeekTable]:
    out = io.BytesIO()
    w = SeekableZstdWriter(out, level=level)
    for chunk in chunks:
        w.write(chunk)
        w.end_frame()
    table = w.close()
    return out.getvalue(), table


def _table_of(data: bytes) -> SeekTable:
    parsed = parse_footer(data[-FOOTER_SIZE:], shard=SHARD)
    assert parsed is not None
    return parse_seek_table(data[-parsed[0] :], len(data), shard=SHARD)


def _chunks(seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(12):
        n = int(rng.integers(0, 5000))
        text = (f"sample {i} " * (n // 10 + 1)).encode()[:n]
        out.append(text + rng.bytes(int(rng.integers(0, 300))))
    return out


def test_zstd_binary_reads_the_stream_and_the_table_says_where_each_frame_is(
    tmp_path: Path,
) -> None:
    chunks = _chunks()
    data, written = _seekable(chunks)
    path = tmp_path / "x.zst"
    path.write_bytes(data)
    zstd = _require("zstd")
    out = subprocess.run([zstd, "-dc", str(path)], capture_output=True, check=True).stdout
    assert out == b"".join(chunks)
    table = _table_of(data)
    assert len(table) == sum(1 for c in chunks if c)  # an empty frame is never written
    assert np.array_equal(table.compressed, written.compressed)
    assert np.array_equal(table.content, written.content)
    assert table.content_size == len(out)
    assert table.checksums is not None
    assert is_zstd(data) and not is_zstd(b"\x1f\x8b\x08\x00")


def test_every_range_decodes_to_the_bytes(tmp_path: Path) -> None:
    chunks = _chunks(1)
    data, _ = _seekable(chunks)
    plain = b"".join(chunks)
    table = _table_of(data)
    rng = np.random.default_rng(2)
    for _ in range(200):
        start = int(rng.integers(0, len(plain) - 1))
        stop = int(rng.integers(start + 1, len(plain) + 1))
        first, last = table.frames(start, stop)
        c0, c1, u0 = table.span(start, stop)
        got = table.decode(data[c0:c1], first, last, shard=SHARD)
        assert got[start - u0 : stop - u0] == plain[start:stop]
        assert len(got) == int(table.content[last] - table.content[first])


def test_table_from_the_zstd_binary_seekable_format_is_what_we_write() -> None:
    # The format as zstd's contrib documents it, built byte by byte: our encoder writes it.
    sizes, sums = [(10, 20), (30, 40)], [0xDEADBEEF, 7]
    body = struct.pack("<IIIIII", 10, 20, 0xDEADBEEF, 30, 40, 7)
    body += struct.pack("<IBI", 2, 0x80, SEEKABLE_MAGIC)
    assert encode_seek_table(sizes, sums) == struct.pack("<II", SKIPPABLE_MAGIC, len(body)) + body
    plain = encode_seek_table(sizes)
    assert plain[-9:] == struct.pack("<IBI", 2, 0, SEEKABLE_MAGIC) and len(plain) == 8 + 16 + 9


def test_plain_zstd_has_no_table() -> None:
    data = zstandard.ZstdCompressor().compress(b"x" * 1000)
    assert parse_footer(data[-FOOTER_SIZE:]) is None
    with pytest.raises(CompressedDataError, match="no seekable zstd magic"):
        parse_seek_table(data, len(data), shard=SHARD)


def _corrupt_table(data: bytes, at: int, value: bytes) -> bytes:
    raw = bytearray(data)
    raw[at : at + len(value)] = value
    return bytes(raw)


@pytest.mark.parametrize(
    "case",
    [
        "reserved-bits",
        "too-many-frames",
        "frame-count",
        "skippable-size",
        "skippable-magic",
        "sizes",
        "huge-frame",
        "short",
    ],
)
def test_hostile_seek_tables_are_typed_errors(case: str) -> None:
    data, _ = _seekable(_chunks(3))
    n = len(data)
    nframes = struct.unpack_from("<I", data, n - 9)[0]
    table_at = n - (8 + nframes * 12 + 9)
    bad = {
        "reserved-bits": lambda: _corrupt_table(data, n - 5, b"\x84"),
        "too-many-frames": lambda: _corrupt_table(data, n - 9, struct.pack("<I", 0xFFFFFFFF)),
        "frame-count": lambda: _corrupt_table(data, n - 9, struct.pack("<I", nframes - 1)),
        "skippable-size": lambda: _corrupt_table(data, table_at + 4, struct.pack("<I", 5)),
        "skippable-magic": lambda: _corrupt_table(data, table_at, struct.pack("<I", 0x184D2A50)),
        "sizes": lambda: _corrupt_table(data, table_at + 8, struct.pack("<I", 1)),
        "huge-frame": lambda: _huge_frame(data, table_at),
        "short": lambda: data[-12:],
    }[case]()
    with pytest.raises(CompressedDataError) as info:
        parsed = parse_footer(bad[-FOOTER_SIZE:], shard=SHARD)
        assert parsed is not None
        parse_seek_table(bad, len(bad), shard=SHARD)
    assert isinstance(info.value, TarFormatError) and isinstance(info.value, ValueError)
    assert info.value.shard == SHARD and SHARD in str(info.value)
    assert info.value.offset is not None or case in {"reserved-bits", "too-many-frames"}


def _huge_frame(data: bytes, table_at: int) -> bytes:
    # one frame claiming 2 GiB of content: over the format's limit, refused before any decode
    return _corrupt_table(data, table_at + 12, struct.pack("<I", 0x80000000))


def test_truncated_file_is_a_typed_error_naming_the_offset() -> None:
    data, _ = _seekable(_chunks(4))
    cut = data[: len(data) - 100]
    with pytest.raises(CompressedDataError) as info:
        parsed = parse_footer(cut[-FOOTER_SIZE:], shard=SHARD)
        if parsed is None:  # the magic was cut off: what the index builder reports
            raise CompressedDataError("no table", shard=SHARD, offset=len(cut))
        parse_seek_table(cut, len(cut), shard=SHARD)
    assert info.value.offset is not None


@pytest.mark.parametrize("case", ["flipped-byte", "short-frame", "long-frame", "checksum"])
def test_corrupt_frames_are_typed_errors_naming_the_frame_offset(case: str) -> None:
    chunks = [os.urandom(64) + b"a" * 4000 for _ in range(4)]
    data, table = _seekable(chunks)
    i = 2
    c1 = int(table.compressed[i + 1])
    frames = bytearray(data[: table.table_offset])
    if case == "flipped-byte":
        frames[c1 - 8] ^= 0xFF  # inside the last block or the checksum
        bad_table = table
    elif case == "short-frame":  # the table cuts the frame short: its blocks run past the end
        sizes = np.diff(table.compressed).tolist()
        sizes[i] -= 2
        sizes[i + 1] += 2
        bad_table = _table(sizes, np.diff(table.content).tolist(), table.checksums)
    elif case == "long-frame":  # the table gives the frame bytes of the next one
        sizes = np.diff(table.compressed).tolist()
        sizes[i] += 2
        sizes[i + 1] -= 2
        bad_table = _table(sizes, np.diff(table.content).tolist(), table.checksums)
    else:
        sums = table.checksums.copy()  # type: ignore[union-attr]
        sums[i] ^= 1
        bad_table = _table(
            np.diff(table.compressed).tolist(), np.diff(table.content).tolist(), sums
        )
    with pytest.raises(CompressedDataError) as info:
        bad_table.decode(bytes(frames), 0, len(bad_table), shard=SHARD)
    # the frame's start, or (an entry too long) where the bytes after its frame start
    assert int(bad_table.compressed[i]) <= info.value.offset < int(bad_table.compressed[i + 1])
    assert info.value.shard == SHARD


def _table(csizes: list[int], dsizes: list[int], sums: object) -> SeekTable:
    blob = encode_seek_table(list(zip(csizes, dsizes, strict=True)), [int(s) for s in sums])  # type: ignore[attr-defined]
    return parse_seek_table(b"\0" * sum(csizes) + blob, sum(csizes) + len(blob))


def test_content_size_claims_are_checked_before_decoding() -> None:
    # a frame whose own header declares more content than the table: refused, nothing allocated
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"z" * 5000)
    blob = encode_seek_table([(len(frame), 10)])
    table = parse_seek_table(frame + blob, len(frame) + len(blob))
    with pytest.raises(
        CompressedDataError, match="declares 5000 bytes of content, its entry has 10 left"
    ):
        table.decode(frame, 0, 1, shard=SHARD)
    # and without a declared size, the output is bounded by the table's
    out = io.BytesIO()
    obj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    out.write(obj.compress(b"z" * 5000) + obj.flush())
    frame = out.getvalue()
    blob = encode_seek_table([(len(frame), 10)])
    table = parse_seek_table(frame + blob, len(frame) + len(blob))
    with pytest.raises(CompressedDataError, match="does not decode"):
        table.decode(frame, 0, 1, shard=SHARD)


def test_skippable_frames_in_the_data_are_skipped() -> None:
    chunks = [b"a" * 100, b"b" * 200]
    data, table = _seekable(chunks)
    skip = struct.pack("<II", 0x184D2A50, 4) + b"meta"
    frames = data[: table.table_offset]
    mid = int(table.compressed[1])
    joined = frames[:mid] + skip + frames[mid:]
    sizes = [(mid, 100), (len(skip), 0), (len(frames) - mid, 200)]
    blob = encode_seek_table(sizes)
    t2 = parse_seek_table(joined + blob, len(joined) + len(blob))
    assert t2.decode(joined, 0, 3) == b"a" * 100 + b"b" * 200


def test_writer_cuts_frames_at_one_gib_of_content() -> None:
    import wids.compress.zstdwrite as zw

    small = 1000
    out = io.BytesIO()
    w = SeekableZstdWriter(out)
    original = zw.MAX_FRAME_CONTENT
    try:
        zw.MAX_FRAME_CONTENT = small  # the same cut at a size a test can write
        w.write(b"q" * 2500)
    finally:
        zw.MAX_FRAME_CONTENT = original
    table = w.close()
    assert np.diff(table.content).tolist() == [1000, 1000, 500]
    assert (
        zstandard.ZstdDecompressor()
        .stream_reader(io.BytesIO(out.getvalue()), read_across_frames=True)
        .read()
        == b"q" * 2500
    )


def test_tarfile_reads_a_seekable_tar(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(3):
            payload = f"ünï {i}".encode() * 50
            info = tarfile.TarInfo(f"dir/{'long' * 30}-{i}.txt")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    tar = raw.getvalue()
    data, _ = _seekable([tar[k : k + 1024] for k in range(0, len(tar), 1024)])
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        names = [m.name for m in tf]
    assert names == [f"dir/{'long' * 30}-{i}.txt" for i in range(3)]


def test_points_drop_empty_frames_and_read_back_as_merged_entries() -> None:
    # seek points keep the frames that hold content; an entry then spans a frame and the
    # skippable frame after it, and several frames when points are merged
    chunks = [b"a" * 100, b"b" * 200, b"c" * 50]
    data, table = _seekable(chunks)
    frames = data[: table.table_offset]
    skip = struct.pack("<II", 0x184D2A53, 2) + b"hi"
    mid = int(table.compressed[1])
    joined = frames[:mid] + skip + frames[mid:]
    sizes = [(mid, 100), (len(skip), 0)] + [
        (
            int(table.compressed[i + 1] - table.compressed[i]),
            int(table.content[i + 1] - table.content[i]),
        )
        for i in (1, 2)
    ]
    blob = encode_seek_table(sizes)
    t2 = parse_seek_table(joined + blob, len(joined) + len(blob))
    c, u = t2.points()
    assert u.tolist() == [0, 100, 300] and c.tolist()[0] == 0 and c[1] == mid + len(skip)
    bounds_c = np.append(c, t2.table_offset)
    bounds_u = np.append(u, t2.content_size)
    assert decode_frames(bounds_c, bounds_u, joined, 0, 3) == b"".join(chunks)
    # merged: the first two entries as one
    merged_c, merged_u = bounds_c[[0, 2, 3]], bounds_u[[0, 2, 3]]
    assert decode_frames(merged_c, merged_u, joined, 0, 2) == b"".join(chunks)
    with pytest.raises(CompressedDataError, match="frames at byte 0 decode to 300 bytes"):
        decode_frames(merged_c, np.array([0, 301, 350]), joined[: merged_c[1]], 0, 1)
