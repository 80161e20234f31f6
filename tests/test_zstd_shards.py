"""Seekable .tar.zst end to end: written by ShardWriter, indexed by ``wids index create``, read
by ``ds[i]`` locally, over nginx and over moto (one range request of a sample's frame), every
sample equal to tarfile's; a single-frame .tar.zst from GNU tar read whole through the cache;
corrupt frames at read time are typed errors naming shard and offset."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest
from tar_oracle import tar_samples
from tarfixtures import require_gnu_tar

pytest.importorskip("zstandard")

from wids import ShardListDataset, ShardWriter, build_index  # noqa: E402
from wids.errors import CompressedDataError, IndexFormatError, TarFormatError  # noqa: E402
from wids.index import open_index  # noqa: E402


def _zstd() -> str:
    path = shutil.which("zstd")
    if path is None:
        pytest.skip("zstd is not installed (apt-get install zstd)")
    return path


def _samples(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(["seek", "frame", "zstd", "tar"]) for _ in range(200 + i))
        out.append(
            {
                "__key__": f"{'long-' * 25 if i % 7 == 3 else ''}{i:05d}",
                "txt": text,
                "bin": rng.randbytes(rng.randrange(0, 3000)),
                "cls": i,
            }
        )
    return out


def _oracle(shards: list[Path], tmp: Path) -> list[dict]:
    """tarfile's samples of the tars inside the shards (decompressed by the zstd binary)."""
    out = []
    for p in shards:
        plain = tmp / (p.name + ".oracle.tar")
        with p.open("rb") as f, plain.open("wb") as g:
            subprocess.run([_zstd(), "-dc"], stdin=f, stdout=g, check=True)
        out += tar_samples(str(plain))
        plain.unlink()
    return out


def _raw(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    d = tmp_path_factory.mktemp("zst")
    os.chmod(d, 0o755)
    with ShardWriter(str(d / "train-%03d.tar.zst"), maxcount=30, compress="zstd") as sink:
        for s in _samples(75):
            sink.write(s)
    shards = sorted(d.glob("train-*.tar.zst"))
    assert len(shards) == 3
    return d, _oracle(shards, tmp_path_factory.mktemp("oracle"))


def test_local_reads_equal_tarfile_and_the_writer_index_is_index_create_s(
    written: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    d, oracle = written
    ds = ShardListDataset(str(d / "train.json"), transformations=[])
    assert len(ds) == len(oracle)
    for i in range(len(ds)):
        assert _raw(ds[i]) == oracle[i]
    rebuilt = tmp_path / "rebuilt.json"
    build_index([str(p) for p in sorted(d.glob("train-*.tar.zst"))], str(rebuilt))
    a, b = open_index(str(d / "train.json")), open_index(str(rebuilt))
    for s in range(3):
        assert a.members(s) == b.members(s)  # offsets and seek points alike
        seek = a.members(s).seek
        assert seek is not None and len(seek) == len(a.members(s)) + 1  # a frame each + the end


def test_one_shard_named_on_its_own_is_a_shard(written: tuple[Path, list[dict]]) -> None:
    """``ShardListDataset("train-000.tar.zst")``, as a ``.tar`` or ``.tar.gz`` is: it was taken
    for an index (NotAnIndexError: not valid JSON)."""
    d, oracle = written
    for shards in (str(d / "train-000.tar.zst"), d / "train-000.tar.zst"):
        ds = ShardListDataset(shards, transformations=[])
        assert [_raw(ds[i]) for i in range(len(ds))] == oracle[:30]


def _upload(server, d: Path) -> str:  # type: ignore[no-untyped-def]
    prefix = f"z{uuid.uuid4().hex[:8]}"
    for p in sorted(d.rglob("*")):
        if p.is_file():
            server.put(str(p), f"{prefix}/{p.relative_to(d)}")
    return server.url(f"{prefix}/train.json")


@pytest.mark.parametrize("server", ["http_server", "s3_server"])
def test_remote_reads_equal_tarfile_one_request_per_sample(
    server: str, written: tuple[Path, list[dict]], request: pytest.FixtureRequest
) -> None:
    srv = request.getfixturevalue(server)
    d, oracle = written
    ds = ShardListDataset(
        _upload(srv, d), transformations=[], storage_options=srv.storage_options, access="range"
    )
    order = list(range(len(oracle)))
    random.Random(1).shuffle(order)
    for i in order[:3]:  # first touches of the three shards
        assert _raw(ds[i]) == oracle[i]
    before = ds.stats.requests
    reader = open_index(str(d / "train.json"))
    frames = {}
    for s in range(3):
        pts = reader.members(s).seek
        bounds = [*map(int, pts.compressed), pts.compressed_size]
        for j in range(len(pts) - 1):
            frames[s * 30 + j] = bounds[j + 1] - bounds[j]
    bytes_before = ds.stats.bytes_read
    for i in order[3:]:
        assert _raw(ds[i]) == oracle[i]
    moved = ds.stats.bytes_read - bytes_before
    assert moved == sum(frames[i] for i in order[3:])  # exactly each sample's frame
    assert ds.stats.requests - before == len(order) - 3  # one request per sample
    ds.close()


def test_gnu_tar_single_frame_is_read_whole_through_the_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"{i:04d}.txt").write_text(f"sample {i} " * (i + 1))
        (src / f"{i:04d}.cls").write_text(str(i))
    shard = tmp_path / "gnu-000.tar.zst"
    _zstd()  # tar --zstd runs it
    names = sorted(os.listdir(src))
    subprocess.run(
        [require_gnu_tar(), "--zstd", "-cf", str(shard), "-C", str(src), *names], check=True
    )
    build_index([str(shard)], str(tmp_path / "gnu.json"))
    members = open_index(str(tmp_path / "gnu.json")).members(0)
    assert members.seek is not None and not members.seek.seekable
    oracle = _oracle([shard], tmp_path)
    cache = tmp_path / "cache"
    ds = ShardListDataset(str(tmp_path / "gnu.json"), transformations=[], cache_dir=str(cache))
    assert [_raw(ds[i]) for i in range(len(ds))] == oracle
    ds2 = ShardListDataset(str(tmp_path / "gnu.json"), transformations=[])  # in memory
    assert [_raw(ds2[i]) for i in range(len(ds2))] == oracle


def test_a_corrupt_frame_is_a_typed_error_naming_shard_and_offset(
    written: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    d, oracle = written
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    index = json.loads((bad / "train.json").read_text())
    pts = open_index(str(bad / "train.json")).members(1).seek
    shard = bad / "train-001.tar.zst"
    raw = bytearray(shard.read_bytes())
    at = int(pts.compressed[5])
    raw[at + 10] ^= 0xFF  # inside frame 5 of shard 1: sample 35
    shard.write_bytes(bytes(raw))
    os.utime(shard, (index["shardlist"][1]["mtime"],) * 2)  # same size and mtime: undetected
    ds = ShardListDataset(str(bad / "train.json"), transformations=[])
    assert _raw(ds[34]) == oracle[34]  # the frame before: fine
    with pytest.raises(CompressedDataError) as info:
        ds[35]
    assert isinstance(info.value, TarFormatError)
    assert "train-001.tar.zst" in str(info.value) and info.value.offset == at


def _as_list(batch: list) -> list:
    return batch


@pytest.mark.parametrize("ctx", ["fork", "forkserver", "spawn"])
def test_dataloader_workers_read_seekable_shards(
    ctx: str,
    written: tuple[Path, list[dict]],
    http_server,  # type: ignore[no-untyped-def]
) -> None:
    torch = pytest.importorskip("torch")
    d, oracle = written
    ds = ShardListDataset(
        _upload(http_server, d), transformations=[], storage_options=http_server.storage_options
    )
    assert _raw(ds[0]) == oracle[0]  # the parent has read (its pins and connections)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=2, multiprocessing_context=ctx, collate_fn=_as_list
    )
    got = {s["__key__"]: _raw(s) for batch in loader for s in batch}
    assert got == {s["__key__"]: s for s in oracle}


def test_small_compressible_samples_are_bounded_by_the_tar_not_the_file(tmp_path: Path) -> None:
    # 500 one-line samples compress to far less than 512 bytes each: the index's sanity bound
    # on nsamples is the tar's size ("tarsize"), not the compressed file's
    pattern = str(tmp_path / "tiny-%03d.tar.zst")
    with ShardWriter(pattern, maxcount=500, compress="zstd") as sink:
        for i in range(500):
            sink.write({"__key__": f"{i:06d}", "txt": "a caption", "cls": i % 3})
    shard = tmp_path / "tiny-000.tar.zst"
    assert shard.stat().st_size < 500 * 512
    entry = json.loads((tmp_path / "tiny.json").read_text())["shardlist"][0]
    assert entry["filesize"] == shard.stat().st_size
    assert entry["tarsize"] == (500 * 2 * 2 + 2) * 512  # a header and a data block per member
    ds = ShardListDataset(str(tmp_path / "tiny.json"))
    assert len(ds) == 500 and ds[499][".txt"] == "a caption" and ds[499][".cls"] == 499 % 3
    build_index([str(shard)], str(tmp_path / "rebuilt.json"))  # a build's worker's sidecar
    rebuilt = json.loads((tmp_path / "rebuilt.json").read_text())["shardlist"][0]
    assert rebuilt["tarsize"] == entry["tarsize"]
    # a description whose tarsize cannot hold its samples is refused, as a filesize would be
    for bad in (512 * 10, None, "big", -1):
        desc = json.loads((tmp_path / "tiny.json").read_text())
        desc["shardlist"][0]["tarsize"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(desc))
        with pytest.raises(IndexFormatError, match="shardlist\\[0\\]"):
            len(ShardListDataset(str(tmp_path / "bad.json")))


def test_the_documented_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "compressed.md").read_text()
    section = doc.split("## Seekable .tar.zst", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/compressed.md", "exec"), scope)
    ds = scope["ds"]
    assert len(ds) == 2500 and ds[1234][".txt"] == "caption 1234"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.tar.zst")) == [
        f"train-{i:06d}.tar.zst" for i in range(3)
    ]


def test_cli_index_verify_show_subset(written: tuple[Path, list[dict]], tmp_path: Path) -> None:
    import sys

    d, oracle = written
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def wids(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wids", *args], capture_output=True, text=True, env=env
        )

    shards = tmp_path / "shards"
    shutil.copytree(d, shards)
    out = tmp_path / "cli.json"
    r = wids("index", "create", *map(str, sorted(shards.glob("*.tar.zst"))), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert [open_index(str(out)).members(s) for s in range(3)] == [
        open_index(str(d / "train.json")).members(s) for s in range(3)
    ]
    r = wids("index", "verify", str(out), "--deep")
    assert r.returncode == 0 and "3 of 3" in r.stdout, r.stdout + r.stderr
    r = wids("show", str(out), "-n", "2")
    assert r.returncode == 0 and "00001" in r.stdout, r.stderr
    sub = tmp_path / "sub"
    r = wids("subset", str(out), "--to", str(sub), "--shards", "1:3")
    assert r.returncode == 0, r.stderr
    ds = ShardListDataset(str(sub / "cli.json"), transformations=[])
    assert [_raw(ds[i]) for i in range(len(ds))] == oracle[30:]
    # a corrupt frame (same size and mtime): --deep names the shard and the frame's byte
    pts = open_index(str(out)).members(2).seek
    shard = shards / "train-002.tar.zst"
    st = shard.stat()
    raw = bytearray(shard.read_bytes())
    raw[int(pts.compressed[4]) + 12] ^= 0xFF
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = wids("index", "verify", str(out), "--deep")
    assert r.returncode != 0 and "train-002.tar.zst" in r.stdout + r.stderr
    assert f"at byte {int(pts.compressed[4])}" in r.stdout + r.stderr


def test_shardwriter_to_s3_and_resume(s3_server) -> None:  # type: ignore[no-untyped-def]
    prefix = f"zw-{uuid.uuid4().hex[:8]}"
    pattern = s3_server.url(f"{prefix}/train-%03d.tar.zst")
    so = s3_server.storage_options
    samples = _samples(25, seed=3)
    with ShardWriter(pattern, maxcount=10, compress="zstd", storage_options=so) as w:
        for s in samples[:15]:
            w.write(s)
    with ShardWriter(pattern, maxcount=10, compress="zstd", storage_options=so, resume=True) as w:
        assert w.total == 15
        for s in samples[15:]:
            w.write(s)
    ds = ShardListDataset(s3_server.url(f"{prefix}/train.json"), storage_options=so)
    assert len(ds) == 25
    for i in (0, 14, 15, 24):
        got = ds[i]
        assert got["__key__"] == samples[i]["__key__"] and got[".bin"] == samples[i]["bin"]
    assert open_index(s3_server.url(f"{prefix}/train.json"), so).members(2).seek is not None


def test_remote_whole_reads_through_the_cache(
    written: tuple[Path, list[dict]],
    http_server,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # a GNU tar single-frame .tar.zst over HTTP, and a seekable one with access="shard": both
    # decompressed once into the cache, then read from it
    d, oracle = written
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"{i:04d}.txt").write_text(f"sample {i} " * (i + 1))
    single = tmp_path / "gnu" / "gnu-000.tar.zst"
    single.parent.mkdir()
    os.chmod(single.parent, 0o755)
    _zstd()  # tar --zstd runs it
    names = sorted(os.listdir(src))
    subprocess.run(
        [require_gnu_tar(), "--zstd", "-cf", str(single), "-C", str(src), *names], check=True
    )
    build_index([str(single)], str(single.parent / "gnu.json"))
    gnu_oracle = _oracle([single], tmp_path)
    gnu_tar = [open_index(str(single.parent / "gnu.json")).members(0).seek.uncompressed_size]
    tars = [open_index(str(d / "train.json")).members(s).seek.uncompressed_size for s in range(3)]
    for url, want, access, sizes in (
        (
            _upload(http_server, single.parent).replace("train.json", "gnu.json"),
            gnu_oracle,
            "auto",
            gnu_tar,
        ),
        (_upload(http_server, d), oracle, "shard", tars),
    ):
        cache = tmp_path / f"cache-{access}"
        ds = ShardListDataset(url, transformations=[], cache_dir=str(cache), access=access)
        assert [_raw(ds[i]) for i in range(len(ds))] == want
        before = ds.stats.requests
        assert [_raw(ds[i]) for i in range(len(ds))] == want
        assert ds.stats.requests == before  # the second pass reads the cache only
        cached = sorted(p.stat().st_size for p in cache.rglob("*") if p.is_file())
        assert set(sizes) <= set(cached)  # the decompressed tars are the cache's entries
        ds.close()


@pytest.mark.parametrize("where", ["local", "http"])
def test_several_samples_per_frame_read_equal_tarfile(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # a frame of 4 samples: a random read fetches the whole frame (its checksum is at its end)
    # and decodes it; every sample equals tarfile's
    d = tmp_path / "pf"
    d.mkdir()
    os.chmod(d, 0o755)
    with ShardWriter(
        str(d / "pf-%03d.tar.zst"), maxcount=40, compress="zstd", samples_per_frame=4
    ) as w:
        rng = random.Random(9)
        for i in range(48):  # frames of ~100 KB compressed: past the reader's 16 KiB slack
            w.write({"__key__": f"{i:04d}", "bin": rng.randbytes(25_000), "txt": f"{i} " * 99})
    oracle = _oracle(sorted(d.glob("pf-*.tar.zst")), tmp_path)
    if where == "local":
        ds = ShardListDataset(str(d / "pf.json"), transformations=[])
    else:
        srv = request.getfixturevalue("http_server")
        url = _upload(srv, d).replace("train.json", "pf.json")
        ds = ShardListDataset(url, transformations=[], storage_options=srv.storage_options)
    order = list(range(len(oracle)))
    random.Random(2).shuffle(order)
    for i in order:
        assert _raw(ds[i]) == oracle[i]
    ds.close()


def test_a_single_frame_read_into_memory_takes_linear_time(tmp_path: Path) -> None:
    """No cache_dir: a one-frame .tar.zst is decompressed into memory. The stream gives a few
    KiB per read (incompressible data: one input step's output), and main grew one bytes
    object by each: 16 MB took 0.55 s, 64 MB 120 s. Now about one decompression's time."""
    import io
    import tarfile
    import time

    import zstandard

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(40):
            data = random.Random(i).randbytes(1 << 20)
            info = tarfile.TarInfo(f"s{i:03d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    zst = subprocess.run([_zstd(), "-1", "-c", "-q"], input=raw, capture_output=True, check=True)
    path = tmp_path / "one.tar.zst"
    path.write_bytes(zst.stdout)
    build_index([str(path)], str(tmp_path / "one.json"))
    t0 = time.perf_counter()
    reference = zstandard.ZstdDecompressor().decompressobj().decompress(zst.stdout)
    t_ref = time.perf_counter() - t0
    assert reference == raw
    ds = ShardListDataset(str(tmp_path / "one.json"), transformations=[])
    t0 = time.perf_counter()
    sample = ds[39]
    took = time.perf_counter() - t0
    assert sample[".bin"] == random.Random(39).randbytes(1 << 20)
    assert took < 1.0 + 20 * t_ref, (took, t_ref)


def test_a_shard_key_pair_names_a_tar_zst_shard(written: tuple[Path, list[dict]]) -> None:
    """``exclude=["train-001.tar.zst/KEY"]`` leaves that sample out, as ``.tar``/``.tar.gz``
    pairs do: it was taken for a bare key (the whole text) and excluded nothing."""
    d, oracle = written
    key = oracle[40]["__key__"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unknown entry warns: it must name the sample
        ds = ShardListDataset(
            str(d / "train.json"), transformations=[], exclude=[f"train-001.tar.zst/{key}"]
        )
        assert len(ds) == len(oracle) - 1
    assert [ds[i]["__key__"] for i in range(len(ds))] == [
        s["__key__"] for s in oracle if s["__key__"] != key
    ]
