"""TarWriter/ShardWriter ``compress="zstd"``: seekable .tar.zst that GNU tar, ``zstd -d``,
tarfile and webdataset read as an ordinary .tar.zst; the member table and the frame table the
writer records are what the decompressed tar and its seek table say."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from tar_oracle import tar_samples
from tarfixtures import require_gnu_tar, tarfile_members
from test_writer import mixed_samples, webdataset_read

zstandard = pytest.importorskip("zstandard")

from wids.compress.zstdframes import FOOTER_SIZE, parse_footer, parse_seek_table  # noqa: E402
from wids.shardwriter import ShardWriter, default_index  # noqa: E402
from wids.writer import TarWriter  # noqa: E402


def _zstd() -> str:
    path = shutil.which("zstd")
    if path is None:
        pytest.skip("zstd is not installed (apt-get install zstd)")
    return path


def _unzstd(path: Path) -> bytes:
    return subprocess.run([_zstd(), "-dc", str(path)], capture_output=True, check=True).stdout


def _samples_of(path: Path) -> list[dict]:
    """tarfile's samples of the tar inside a .tar.zst, decompressed by the zstd binary."""
    plain = path.with_name(path.name + ".plain.tar")
    plain.write_bytes(_unzstd(path))
    return tar_samples(str(plain))


def _write(path: Path, samples: list[dict], **kw: object) -> TarWriter:
    with TarWriter(str(path), compress="zstd", **kw) as w:  # type: ignore[arg-type]
        for s in samples:
            w.write(s)
    return w


@pytest.mark.parametrize("per_frame", [1, 3])
def test_frames_start_at_samples_and_tools_read_the_tar(tmp_path: Path, per_frame: int) -> None:
    zpath = tmp_path / "a.tar.zst"
    w = _write(zpath, mixed_samples(), samples_per_frame=per_frame)
    plain = tmp_path / "plain.tar"
    _write_plain(plain, mixed_samples())
    tar = _unzstd(zpath)
    assert tar == plain.read_bytes()  # the same tar, byte for byte, inside the frames
    # the member table is the decompressed tar's, as tarfile reads it
    recorded = w.members()
    rows = tarfile_members(tar)
    assert [r[:3] for r in rows] == [
        (recorded.key(i) + f, off, size)
        for i in range(len(recorded))
        for f, off, size in recorded.members(i)
    ]
    # a frame starts at the first header of every per_frame-th sample; the table on disk is the
    # writer's
    data = zpath.read_bytes()
    parsed = parse_footer(data[-FOOTER_SIZE:])
    assert parsed is not None
    table = parse_seek_table(data[-parsed[0] :], len(data))
    assert np.array_equal(table.content, w.seek_table().content)
    assert np.array_equal(table.compressed, w.seek_table().compressed)
    firsts = _sample_header_offsets(rows, recorded)
    ends = [len(tar) - 1024] if len(firsts) % per_frame == 0 else []  # the end blocks' own frame
    assert table.content.tolist() == firsts[::per_frame] + ends + [len(tar)]
    # GNU tar extracts it with --zstd
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run([require_gnu_tar(), "--zstd", "-xf", str(zpath), "-C", str(out)], check=True)
    for name, _, size, kind, _ in rows:
        if kind == "0":
            assert (out / name).stat().st_size == size


def _write_plain(path: Path, samples: list[dict]) -> None:
    with TarWriter(str(path)) as w:
        for s in samples:
            w.write(s)


def _sample_header_offsets(rows: list, recorded: object) -> list[int]:
    starts = recorded.sample_start  # type: ignore[attr-defined]
    return [int(rows[int(s)][4]) for s in starts[:-1]]


def test_each_sample_reads_from_its_own_frame(tmp_path: Path) -> None:
    zpath = tmp_path / "a.tar.zst"
    w = _write(zpath, mixed_samples())
    data = zpath.read_bytes()
    table = w.seek_table()
    members = w.members()
    expected = _samples_of(zpath)
    for i in range(len(members)):
        start, stop = members.span(i)
        first, last = table.frames(start, stop)
        assert last == first + 1 == i + 1  # one frame per sample
        c0, c1, u0 = table.span(start, stop)
        content = table.decode(data[c0:c1], first, last)
        got = {f: content[o - u0 : o - u0 + n] for f, o, n in members.members(i)}
        assert got == {k: v for k, v in expected[i].items() if k != "__key__"}


def test_webdataset_reads_it_through_a_zstd_pipe(tmp_path: Path) -> None:
    zpath = tmp_path / "a.tar.zst"
    _write(zpath, mixed_samples())
    _zstd()
    want = [
        {
            k if k == "__key__" else k[1:]: v if k == "__key__" else hashlib.sha1(v).hexdigest()
            for k, v in s.items()
        }
        for s in _samples_of(zpath)
    ]
    assert webdataset_read([f"pipe:zstd -dc {zpath}"]) == want


def test_tarfile_streams_it(tmp_path: Path) -> None:
    zpath = tmp_path / "a.tar.zst"
    _write(zpath, mixed_samples())
    with zpath.open("rb") as f:
        stream = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            names = [m.name for m in tf]
    assert names == [r[0] for r in tarfile_members(_unzstd(zpath))]


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'gzip'"):
        TarWriter(io.BytesIO(), compress="gzip")
    with pytest.raises(ValueError, match="samples_per_frame"):
        TarWriter(io.BytesIO(), compress="zstd", samples_per_frame=0)
    with pytest.raises(ValueError, match="level"):
        TarWriter(io.BytesIO(), compress="zstd", level=99)
    with pytest.raises(ValueError, match="level"):
        ShardWriter(str(tmp_path / "s-%03d.tar.zst"), compress="zstd", level=99)


def test_md5_is_of_the_compressed_file(tmp_path: Path) -> None:
    zpath = tmp_path / "a.tar.zst"
    w = _write(zpath, mixed_samples())
    assert w.md5 == hashlib.md5(zpath.read_bytes()).hexdigest()
    assert w.stat.size == zpath.stat().st_size


def test_shardwriter_writes_seekable_shards(tmp_path: Path) -> None:
    pattern = str(tmp_path / "train-%03d.tar.zst")
    assert default_index(pattern) == str(tmp_path / "train.json")
    samples = [{"__key__": f"{i:05d}", "txt": f"sample {i} " * 40, "cls": i} for i in range(25)]
    with ShardWriter(pattern, maxcount=10, compress="zstd", index=False) as sink:
        for s in samples:
            sink.write(s)
    names = sorted(p.name for p in tmp_path.glob("train-*.tar.zst"))
    assert names == ["train-000.tar.zst", "train-001.tar.zst", "train-002.tar.zst"]
    got = [s["__key__"] for n in names for s in _samples_of(tmp_path / n)]
    assert got == [s["__key__"] for s in samples]
    data = (tmp_path / names[0]).read_bytes()
    parsed = parse_footer(data[-FOOTER_SIZE:])
    assert parsed is not None
    assert len(parse_seek_table(data[-parsed[0] :], len(data))) == 11  # 10 samples + the end


@pytest.mark.parametrize("index", ["x.sqlite", "x.widx"])
def test_sqlite_and_table_indexes_record_the_seek_points(tmp_path: Path, index: str) -> None:
    from wids import ShardListDataset
    from wids.index import open_index

    samples = [{"__key__": f"{i:04d}", "txt": f"caption {i}", "cls": i} for i in range(30)]
    out = str(tmp_path / index)
    with ShardWriter(
        str(tmp_path / "s-%03d.tar.zst"), maxcount=12, compress="zstd", index=out
    ) as w:
        for s in samples:
            w.write(s)
    ds = ShardListDataset(out)
    assert len(ds) == 30 and [ds[i][".txt"] for i in range(30)] == [s["txt"] for s in samples]
    reader = open_index(out)
    seek = reader.members(2).seek
    assert seek is not None and seek.seekable and len(seek) == 6 + 1
