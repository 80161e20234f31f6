"""Offline snapshots of a remote shard table (``*.widx``): a copy of the file, bounded work."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import fsspec
import pytest
from bigindex import SAMPLES, shard_name, write_big_index

from wids import ShardListDataset
from wids.cache import open_snapshot, save_snapshot
from wids.errors import UntrustedLocationError
from wids.index import ShardInfo, TableIndex, TableIndexWriter, open_index

N = 100_000
ROOT = "memory://wids-snap-scale"


@pytest.fixture
def remote(tmp_path: Path):
    path = write_big_index(tmp_path / "big.widx", N, real=(7,))
    fs = fsspec.filesystem("memory")
    for name in ["big.widx", shard_name(7)]:
        with open(tmp_path / name, "rb") as f:
            fs.pipe_file(f"{ROOT}/{name}", f.read())
    yield path
    fs.rm(ROOT.removeprefix("memory://"), recursive=True)


def test_a_remote_table_is_snapshotted_as_a_copy(remote: Path, tmp_path: Path) -> None:
    url = f"{ROOT}/big.widx"
    cache = tmp_path / "cache"
    reader = open_index(url)
    reader.nshards  # noqa: B018 - opened, as the dataset has it, before measuring
    tracemalloc.start()
    try:
        path = save_snapshot(reader, url, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert path is not None and path.endswith(".widx")
    assert Path(path).read_bytes() == remote.read_bytes()
    # The JSON snapshot (the old path) wrote a record per shard: ~60 MB peak here.
    assert peak < 4_000_000 + 2 * os.path.getsize(remote), peak
    mtime = os.stat(path).st_mtime_ns
    assert save_snapshot(reader, url, cache) == path and os.stat(path).st_mtime_ns == mtime
    snap = open_snapshot(url, cache)
    assert isinstance(snap, TableIndex) and snap.nshards == N
    assert snap.shard(7).url == f"{ROOT}/{shard_name(7)}"  # resolved against the remote
    assert snap.members(7) is not None and snap.members(N - 1) is not None


def test_offline_dataset_from_the_table_snapshot(remote: Path, tmp_path: Path) -> None:
    url = f"{ROOT}/big.widx"
    cache = tmp_path / "cache"
    online = ShardListDataset(url, access="shard", cache_dir=cache, transformations=[])
    want = [online[7 * SAMPLES + j] for j in range(SAMPLES)]
    online.close()
    fsspec.filesystem("memory").rm(ROOT.removeprefix("memory://"), recursive=True)
    offline = ShardListDataset(
        url, access="shard", cache_dir=cache, offline=True, transformations=[]
    )
    assert len(offline) == N * SAMPLES
    got = [offline[7 * SAMPLES + j] for j in range(SAMPLES)]
    assert [g[".cls"] for g in got] == [w[".cls"] for w in want]
    offline.close()
    fsspec.filesystem("memory").mkdir(ROOT.removeprefix("memory://"))


def test_a_table_naming_secrets_is_snapshotted_as_json(tmp_path: Path) -> None:
    local = tmp_path / "sec.widx"
    with TableIndexWriter(local) as w:
        w.add_many([ShardInfo("https://h/a.tar?X-Amz-Signature=SECRET", 3, 10240)])
    url = f"{ROOT}-sec/sec.widx"
    fs = fsspec.filesystem("memory")
    fs.pipe_file(url, local.read_bytes())
    try:
        path = save_snapshot(open_index(url), url, tmp_path / "cache")
    finally:
        fs.rm(f"{ROOT}-sec".removeprefix("memory://"), recursive=True)
    assert path is not None and path.endswith(".json")
    for d, _, files in os.walk(tmp_path / "cache"):
        for name in files:
            assert b"SECRET" not in Path(d, name).read_bytes()


def test_the_copy_still_refuses_local_shards_of_a_remote_index(tmp_path: Path) -> None:
    local = tmp_path / "evil.widx"
    with TableIndexWriter(local) as w:
        w.add_many([ShardInfo("/etc/hostname", 1, 1024)])
    url = "http://127.0.0.1:9/evil.widx"  # judged by its URL only: never fetched here
    snap_reader = TableIndex(str(local), origin=url)
    with pytest.raises(UntrustedLocationError):
        snap_reader.shard(0)
    assert TableIndex(str(local), origin=url, allow_local_shards=True).shard(0).url
