"""Compressed shards end to end: indexed, read by seek point or whole, locally and remotely.

Shards are made by GNU ``tar czf`` and by Python's ``tarfile`` (``w:gz``); every sample read
must equal what ``tarfile`` extracts from the same file.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path

import pytest
from compressfixtures import compressible_samples, gnu_tar_czf, tar_oracle, tarfile_gz

from wids import ShardListDataset, build_index
from wids.errors import (
    CompressedDataError,
    IndexFormatError,
    TarFormatError,
)
from wids.index import open_index

pytest.importorskip("indexed_gzip")

SPACING = 64 << 10
N = 120


@pytest.fixture(scope="module")
def gz_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gz")
    tarfile_gz(d / "a.tar.gz", compressible_samples(N, seed=1))
    gnu_tar_czf(d / "b.tgz", compressible_samples(N, seed=2))
    build_index(
        [str(d / "a.tar.gz"), str(d / "b.tgz")], str(d / "train.json"), seek_spacing=SPACING
    )
    return d


def _oracle(d: Path) -> list[dict[str, bytes]]:
    """Samples in index order, from tarfile."""
    out = []
    for name in ("a.tar.gz", "b.tgz"):
        members = tar_oracle(d / name)
        keys = sorted({n.split(".")[0] for n in members})
        for k in keys:
            out.append(
                {"." + n.split(".", 1)[1]: v for n, v in members.items() if n.split(".")[0] == k}
            )
    return out


def _equal(ds: ShardListDataset, oracle: list[dict[str, bytes]]) -> None:
    assert len(ds) == len(oracle)
    for i, want in enumerate(oracle):
        got = {k: v for k, v in ds[i].items() if not k.startswith("__")}
        assert got == want, i


def test_index_records_seek_points_in_a_version_2_sidecar(gz_dir):
    idx = open_index(str(gz_dir / "train.json"))
    for i, info in enumerate(idx.shards):
        members = idx.members(i)
        assert members is not None and members.seek is not None and members.seek.kind == "gzip"
        assert members.seek.compressed_size == info.size == os.path.getsize(info.url)
        assert len(members.seek) > 2  # 64 KiB spacing over ~1 MB of tar
    sidecars = list((gz_dir / "train.members").glob("*.json"))
    assert {json.loads(p.read_bytes())["version"] for p in sidecars} == {2}


@pytest.mark.parametrize("access", ["range", "auto"])
def test_local_reads_equal_tarfile(gz_dir, access):
    ds = ShardListDataset(str(gz_dir / "train.json"), transformations=[], access=access)
    _equal(ds, _oracle(gz_dir))
    # a random read costs about a spacing of compressed bytes, not the shard
    before = ds.stats.bytes_read
    ds[N // 2]
    assert ds.stats.bytes_read - before < 3 * SPACING


def test_access_shard_decompresses_once_into_the_cache(gz_dir, tmp_path):
    cache = tmp_path / "cache"
    ds = ShardListDataset(
        str(gz_dir / "train.json"), transformations=[], access="shard", cache_dir=str(cache)
    )
    _equal(ds, _oracle(gz_dir))
    entries = [p for p in (cache / "data").rglob("*") if p.is_file()]
    assert len(entries) == 2  # one decompressed copy per shard
    sizes = sorted(p.stat().st_size for p in entries)
    idx = open_index(str(gz_dir / "train.json"))
    assert sizes == sorted(idx.members(i).seek.uncompressed_size for i in range(2))  # type: ignore[union-attr]
    ds2 = ShardListDataset(
        str(gz_dir / "train.json"), transformations=[], access="shard", cache_dir=str(cache)
    )
    ds2[3]
    assert ds2.stats.bytes_read == 0  # read from the copy


@pytest.mark.parametrize("ctx", ["fork", "forkserver", "spawn"])
def test_batches_and_dataloader_workers(gz_dir, ctx):
    torch = pytest.importorskip("torch")
    ds = ShardListDataset(str(gz_dir / "train.json"), transformations=[])
    oracle = _oracle(gz_dir)
    batch = ds.__getitems__([5, N + 7, 6, 2 * N - 1])
    assert [{k: v for k, v in s.items() if not k.startswith("__")} for s in batch] == [
        oracle[i] for i in (5, N + 7, 6, 2 * N - 1)
    ]
    loader = torch.utils.data.DataLoader(
        ds, batch_size=8, num_workers=2, collate_fn=list, multiprocessing_context=ctx
    )
    seen = 0
    for samples in loader:
        for s in samples:
            assert s[".txt"] == oracle[s["__index__"]][".txt"]
            seen += 1
    assert seen == len(ds)


def test_open_gives_the_members_bytes(gz_dir):
    ds = ShardListDataset(str(gz_dir / "train.json"), transformations=[])
    oracle = _oracle(gz_dir)
    with ds.open(N + 3, ".bin") as f:
        assert f.read() == oracle[N + 3][".bin"]
    s = ShardListDataset(str(gz_dir / "train.json"), transformations=[], stream_over=100)[4]
    assert s[".txt"].read() == oracle[4][".txt"] and s[".cls"] == oracle[4][".cls"]


@pytest.mark.parametrize("suffix", [".sqlite", ".widx"])
def test_every_index_format_records_seek_points(gz_dir, tmp_path, suffix):
    """SQLite and .widx store the same bytes; their version says so (v1 readers refuse)."""
    out = tmp_path / f"t{suffix}"
    build_index([str(gz_dir / "a.tar.gz"), str(gz_dir / "b.tgz")], str(out), seek_spacing=SPACING)
    json_index, other = open_index(str(gz_dir / "train.json")), open_index(str(out))
    for i in range(2):
        assert other.members(i) == json_index.members(i)  # seek points included
    if suffix == ".sqlite":
        import sqlite3

        with sqlite3.connect(out) as conn:
            assert conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone() == ("2",)
    else:
        import struct

        raw = out.read_bytes()
        _, hoff, hlen = struct.unpack_from("<8sQQ", raw)
        assert json.loads(raw[hoff : hoff + hlen])["version"] == 2
    ds = ShardListDataset(str(out), transformations=[])
    _equal(ds, _oracle(gz_dir))
    plain = tmp_path / f"plain{suffix}"  # without compressed shards: version 1 as before
    from tarfixtures import make_samples, write_shard

    write_shard(tmp_path / "p.tar", make_samples(3))
    build_index([str(tmp_path / "p.tar")], str(plain))
    if suffix == ".sqlite":
        import sqlite3

        with sqlite3.connect(plain) as conn:
            assert conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone() == ("1",)


def test_sidecar_versions_and_seek_points_go_together(gz_dir, tmp_path):
    d = tmp_path / "copy"
    d.mkdir()
    for name in ("a.tar.gz",):
        os.link(gz_dir / name, d / name)
    build_index([str(d / "a.tar.gz")], str(d / "t.json"), seek_spacing=SPACING)
    (sidecar,) = (d / "t.members").glob("*.json")
    doc = json.loads(sidecar.read_bytes())
    for change, match in (
        ({"version": 1}, "cannot have 'seek'"),  # what an old reader would take for a tar
        ({"seek": None}, "must have 'seek'"),
        ({"seek": "!!"}, "not base64"),
        ({"seek": base64.b64encode(b"WIDSSEEK" + bytes(30)).decode()}, "seek points"),
    ):
        sidecar.write_text(json.dumps({**doc, **change}))
        with pytest.raises(IndexFormatError, match=match):
            ShardListDataset(str(d / "t.json"), transformations=[])[0]


def test_truncated_shard_is_a_typed_error_naming_it(tmp_path):
    path = tarfile_gz(tmp_path / "t.tar.gz", compressible_samples(60))
    path.write_bytes(path.read_bytes()[:-3000])
    with pytest.raises(CompressedDataError, match="t.tar.gz") as e:
        build_index([str(path)], str(tmp_path / "t.json"))
    assert isinstance(e.value, TarFormatError) and e.value.offset is not None
    assert not (tmp_path / "t.json").exists()


def test_bad_data_at_a_seek_point_is_a_typed_error_naming_shard_and_offset(tmp_path):
    path = tarfile_gz(tmp_path / "c.tar.gz", compressible_samples(N))
    build_index([str(path)], str(tmp_path / "c.json"), seek_spacing=SPACING, md5=False)
    points = open_index(str(tmp_path / "c.json")).members(0).seek  # type: ignore[union-attr]
    assert points is not None
    k = len(points) // 2
    at = int(points.compressed[k])
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[at - 1 : at + 60] = bytes(61)  # the point's first block: not valid deflate
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime, no md5
    ds = ShardListDataset(str(tmp_path / "c.json"), transformations=[])
    members = open_index(str(tmp_path / "c.json")).members(0)
    starts, _ = members.spans()  # type: ignore[union-attr]
    hit = [i for i in range(len(ds)) if points.cover(int(starts[i]) - 512, int(starts[i]))[0] == k]
    assert hit
    with pytest.raises(CompressedDataError, match="c.tar.gz") as e:
        ds[hit[0]]
    assert e.value.offset is not None and at - 1 <= e.value.offset <= at + 64


def test_cli_index_verify_show_subset(gz_dir, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def wids(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wids", *args], capture_output=True, text=True, env=env
        )

    out = tmp_path / "cli.json"
    r = wids("index", "create", str(gz_dir / "a.tar.gz"), "-o", str(out), "--seek-spacing", "65536")
    assert r.returncode == 0, r.stderr
    r = wids("index", "verify", str(out), "--deep")
    assert r.returncode == 0, r.stdout + r.stderr
    r = wids("show", str(out), "-n", "2")
    assert r.returncode == 0 and "s000001" in r.stdout, r.stderr
    sub = tmp_path / "sub"
    r = wids("subset", str(out), "--to", str(sub), "--samples", "10")
    assert r.returncode == 0, r.stderr
    (index,) = sub.glob("*.json")
    ds = ShardListDataset(str(index), transformations=[])
    oracle = tar_oracle(gz_dir / "a.tar.gz")
    assert len(ds) == N and ds[N - 1][".txt"] == oracle[ds[N - 1]["__key__"] + ".txt"]
    assert open_index(str(index)).members(0).seek is not None  # type: ignore[union-attr]


# -- remote ------------------------------------------------------------------------------------


def _upload(server, d: Path) -> str:
    prefix = f"gz{uuid.uuid4().hex[:8]}"
    for p in d.rglob("*"):
        if p.is_file():
            server.put(str(p), f"{prefix}/{p.relative_to(d)}")
    return server.url(f"{prefix}/train.json")


@pytest.mark.parametrize("server", ["http_server", "s3_server"])
@pytest.mark.parametrize("access", ["range", "shard"])
def test_remote_reads_equal_tarfile(gz_dir, server, access, request, tmp_path):
    srv = request.getfixturevalue(server)
    url = _upload(srv, gz_dir)
    ds = ShardListDataset(
        url,
        transformations=[],
        storage_options=srv.storage_options,
        access=access,
        cache_dir=str(tmp_path / "cache") if access == "shard" else None,
    )
    _equal(ds, _oracle(gz_dir))


def test_remote_index_create_of_a_tar_gz(gz_dir, http_server, tmp_path):
    prefix = f"gzc{uuid.uuid4().hex[:8]}"
    http_server.put(str(gz_dir / "b.tgz"), f"{prefix}/b.tgz")
    out = tmp_path / "remote.json"
    build_index([http_server.url(f"{prefix}/b.tgz")], str(out), seek_spacing=SPACING)
    ds = ShardListDataset(str(out), transformations=[], storage_options=http_server.storage_options)
    oracle = tar_oracle(gz_dir / "b.tgz")
    for i in (0, N // 2, N - 1):
        s = ds[i]
        assert s[".txt"] == oracle[s["__key__"] + ".txt"]
    before = ds.stats.bytes_read
    ds[N // 3]
    assert ds.stats.bytes_read - before < 3 * SPACING + 1024


def test_reads_in_tar_order_fetch_the_shard_about_once(gz_dir):
    """Decoded segments are kept: reading samples in order reads each compressed byte ~once."""
    ds = ShardListDataset(str(gz_dir / "train.json"), transformations=[])
    oracle = _oracle(gz_dir)
    for i in range(N):
        assert ds[i][".bin"] == oracle[i][".bin"]
    size = os.path.getsize(gz_dir / "a.tar.gz")
    assert ds.stats.bytes_read <= 1.5 * size, (ds.stats.bytes_read, size)
    assert ds.stats.requests <= 3 * len(open_index(str(gz_dir / "train.json")).members(0).seek)  # type: ignore[union-attr,arg-type]


@pytest.mark.parametrize("suffix", [".json", ".sqlite", ".widx"])
def test_more_samples_than_the_compressed_size_would_hold(tmp_path, suffix):
    """2,000 samples of 100 bytes gzip to ~15 KB: bounded by the tar's size, not the file's."""
    path = tarfile_gz(tmp_path / "tiny.tar.gz", [(f"{i:06d}.txt", b"x" * 100) for i in range(2000)])
    assert os.path.getsize(path) < 2000 * 512
    out = tmp_path / f"tiny{suffix}"
    build_index([str(path)], str(out))
    ds = ShardListDataset(str(out), transformations=[])
    assert len(ds) == 2000 and ds[1999][".txt"] == b"x" * 100


def test_seek_reader_reads_whole_frames_of_codecs_that_need_them(tmp_path):
    """zstd frames decode only whole: the gzip read-up-to-an-estimate must not apply to them."""
    pytest.importorskip("zstandard")
    import random

    from wids import ShardWriter

    rng = random.Random(0)
    text = b" ".join(b"w%d" % rng.randrange(100) for _ in range(60000))
    pattern = str(tmp_path / "z-%06d.tar.zst")
    with ShardWriter(pattern, compress="zstd", samples_per_frame=4, maxcount=100) as w:
        for i in range(40):
            w.write({"__key__": f"{i:06d}", "txt": text[: 150000 + i], "bin": rng.randbytes(9)})
    (index,) = tmp_path.glob("*.json")
    ds = ShardListDataset(str(index), transformations=[])
    for i in (1, 5, 13, 38):  # a sample ending inside its 4-sample frame
        assert ds[i][".txt"] == text[: 150000 + i]


@pytest.mark.parametrize("n", [1, 5, 60])
@pytest.mark.parametrize("make", [tarfile_gz, gnu_tar_czf], ids=["tarfile", "gnutar"])
def test_small_tar_gz_shards(tmp_path, n, make):
    """indexed_gzip makes no seek point in a file under about 0.5 MB: one at the start is."""
    path = make(tmp_path / "small.tar.gz", compressible_samples(n))
    build_index([str(path)], str(tmp_path / "small.json"))
    points = open_index(str(tmp_path / "small.json")).members(0).seek  # type: ignore[union-attr]
    assert points is not None and len(points) >= 1 and int(points.uncompressed[0]) == 0
    ds = ShardListDataset(str(tmp_path / "small.json"), transformations=[])
    oracle = tar_oracle(path)
    assert len(ds) == n
    for i in range(n):
        s = ds[i]
        assert all(s[f] == oracle[s["__key__"] + f] for f in (".txt", ".bin", ".cls"))


def test_without_the_compressed_extra(gz_dir, tmp_path):
    """Indexing a .tar.gz needs indexed_gzip (the error names the extra); reading does not."""
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'indexed_gzip':\n"
        "            raise ModuleNotFoundError('blocked', name=name)\n"
        "sys.meta_path.insert(0, _Absent())\n"
    )
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), repo])}
    code = (
        "import sys, wids\n"
        "ds = wids.ShardListDataset(sys.argv[1], transformations=[])\n"
        "print(len(ds), ds[7]['.cls'].decode())\n"
        "try:\n"
        "    wids.build_index([sys.argv[2]], sys.argv[3])\n"
        "except ImportError as e:\n"
        "    print('ImportError', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(gz_dir / "train.json"), str(gz_dir / "a.tar.gz"),
         str(tmp_path / "x.json")],
        capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    first, second = out.splitlines()[:2]
    assert first == f"{2 * N} {7 % 7}"
    assert second.startswith("ImportError") and "'compressed' extra" in second, second


def test_batch_reads_check_the_tar_headers_too(gz_dir, tmp_path):
    """An index whose offsets are one block off: ds[i] and batches raise, never other bytes."""
    d = tmp_path / "shifted"
    d.mkdir()
    os.link(gz_dir / "a.tar.gz", d / "a.tar.gz")
    build_index([str(d / "a.tar.gz")], str(d / "t.json"), seek_spacing=SPACING)
    (sidecar,) = (d / "t.members").glob("*.json")
    doc = json.loads(sidecar.read_bytes())
    doc["member_offset"] = [o + 512 for o in doc["member_offset"]]
    sidecar.write_text(json.dumps(doc))
    ds = ShardListDataset(str(d / "t.json"), transformations=[])
    with pytest.raises(CompressedDataError, match="not what the index records"):
        ds[3]
    ds = ShardListDataset(str(d / "t.json"), transformations=[])
    with pytest.raises(CompressedDataError, match="not what the index records"):
        ds.__getitems__([3, 4, 50])


def _windows(points):
    ends = points.window_end.tolist()
    return [points.window_blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


@pytest.mark.parametrize("change", ["uncompressed-1", "uncompressed+1", "windows-rotated"])
def test_seek_points_that_do_not_match_the_shard_never_give_a_wrong_sample(
    gz_dir, tmp_path, change
):
    """Seek points one byte off (or with another point's window): a sample over a point joined
    bytes decoded from two points, its header right and its data shifted (main gave 2 wrong
    samples of 120 for 'uncompressed-1'). Every read is tarfile's bytes or a typed error."""
    from wids.compress import SeekPoints

    d = tmp_path / change
    d.mkdir()
    os.link(gz_dir / "a.tar.gz", d / "a.tar.gz")
    build_index([str(d / "a.tar.gz")], str(d / "t.json"), seek_spacing=SPACING)
    (sidecar,) = (d / "t.members").glob("*.json")
    doc = json.loads(sidecar.read_bytes())
    p = SeekPoints.from_bytes(base64.b64decode(doc["seek"]))
    uncomp, windows = p.uncompressed.copy(), _windows(p)
    if change == "windows-rotated":
        windows = [windows[0], *windows[2:], windows[1]]
    else:
        uncomp[1:] += 1 if change.endswith("+1") else -1
    bad = SeekPoints(
        "gzip", p.compressed_size, p.uncompressed_size, p.compressed, uncomp, p.bits, windows
    )
    doc["seek"] = base64.b64encode(bad.to_bytes()).decode()
    sidecar.write_text(json.dumps(doc))
    want = _oracle(gz_dir)[:N]
    errors = 0
    for order in (range(N), reversed(range(N))):
        ds = ShardListDataset(str(d / "t.json"), transformations=[])
        for i in order:
            try:
                got = ds[i]
            except CompressedDataError as e:
                assert "a.tar.gz" in str(e)
                errors += 1
                continue
            assert {k: v for k, v in got.items() if not k.startswith("__")} == want[i], i
    assert errors


def test_cache_ls_and_verify_mark_a_stale_decompressed_copy(tmp_path):
    """A .tar.gz rewritten and re-indexed: its decompressed copy in the cache is another
    version, and `wids cache ls --index` / `index verify --cache-dir` say so (they looked up
    only the shard's own URL: the '#decompressed' entry was never compared)."""
    import subprocess
    import sys
    import time

    path = tarfile_gz(tmp_path / "s.tar.gz", compressible_samples(20, seed=1))
    index, cache = str(tmp_path / "s.json"), str(tmp_path / "cache")
    build_index([str(path)], index)
    ShardListDataset(index, transformations=[], access="shard", cache_dir=cache)[0]

    def cli(*args: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "wids", *args], capture_output=True, text=True, timeout=120
        )
        assert run.returncode in (0, 1), run.stderr
        return run.stdout

    ls = ["cache", "ls", "--cache-dir", cache, "--index", index]
    assert "#decompressed" in cli(*ls) and "STALE" not in cli(*ls)
    time.sleep(0.05)
    tarfile_gz(path, compressible_samples(20, seed=2))  # other bytes, a new date
    build_index([str(path)], index)
    out = cli(*ls)
    assert "s.tar.gz#decompressed" in out and "STALE" in out, out
    out = cli("index", "verify", index, "--cache-dir", cache)
    assert "STALE-COPY" in out and "#decompressed" in out, out
    # and a dataset decompresses the new version
    ds = ShardListDataset(index, transformations=[], access="shard", cache_dir=cache)
    assert ds[0][".txt"] == tar_oracle(path)[ds[0]["__key__"] + ".txt"]


def test_seek_points_far_apart_are_refused_not_decoded_into_memory(tmp_path):
    """An index keeping only the first seek point of a 70 MB tar: reading its last (small)
    sample decoded the whole tar into memory (main returned it); now a TooLargeError naming
    the shard, past 2x max_sample_bytes + 64 MiB, and the samples near the point still read."""
    import gzip
    import io
    import tarfile

    from wids.compress import SeekPoints
    from wids.errors import TooLargeError

    big = 70 << 20
    path = tmp_path / "far.tar.gz"
    with gzip.open(path, "wb", compresslevel=1) as z, tarfile.open(fileobj=z, mode="w|") as tar:
        for name, data in (("a.txt", b"hello"), ("b.bin", bytes(big)), ("c.txt", b"hello")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    build_index([str(path)], str(tmp_path / "t.json"))
    (sidecar,) = (tmp_path / "t.members").glob("*.json")
    doc = json.loads(sidecar.read_bytes())
    p = SeekPoints.from_bytes(base64.b64decode(doc["seek"]))
    assert len(p) > 2
    one = SeekPoints(
        "gzip", p.compressed_size, p.uncompressed_size, p.compressed[:1], p.uncompressed[:1],
        p.bits[:1], _windows(p)[:1],
    )  # fmt: skip
    doc["seek"] = base64.b64encode(one.to_bytes()).decode()
    sidecar.write_text(json.dumps(doc))
    ds = ShardListDataset(str(tmp_path / "t.json"), transformations=[], max_sample_bytes=1 << 20)
    assert ds[0][".txt"] == b"hello"
    with pytest.raises(TooLargeError, match="far.tar.gz") as e:
        ds[2]
    assert "seek point" in str(e.value)


def _fields(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k not in ("__url__", "__shard__")}


def test_every_tar_format_gzipped_reads_as_the_plain_tar(tar_fixture, tmp_path):
    """Every fixture archive (tarfile and GNU tar; ustar, gnu, pax, v7; long and non-ASCII
    names, links, empty members, base-256 sizes), gzipped whole and as gzip members of 1000
    bytes (cut mid-header and mid-member): every sample equals the plain tar's (whose reads
    equal tarfile's, tests/test_tar.py), by seek point and decompressed whole."""
    import gzip

    from wids.errors import WidsError

    raw = tar_fixture.read_bytes()
    try:
        build_index([str(tar_fixture)], str(tmp_path / "plain.json"))
    except WidsError:
        pytest.skip("not a shard wids indexes as a plain tar either")
    plain = ShardListDataset(str(tmp_path / "plain.json"), transformations=[])
    want = [_fields(plain[i]) for i in range(len(plain))]
    parts = b"".join(gzip.compress(raw[k : k + 1000], mtime=0) for k in range(0, len(raw), 1000))
    for name, data in (("one", gzip.compress(raw, mtime=0)), ("parts", parts)):
        path = tmp_path / f"{name}.tar.gz"
        path.write_bytes(data)
        build_index([str(path)], str(tmp_path / f"{name}.json"))
        for access in ("range", "shard"):
            ds = ShardListDataset(
                str(tmp_path / f"{name}.json"),
                transformations=[],
                access=access,
                cache_dir=str(tmp_path / "cache"),
            )
            got = [_fields(ds[i]) for i in range(len(ds))]
            assert got == want, (name, access)


def test_remote_index_create_of_a_bad_tar_gz_leaves_no_temporary_copy(
    http_server, tmp_path, monkeypatch
):
    """A remote .tar.gz is indexed from a temporary local copy (as large as the file): a
    truncated one is a CompressedDataError naming its URL, and the copy is gone."""
    import tempfile

    path = tarfile_gz(tmp_path / "cut.tar.gz", compressible_samples(60))
    path.write_bytes(path.read_bytes()[:-3000])
    prefix = f"gzcut{uuid.uuid4().hex[:8]}"
    http_server.put(str(path), f"{prefix}/cut.tar.gz")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the copy goes
    with pytest.raises(CompressedDataError, match="cut.tar.gz"):
        build_index(
            [http_server.url(f"{prefix}/cut.tar.gz")],
            str(tmp_path / "cut.json"),
            storage_options=http_server.storage_options,
        )
    assert list(scratch.iterdir()) == []
    assert not (tmp_path / "cut.json").exists()


@pytest.mark.parametrize("window", [b"xx", "40000 zeros"])
def test_a_bad_stored_window_is_an_index_error_naming_the_shard(gz_dir, tmp_path, window):
    """A window that does not inflate, or inflates past 32 KiB: IndexFormatError naming the
    shard (main raised it without any shard: 'seek point 1: its window does not inflate')."""
    import zlib

    from wids.compress import SeekPoints

    d = tmp_path / "w"
    d.mkdir()
    os.link(gz_dir / "a.tar.gz", d / "a.tar.gz")
    build_index([str(d / "a.tar.gz")], str(d / "t.json"), seek_spacing=SPACING)
    (sidecar,) = (d / "t.members").glob("*.json")
    doc = json.loads(sidecar.read_bytes())
    p = SeekPoints.from_bytes(base64.b64decode(doc["seek"]))
    bad_window = window if isinstance(window, bytes) else zlib.compress(bytes(40000))
    windows = [_windows(p)[0]] + [bad_window] * (len(p) - 1)
    bad = SeekPoints(
        "gzip", p.compressed_size, p.uncompressed_size, p.compressed, p.uncompressed, p.bits,
        windows,
    )  # fmt: skip
    doc["seek"] = base64.b64encode(bad.to_bytes()).decode()
    sidecar.write_text(json.dumps(doc))
    ds = ShardListDataset(str(d / "t.json"), transformations=[])
    with pytest.raises(IndexFormatError, match="a.tar.gz.*window"):
        ds[N - 1]


def test_subset_of_a_bad_window_names_the_shard(gz_dir, tmp_path):
    """wids subset checks a compressed shard's last header through its seek points: a stored
    window that does not inflate is an error naming the shard (main: 'seek point 23: ...')."""
    import subprocess
    import sys

    from wids.compress import SeekPoints

    d = tmp_path / "w"
    d.mkdir()
    os.link(gz_dir / "a.tar.gz", d / "a.tar.gz")
    build_index([str(d / "a.tar.gz")], str(d / "t.json"), seek_spacing=SPACING)
    (sidecar,) = (d / "t.members").glob("*.json")
    doc = json.loads(sidecar.read_bytes())
    p = SeekPoints.from_bytes(base64.b64decode(doc["seek"]))
    windows = [_windows(p)[0]] + [b"xx"] * (len(p) - 1)
    bad = SeekPoints(
        "gzip", p.compressed_size, p.uncompressed_size, p.compressed, p.uncompressed, p.bits,
        windows,
    )  # fmt: skip
    doc["seek"] = base64.b64encode(bad.to_bytes()).decode()
    sidecar.write_text(json.dumps(doc))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "wids",
            "subset",
            str(d / "t.json"),
            "--to",
            str(d / "sub"),
            "--samples",
            "110",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "a.tar.gz: seek point" in run.stderr and "window" in run.stderr, run.stderr
