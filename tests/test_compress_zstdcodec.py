"""The zstd codec on real .tar.zst shards: seekable ones from our writer, single-frame ones from
GNU tar and the zstd binary, multi-frame ones without a table (concatenated zstd output); every
sample decoded from its frames equals tarfile's; truncated data and lying tables are typed errors
naming the compressed offset."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from tarfixtures import require_gnu_tar, tarfile_members
from test_writer import mixed_samples

pytest.importorskip("zstandard")

from wids.compress import codec_for  # noqa: E402
from wids.compress.zstdcodec import ZstdStream  # noqa: E402
from wids.compress.zstdframes import FOOTER_SIZE, encode_seek_table  # noqa: E402
from wids.errors import CompressedDataError  # noqa: E402
from wids.writer import TarWriter  # noqa: E402

CODEC = codec_for("zstd")


def _zstd() -> str:
    path = shutil.which("zstd")
    if path is None:
        pytest.skip("zstd is not installed (apt-get install zstd)")
    return path


def _unzstd(data: bytes) -> bytes:
    return subprocess.run([_zstd(), "-dc"], input=data, capture_output=True, check=True).stdout


def _index(path: Path, spacing: int = 1 << 20):  # -> (points, decompressed tar)
    with path.open("rb") as f:
        indexing = CODEC.indexing(f, spacing)
        tar = indexing.stream.read()
        points = indexing.points()
        indexing.close()
    return points, tar


def _seekable_shard(tmp_path: Path, samples: list[dict] | None = None, **kw: object) -> Path:
    path = tmp_path / "s.tar.zst"
    with TarWriter(str(path), compress="zstd", **kw) as w:  # type: ignore[arg-type]
        for s in samples or mixed_samples():
            w.write(s)
    return path


def _check_every_member(path: Path, points: object, tar: bytes) -> None:
    data = path.read_bytes()
    for name, offset, size, kind, header in tarfile_members(tar):
        if kind != "0" or not size:
            continue
        # a member with its header, as the dataset reads it
        c0, c1 = CODEC.compressed_range(points, header, offset + size)
        got = CODEC.decode(points, data[c0:c1], header, offset + size)
        assert got == tar[header : offset + size], name


def test_seekable_shard_points_are_its_frames(tmp_path: Path) -> None:
    path = _seekable_shard(tmp_path)
    points, tar = _index(path)
    assert tar == _unzstd(path.read_bytes())
    assert points.kind == "zstd" and points.seekable
    assert len(points) == len(mixed_samples()) + 1  # a frame per sample, one for the end blocks
    assert points.uncompressed_size == len(tar)
    data = path.read_bytes()
    nframes = struct.unpack_from("<I", data, len(data) - FOOTER_SIZE)[0]
    assert points.compressed_size == len(data) - (8 + 12 * nframes + FOOTER_SIZE)
    _check_every_member(path, points, tar)


def test_one_sample_is_one_frame_read(tmp_path: Path) -> None:
    samples = [{"__key__": f"{i:04d}", "bin": bytes([i]) * (3000 + 100 * i)} for i in range(20)]
    path = _seekable_shard(tmp_path, samples)
    points, tar = _index(path)
    rows = tarfile_members(tar)
    for i, (_, offset, size, _, header) in enumerate(rows):
        c0, c1 = CODEC.compressed_range(points, header, offset + size)
        assert (c0, c1) == (int(points.compressed[i]), int(points.compressed[i + 1]))


def test_single_frame_tar_zst_from_gnu_tar_has_no_points(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i:03d}.txt").write_text(f"sample {i}\n" * 200)
    path = tmp_path / "gnu.tar.zst"
    _zstd()  # tar --zstd runs it
    subprocess.run([require_gnu_tar(), "--zstd", "-cf", str(path), "-C", str(src), "."], check=True)
    _zstd()
    points, tar = _index(path)
    assert not points.seekable and points.uncompressed_size == len(tar)
    assert points.compressed_size == path.stat().st_size
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        assert sorted(m.name for m in tf if m.isfile()) == [f"./{i:03d}.txt" for i in range(5)]
    with pytest.raises(ValueError, match="no seek points"):
        CODEC.compressed_range(points, 0, 512)


def test_concatenated_frames_without_a_table_are_points(tmp_path: Path) -> None:
    # what pzstd writes (and cat a.zst b.zst): frames, no table; each frame is a point
    path = _seekable_shard(tmp_path)
    data = path.read_bytes()
    nframes = struct.unpack_from("<I", data, len(data) - FOOTER_SIZE)[0]
    frames_only = tmp_path / "noseek.tar.zst"
    frames_only.write_bytes(data[: len(data) - (8 + 12 * nframes + FOOTER_SIZE)])
    points, tar = _index(frames_only, spacing=1)
    assert len(points) == nframes and points.compressed_size == frames_only.stat().st_size
    _check_every_member(frames_only, points, tar)
    # points closer than the spacing are merged: entries of several frames
    points, _ = _index(frames_only, spacing=4096)
    assert 1 < len(points) < nframes and min(np.diff(points.uncompressed)) >= 4096
    _check_every_member(frames_only, points, tar)
    points, _ = _index(frames_only, spacing=len(tar))  # one point left: read whole
    assert not points.seekable


def test_truncated_shard_is_a_typed_error_naming_the_frame(tmp_path: Path) -> None:
    path = _seekable_shard(tmp_path)
    data = path.read_bytes()
    points, _ = _index(path)
    cut = tmp_path / "cut.tar.zst"
    third = int(points.compressed[3])
    cut.write_bytes(data[: third + 20])  # inside frame 3; the table is gone
    with cut.open("rb") as f, pytest.raises(CompressedDataError) as info:
        stream = CODEC.stream(f)
        while stream.read(1 << 16):
            pass
    assert info.value.offset == third and "truncated" in str(info.value)


def test_corrupt_frame_is_a_typed_error_naming_the_frame(tmp_path: Path) -> None:
    path = _seekable_shard(tmp_path)
    points, _ = _index(path)
    data = bytearray(path.read_bytes())
    c2 = int(points.compressed[2])
    data[c2 : c2 + 4] = b"\0\0\0\0"  # frame 2's magic
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(bytes(data))
    with bad.open("rb") as f, pytest.raises(CompressedDataError) as info:
        CODEC.stream(f).read()
    assert info.value.offset == c2
    # and the range read of that frame says the same
    u2, u3 = int(points.uncompressed[2]), int(points.uncompressed[3])
    c0, c1 = CODEC.compressed_range(points, u2, u3)
    with pytest.raises(CompressedDataError) as info:
        CODEC.decode(points, bytes(data[c0:c1]), u2, u3)
    assert info.value.offset == c2


def test_a_table_that_lies_about_the_frames_is_refused(tmp_path: Path) -> None:
    path = _seekable_shard(tmp_path)
    data = path.read_bytes()
    nframes = struct.unpack_from("<I", data, len(data) - FOOTER_SIZE)[0]
    frames = data[: len(data) - (8 + 12 * nframes + FOOTER_SIZE)]
    points, _ = _index(path)
    sizes = np.diff(np.append(points.compressed, points.compressed_size)).tolist()
    content = np.diff(np.append(points.uncompressed, points.uncompressed_size)).tolist()
    # frames 1 and 2 swap their content sizes: the sums still fit the file
    content[1], content[2] = content[2], content[1]
    liar = tmp_path / "liar.tar.zst"
    liar.write_bytes(frames + encode_seek_table(list(zip(sizes, content, strict=True))))
    with liar.open("rb") as f:
        indexing = CODEC.indexing(f, 1 << 20)
        indexing.stream.read()
        with pytest.raises(CompressedDataError, match="does not list the file's frames"):
            indexing.points()


def test_stream_reads_every_tool_s_output(tmp_path: Path) -> None:
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        for i in range(3):
            info = tarfile.TarInfo(f"{i}.txt")
            info.size = 1000
            tf.addfile(info, io.BytesIO(b"x" * 1000))
    raw = tar.getvalue()
    for args in (["-1"], ["-19"], ["--no-check"], ["--long=27"]):
        data = subprocess.run(
            [_zstd(), "-c", *args], input=raw, capture_output=True, check=True
        ).stdout
        assert ZstdStream(io.BytesIO(data)).read() == raw, args


def _chunked_zstd(raw: bytes, step: int) -> bytes:
    """``raw`` as concatenated zstd frames of ``step`` bytes, each made by the zstd binary."""
    return b"".join(
        subprocess.run(
            [_zstd(), "-c", "-q"], input=raw[k : k + step], capture_output=True, check=True
        ).stdout
        for k in range(0, len(raw), step)
    )


def test_every_tar_format_compressed_by_the_zstd_binary(tar_fixture: Path, tmp_path: Path) -> None:
    # every fixture archive (tarfile and GNU tar, ustar/gnu/pax, long and non-ASCII names, links,
    # empty members): one frame, and frames cut every 1000 bytes (mid-header, mid-member) with
    # no table; the member table equals the plain tar's, every member decodes from the points
    from wids.errors import WidsError
    from wids.index import scan_shard
    from wids.storage import Source

    raw = tar_fixture.read_bytes()
    try:
        _, plain, _ = scan_shard(Source(str(tar_fixture)))
    except WidsError:
        pytest.skip("not a shard wids indexes as a plain tar either")
    one = subprocess.run([_zstd(), "-c", "-q"], input=raw, capture_output=True, check=True).stdout
    frames = _chunked_zstd(raw, 1000)
    for name, data, spacing in (("one", one, 1), ("frames", frames, 1), ("merged", frames, 2500)):
        path = tmp_path / f"{name}.tar.zst"
        path.write_bytes(data)
        _, members, _ = scan_shard(Source(str(path)), seek_spacing=spacing)
        assert members.to_columns() == plain.to_columns(), name
        points = members.seek
        assert points is not None and points.uncompressed_size == len(raw)
        assert points.seekable == (name != "one" and len(raw) > spacing)
        if not points.seekable:
            continue
        for i in range(len(members)):
            for _, offset, size in members.members(i):
                start, stop = offset - 512, offset + size  # with its header
                c0, c1 = CODEC.compressed_range(points, start, stop)
                assert CODEC.decode(points, data[c0:c1], start, stop) == raw[start:stop]
