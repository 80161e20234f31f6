"""Large members as seekable files: ``ds.open(i, field)`` and ``ShardListDataset(stream_over=)``.

Shards are real tars written by ``tarfile`` (gnu, pax, ustar), with a member of several MB
among small ones; every read is compared with what ``tarfile`` extracts, locally, over nginx
and over moto (S3), and from DataLoader workers under fork and spawn.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import tarfile
import threading
import time
import uuid
import wave
import zipfile

import pytest
from tarfixtures import write_shard

from wids import (
    CorruptReadError,
    IndexMismatchError,
    MemberFile,
    SampleTooLargeError,
    ShardListDataset,
    ShardNotFoundError,
    build_index,
)
from wids.storage import Store

BIG = 6 << 20  # the large member's size (several read-ahead blocks)
NSAMPLES = 3


def _wav(nframes: int, seed: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(random.Random(seed).randbytes(2 * nframes))
    return buf.getvalue()


def _zip(seed: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k in range(5):
            z.writestr(f"part{k}.bin", random.Random(seed * 10 + k).randbytes(50_000))
    return buf.getvalue()


def _members(big: int = BIG) -> list[tuple[str, bytes]]:
    out = []
    for k in range(NSAMPLES):
        out += [
            (f"sample{k:03d}.json", b'{"k": %d}' % k),
            (f"sample{k:03d}.bin", random.Random(k).randbytes(big + k)),
            (f"sample{k:03d}.wav", _wav(40_000 + k, k)),
            (f"sample{k:03d}.zip", _zip(k)),
        ]
    return out


def _oracle(path) -> dict[tuple[str, str], bytes]:
    """``(key, field) -> bytes`` as ``tarfile`` extracts them."""
    out = {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            key, _, field = m.name.partition(".")
            f = tf.extractfile(m)
            assert f is not None
            out[(key, "." + field)] = f.read()
    return out


@pytest.fixture(scope="module", params=["gnu", "pax", "ustar"])
def shard(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"members-{request.param}")
    path = write_shard(d / "big-000000.tar", _members(), format=request.param)
    build_index([str(path)], str(d / "train.json"))
    return d, path, _oracle(path)


def _upload(server, d) -> tuple[str, str]:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            server.put(p, f"{prefix}/{os.path.relpath(p, d)}")
    return prefix, server.url(f"{prefix}/train.json")


def _check_handle(f: MemberFile, want: bytes) -> None:
    """Reads, seeks and readinto give the bytes ``tarfile`` extracts."""
    assert (f.readable(), f.seekable(), f.writable(), f.size) == (True, True, False, len(want))
    rng = random.Random(len(want))
    for _ in range(6):
        pos, n = rng.randrange(len(want)), rng.choice([1, 511, 4096, 100_000, 3 << 20])
        assert f.seek(pos) == pos
        assert f.read(n) == want[pos : pos + n]
        assert f.tell() == min(len(want), pos + n)
    f.seek(-1000, io.SEEK_END)
    buf = bytearray(4096)
    assert f.readinto(buf) == 1000 and bytes(buf[:1000]) == want[-1000:]
    assert f.read() == b"" and f.readinto(buf) == 0
    f.seek(10)
    f.seek(5, io.SEEK_CUR)
    assert f.read(7) == want[15:22]
    f.seek(0)
    chunks = iter(lambda: f.read(1 << 16), b"")
    assert b"".join(chunks) == want
    with pytest.raises(ValueError, match="negative"):
        f.seek(-1)
    f.seek(0)
    buffered = io.BufferedReader(f, 1 << 16)  # a raw file under a BufferedReader (closes it)
    assert buffered.read() == want


def _check_consumers(ds, oracle) -> None:
    """wave, zipfile and tarfile read members through handles as they would files."""
    for i in range(NSAMPLES):
        key = f"sample{i:03d}"
        _check_handle(ds.open(i, ".bin"), oracle[(key, ".bin")])
        with ds.open(i, ".wav") as f:
            w = wave.open(f)
            w.setpos(20_000)
            got = w.readframes(1000)
            start = 44 + 2 * 20_000
            assert got == oracle[(key, ".wav")][start : start + 2000]
        with ds.open(i, ".zip") as f, zipfile.ZipFile(f) as z:
            want = zipfile.ZipFile(io.BytesIO(oracle[(key, ".zip")]))
            assert {n: z.read(n) for n in z.namelist()} == {
                n: want.read(n) for n in want.namelist()
            }


def test_local_open_equals_tarfile(shard):
    d, _, oracle = shard
    ds = ShardListDataset(str(d / "train.json"), transformations=[])
    _check_consumers(ds, oracle)
    f = ds.open(-1, ".json")
    assert f.read() == oracle[("sample002", ".json")] and f.name == "sample002.json"
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.read()
    with pytest.raises(KeyError, match=r"no field '\.mp4'"):
        ds.open(0, ".mp4")
    with pytest.raises(IndexError):
        ds.open(NSAMPLES, ".bin")


def test_member_in_a_tar_member(tmp_path):
    """A tar inside a shard, read by ``tarfile`` through the handle (it seeks)."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as tf:
        for k in range(4):
            data = random.Random(k).randbytes(300_000)
            info = tarfile.TarInfo(f"x{k}.bin")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    path = write_shard(tmp_path / "t.tar", [("a.tar", inner.getvalue()), ("a.txt", b"hi")])
    build_index([str(path)], str(tmp_path / "t.json"))
    ds = ShardListDataset(str(tmp_path / "t.json"), transformations=[])
    with ds.open(0, ".tar") as f, tarfile.open(fileobj=f) as tf:
        got = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]
    assert got == {f"x{k}.bin": random.Random(k).randbytes(300_000) for k in range(4)}


def test_stream_over_local(shard):
    d, _, oracle = shard
    ds = ShardListDataset(str(d / "train.json"), transformations=[], stream_over=1 << 20)
    s = ds[1]
    assert isinstance(s[".bin"], MemberFile)
    assert s[".bin"].read() == oracle[("sample001", ".bin")]
    for field in (".json", ".wav", ".zip"):
        assert s[field] == oracle[("sample001", field)]
    assert (s["__key__"], s["__index__"], s["__shardindex__"]) == ("sample001", 1, 1)
    batch = ds.__getitems__([2, 0])
    assert [b["__key__"] for b in batch] == ["sample002", "sample000"]
    assert batch[0][".bin"].read() == oracle[("sample002", ".bin")]
    # everything is under the threshold: bytes, as without it
    ds_all = ShardListDataset(str(d / "train.json"), transformations=[], stream_over=BIG * 2)
    assert ds_all[0][".bin"] == oracle[("sample000", ".bin")]
    # decoders decode the small members and leave the handle alone
    decoded = ShardListDataset(str(d / "train.json"), stream_over=1 << 20)[0]
    assert decoded[".json"] == {"k": 0} and isinstance(decoded[".bin"], MemberFile)
    # per field: only .wav as a file, however small; .bin (larger) stays bytes
    per_field = ShardListDataset(str(d / "train.json"), transformations=[], stream_over={".wav": 0})
    s = per_field[1]
    assert isinstance(s[".wav"], MemberFile) and s[".bin"] == oracle[("sample001", ".bin")]
    assert s[".wav"].read() == oracle[("sample001", ".wav")]
    for bad in (-1, True, 1.5, {"wav": 0}, {".wav": -1}):
        with pytest.raises(ValueError, match="stream_over"):
            ShardListDataset(str(d / "train.json"), stream_over=bad)


def test_handles_do_not_count_against_max_sample_bytes(shard):
    d, _, oracle = shard
    index = str(d / "train.json")
    ds = ShardListDataset(index, transformations=[], max_sample_bytes=1 << 20)
    with pytest.raises(SampleTooLargeError, match=r"sample000.*stream_over"):
        ds[0]
    ds = ShardListDataset(index, transformations=[], max_sample_bytes=1 << 20, stream_over=1 << 20)
    assert ds[0][".bin"].read() == oracle[("sample000", ".bin")]
    assert ds.__getitems__([1])[0][".json"] == oracle[("sample001", ".json")]
    # the small members still do: a bound below them is still an error
    ds = ShardListDataset(index, transformations=[], max_sample_bytes=1000, stream_over=1 << 20)
    with pytest.raises(SampleTooLargeError, match="sample000"):
        ds[0]


def test_local_wrong_header_raises(shard):
    d, path, _ = shard
    ds = ShardListDataset(str(d / "train.json"), transformations=[])
    f = ds.open(0, ".bin")
    good = MemberFile(f.source, f.offset, f.size, key="sample000", field=".bin")
    assert good.read(10) == f.read(10)
    wrong = MemberFile(f.source, f.offset, f.size, key="sample009", field=".bin")
    with pytest.raises(IndexMismatchError, match=r"sample009.*'\.bin'"):
        wrong.read(10)
    shifted = MemberFile(f.source, f.offset + 512, f.size, key="sample000", field=".bin")
    with pytest.raises(IndexMismatchError, match="sample000"):
        shifted.read(10)
    missing = MemberFile(Store().source(str(d / "nope.tar")), 512, 10, key="k", field=".bin")
    with pytest.raises(ShardNotFoundError, match=r"nope\.tar"):
        missing.read()


def test_shared_handle_reads_only_the_member_across_threads(shard):
    """A seek in one thread while another is inside a read: the read takes the position
    under the handle's lock (main computed its length before, and read the next member's
    tar header); offsets must be integers; close waits for a read in progress."""
    d, _, oracle = shard
    ds = ShardListDataset(str(d / "train.json"), transformations=[])
    f = ds.open(0, ".bin")
    want = oracle[("sample000", ".bin")]
    f.seek(f.size - 100)
    out: dict[str, bytes] = {}
    f._lock.acquire()  # stands for another thread inside a read or seek
    t = threading.Thread(target=lambda: out.setdefault("r", f.read(100)))
    t.start()
    time.sleep(0.2)
    f.seek(f.size)
    f._lock.release()
    t.join()
    assert out["r"] == b"" and f.tell() == f.size
    for bad in (1.5, "3"):
        with pytest.raises(TypeError):
            f.seek(bad)  # type: ignore[arg-type]
    assert f.tell() == f.size
    f.seek(0)
    chunks: list[tuple[int, bytes]] = []

    def reader() -> None:
        for _ in range(200):
            pos = f.tell()
            chunks.append((pos, f.read(997)))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for th in threads:
        th.start()
    for _ in range(200):
        f.seek(random.randrange(f.size + 10))
    for th in threads:
        th.join()
    assert f.tell() <= f.size
    assert all(len(c) <= 997 and c in want for _, c in chunks)
    f.close()


def test_local_truncated_shard_raises(tmp_path):
    path = write_shard(tmp_path / "s.tar", _members(big=1 << 20))
    build_index([str(path)], str(tmp_path / "s.json"))
    ds = ShardListDataset(str(tmp_path / "s.json"), transformations=[], verify=False)
    f = ds.open(2, ".bin")
    size = os.path.getsize(path)
    with open(path, "r+b") as out:
        out.truncate(f.offset + 100)
    with pytest.raises(IndexMismatchError, match=f"{size}"):
        f.read()


def test_local_member_over_2gib_reads_whole(tmp_path):
    """One pread returns at most about 2 GiB on Linux: read(-1) and readinto read on (sparse)."""
    n = (2 << 30) + 4096
    path = tmp_path / "big-0.tar"
    info = tarfile.TarInfo("v.mp4")
    info.size = n
    with open(path, "wb") as out:
        out.write(info.tobuf(format=tarfile.GNU_FORMAT))
        out.seek(512 + n - 1)
        out.write(b"E")
        out.write(b"\0" * ((512 - n % 512) % 512 + 1024))
    build_index([str(path)], str(tmp_path / "big.json"), md5=False)
    ds = ShardListDataset(str(tmp_path / "big.json"), max_sample_bytes=None, transformations=[])
    with ds.open(0, ".mp4") as f:
        data = f.read(-1)
        assert len(data) == n and data[-1:] == b"E" and f.tell() == n
        del data
        f.seek(0)
        buf = bytearray(n)
        assert f.readinto(buf) == n and buf[-1:] == b"E" and buf[:1] == b"\0"
        del buf


def _remote_ds(server, d, **kw) -> ShardListDataset:
    _, index = _upload(server, d)
    return ShardListDataset(index, transformations=[], storage_options=server.storage_options, **kw)


@pytest.mark.parametrize("server", ["http_server", "s3_server"])
def test_remote_open_equals_tarfile(server, shard, request):
    srv = request.getfixturevalue(server)
    d, _, oracle = shard
    ds = _remote_ds(srv, d)
    _check_consumers(ds, oracle)
    s = _remote_ds(srv, d, stream_over=1 << 20)[2]
    assert (
        s[".bin"].read() == oracle[("sample002", ".bin")]
        and s[".wav"] == oracle[("sample002", ".wav")]
    )


def test_remote_reads_about_what_is_consumed(http_server, shard):
    d, _, oracle = shard
    ds = _remote_ds(http_server, d)
    want = oracle[("sample001", ".bin")]
    before = ds.stats.bytes_read
    consumed = 0
    with ds.open(1, ".bin") as f:
        for pos in (4_000_000, 100_000, 2_500_000):  # the first far from the header
            f.seek(pos)
            for _ in range(16):  # a 1 MB window in a decoder's 64 KiB reads
                chunk = f.read(1 << 16)
                assert chunk == want[f.tell() - len(chunk) : f.tell()]
                consumed += len(chunk)
    moved = ds.stats.bytes_read - before
    assert consumed <= moved <= 2 * consumed + 512, (moved, consumed)
    with ds.open(2, ".bin") as f:  # near the start: the header comes with the first read
        before = ds.stats.requests, ds.stats.bytes_read
        f.seek(1000)
        assert f.read(1 << 20) == oracle[("sample002", ".bin")][1000 : 1000 + (1 << 20)]
        assert ds.stats.requests - before[0] == 1
        assert ds.stats.bytes_read - before[1] == 512 + 1000 + (1 << 20)


def test_access_shard_handles_read_the_cached_copy(http_server, shard, tmp_path):
    """With access="shard" the shard is downloaded once and handles read that copy (main read
    each handle's bytes by range again after downloading the whole shard)."""
    d, path, oracle = shard
    ds = _remote_ds(http_server, d, access="shard", cache_dir=str(tmp_path / "cache"))
    before = ds.stats.bytes_read
    with ds.open(1, ".bin") as f:
        f.seek(100_000)
        assert f.read(1 << 20) == oracle[("sample001", ".bin")][100_000 : 100_000 + (1 << 20)]
        moved = ds.stats.bytes_read - before
        with ds.open(1, ".wav") as g:
            assert g.read() == oracle[("sample001", ".wav")]
        again = pickle.loads(pickle.dumps(f))  # another process's handle reads the storage
        assert again.read(1000) == f.read(1000)
        again.close()
    assert moved == os.path.getsize(path), (moved, os.path.getsize(path))


@pytest.mark.parametrize("server", ["http_server", "s3_server"])
def test_remote_replaced_mid_stream_raises(server, shard, request):
    srv = request.getfixturevalue(server)
    d, path, oracle = shard
    prefix, index = _upload(srv, d)
    ds = ShardListDataset(index, transformations=[], storage_options=srv.storage_options)
    f = ds.open(0, ".bin")
    assert f.read(1000) == oracle[("sample000", ".bin")][:1000]
    data = bytearray(path.read_bytes())
    data[f.offset + 5_000_000] ^= 0xFF  # same size, other bytes: only the version tells
    if server == "http_server":
        time.sleep(1.1)  # nginx's etag is its file's mtime (seconds) and size
    srv.put_bytes(bytes(data), f"{prefix}/{path.name}")
    f.seek(5_000_000)
    with pytest.raises(IndexMismatchError, match=r"sample000.*'\.bin'"):
        f.read(10)


def test_remote_wrong_header_raises(http_server, shard):
    d, _, _ = shard
    from wids import RetryPolicy

    ds = _remote_ds(http_server, d, retry=RetryPolicy(attempts=2, backoff=0.01))
    f = ds.open(0, ".bin")
    wrong = MemberFile(f.source, f.offset, f.size, key="sample001", field=".bin")
    with pytest.raises(CorruptReadError, match=r"sample001.*'\.bin'"):
        wrong.read(10)


def test_pickled_handle_keeps_position_and_version(http_server, shard):
    d, _, oracle = shard
    ds = _remote_ds(http_server, d)
    f = ds.open(1, ".bin")
    f.seek(123_456)
    f.read(10)
    g = pickle.loads(pickle.dumps(f))
    assert g.tell() == 123_466 and g.read(100) == oracle[("sample001", ".bin")][123_466:123_566]
    f.close()
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(f)


class _Handles:
    """A dataset of handles made in the parent: each worker reads the ones it gets."""

    def __init__(self, handles: list[MemberFile]) -> None:
        self.handles = handles

    def __len__(self) -> int:
        return len(self.handles)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        f = self.handles[i]
        f.seek(1000)
        return i, f.read(50_000)


def _as_list(batch):
    return batch


@pytest.mark.parametrize("ctx", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("where", ["local", "http"])
def test_dataloader_workers(ctx, where, shard, request):
    torch = pytest.importorskip("torch")
    d, _, oracle = shard
    if where == "local":
        ds = ShardListDataset(str(d / "train.json"), transformations=[], stream_over=1 << 20)
    else:
        ds = _remote_ds(request.getfixturevalue("http_server"), d, stream_over=1 << 20)
    handles = [ds.open(i, ".bin") for i in range(NSAMPLES)]
    handles[0].read(10)  # the parent has read (and opened its descriptor or connections)
    loader = torch.utils.data.DataLoader(
        _Handles(handles), batch_size=1, num_workers=2, multiprocessing_context=ctx
    )
    got = {int(i): bytes(b[0]) for i, b in loader}
    assert got == {i: oracle[(f"sample{i:03d}", ".bin")][1000:51_000] for i in range(NSAMPLES)}
    # samples with handles come back from workers; the parent reads them
    loader = torch.utils.data.DataLoader(
        ds, batch_size=2, num_workers=2, multiprocessing_context=ctx, collate_fn=_as_list
    )
    for batch in loader:
        for s in batch:
            assert s[".bin"].read() == oracle[(s["__key__"], ".bin")]
            assert s[".json"] == oracle[(s["__key__"], ".json")]


def _video(seconds: int = 20, fps: int = 25) -> bytes:
    """An MPEG-4 video of noise frames (one keyframe a second), made by PyAV itself."""
    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("mpeg4", rate=fps)
        s.width, s.height, s.pix_fmt, s.gop_size = 96, 64, "yuv420p", fps
        for _ in range(seconds * fps):
            img = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def _frame_at(f, seconds: float) -> tuple[float, bytes]:
    av = pytest.importorskip("av")
    with av.open(f) as c:
        st = c.streams.video[0]
        c.seek(int(seconds / st.time_base), stream=st)
        frame = next(c.decode(st))
        return float(frame.pts * st.time_base), frame.to_ndarray(format="rgb24").tobytes()


@pytest.mark.parametrize("where", ["local", "http"])
def test_pyav_seeks_in_a_member(where, tmp_path, request):
    """PyAV (optional: skipped when not installed) decodes a frame mid-video through a handle."""
    video = _video()
    path = write_shard(tmp_path / "v.tar", [("clip.json", b"{}"), ("clip.mp4", video)])
    build_index([str(path)], str(tmp_path / "train.json"))
    if where == "local":
        ds = ShardListDataset(str(tmp_path / "train.json"), stream_over=1 << 16)
    else:
        ds = _remote_ds(request.getfixturevalue("http_server"), tmp_path, stream_over=1 << 16)
    want = _frame_at(io.BytesIO(video), 12.0)
    before = ds.stats.bytes_read
    sample = ds[0]
    with sample[".mp4"] as f:
        assert _frame_at(f, 12.0) == want
    if where == "http":  # the decoder read the index and one second of frames, not the video
        moved = ds.stats.bytes_read - before
        assert moved < len(video) / 2, (moved, len(video))
