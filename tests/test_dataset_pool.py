"""The dataset's reader pool: open readers, their bound, and what ``close()`` stops."""

from __future__ import annotations

import gc
import os
import threading
import warnings

import pytest
from tar_oracle import dataset_samples, strip_meta

from wids import ShardListDataset, build_index
from wids.synth import write_dataset

NS, NSAMPLES = 4, 12


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Local shards and a JSON index of them."""
    d = tmp_path_factory.mktemp("pool")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, real_images=False)
    index = str(d / "train.json")
    build_index(paths, index, name="train")
    return {"paths": paths, "index": index, "oracle": dataset_samples(paths)}


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_lru_bounds_open_readers(local):
    ds = ShardListDataset(local["index"], transformations=[], lru_size=2)
    for i in range(0, len(ds), 7):
        ds[i]
        assert len(ds._pool.readers) <= 2
    ds.__getitems__(list(range(0, len(ds), 5)))  # 4 shards in one batch, then trimmed
    assert len(ds._pool.readers) <= 2


def test_lru_size_set_after_construction_bounds_the_pool(local):
    ds = ShardListDataset(local["index"], transformations=[], lru_size=NS)
    ds.lru_size = 1  # a setting of the pool, read and written through the dataset
    assert ds._pool.lru_size == 1
    for i in range(0, len(ds), NSAMPLES):
        ds[i]
        assert len(ds._pool.readers) <= 1  # local shards: none (descriptors are pooled apart)


def test_every_read_path_assembles_the_same_sample(local):
    ds = ShardListDataset(local["index"], transformations=[])
    n = len(ds)
    singles = [ds[i] for i in range(n)]
    assert ds.__getitems__(list(range(n))) == singles
    for i in (0, NSAMPLES - 1, NSAMPLES, n - 1):
        view, j, _ = ds.get_shard(i)
        assert view[j] == singles[i]
    assert [strip_meta(s) for s in singles] == local["oracle"]
    s = singles[NSAMPLES + 1]
    assert (s["__index__"], s["__shardindex__"], s["__dataset__"]) == (NSAMPLES + 1, 1, "train")
    assert s["__shard__"] == local["paths"][1]


def test_close_closes_every_reader_and_stays_usable(local):
    ds = ShardListDataset(local["index"], transformations=[], lru_size=NS)
    ds[0]
    ds.close()  # the first open loads the index; its descriptors are not the pool's
    before = _open_fds()
    for i in range(0, len(ds), NSAMPLES):
        ds[i]
    assert len(_open_fds() - before) == NS  # one descriptor per open local shard
    ds.close()
    assert _open_fds() - before == set()
    assert strip_meta(ds[NSAMPLES]) == local["oracle"][NSAMPLES]
    ds.close()


def test_duplicates_warning_points_at_the_caller(local):
    ds = ShardListDataset(local["index"], transformations=[], duplicates="split")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds[0]
    assert [os.path.basename(w.filename) for w in caught] == [os.path.basename(__file__)]


@pytest.mark.servers
def test_close_stops_every_thread_the_dataset_started(http_server, local, tmp_path):
    urls = [http_server.put(p, f"pool/{os.path.basename(p)}") for p in local["paths"]]
    index = str(tmp_path / "remote.json")
    build_index(urls, index)
    # fsspec's event loop thread and the plain client's download threads (storage/parts.py)
    # are started once per process by the first remote read and download: not the dataset's,
    # so they are running before the count.
    warm = ShardListDataset(index, transformations=[], access="shard", cache_dir=tmp_path / "w")
    warm[0]
    warm.close()
    before = set(threading.enumerate())
    ds = ShardListDataset(
        index, transformations=[], access="auto", cache_dir=tmp_path / "c", promote_share=0.0
    )
    for i in range(len(ds)):  # every shard is promoted by a background fetch
        assert strip_meta(ds[i]) == local["oracle"][i]
    assert ds._pool.promoter is not None  # reads went on by range meanwhile: hits vary
    assert set(threading.enumerate()) - before  # the cache's fetch threads
    ds.close()
    assert set(threading.enumerate()) - before == set()
    assert ds._pool.promoter is None
    assert strip_meta(ds[1]) == local["oracle"][1]  # usable after close
    ds.close()
    assert set(threading.enumerate()) - before == set()


# -- local shards: descriptors in their own pool, not bound by lru_size (issue 12) ------------


def _open_paths() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_local_shards_stay_open_beyond_lru_size(local):
    gc.collect()  # earlier tests' datasets, until collected, hold these files open too
    ds = ShardListDataset(local["index"], transformations=[], lru_size=1)
    for _ in range(3):
        for i in range(0, len(ds), NSAMPLES):  # every shard in turn: each an LRU miss before
            assert strip_meta(ds[i]) == local["oracle"][i]
    assert set(local["paths"]) <= _open_paths()  # reopening costs no open
    assert len(ds._pool.descriptors) == NS
    ds.close()
    assert not set(local["paths"]) & _open_paths()


MANY = 4096

_EMFILE_SCRIPT = """
import os, random, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), hard))
from wids import ShardListDataset
ds = ShardListDataset(sys.argv[1], transformations=[])
rng = random.Random(0)
n = len(ds)
for _ in range(3 * n):
    i = rng.randrange(n)
    assert ds[i]["__key__"] == f"k{i:05d}", i
for _ in range(40):
    batch = [rng.randrange(n) for _ in range(32)]
    assert [s["__key__"] for s in ds.__getitems__(batch)] == [f"k{i:05d}" for i in batch]
kept = len(ds._pool.descriptors)
print(kept, ds._pool.descriptors.capacity, len(os.listdir("/proc/self/fd")))
"""


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """4,096 one-sample local shards and a shard-table index of them."""
    import io
    import tarfile

    d = tmp_path_factory.mktemp("many")
    paths = []
    for i in range(MANY):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            data = b"%d" % i
            info = tarfile.TarInfo(f"k{i:05d}.txt")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        path = str(d / f"s{i:05d}.tar")
        with open(path, "wb") as f:
            f.write(buf.getvalue())
        paths.append(path)
    index = str(d / "many.widx")
    build_index(paths, index, jobs=2)
    return index


@pytest.mark.parametrize("limit", [64, 1024])
def test_random_reads_over_4096_local_shards_stay_within_the_file_limit(many_shards, limit):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _EMFILE_SCRIPT, many_shards, str(limit)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    kept, capacity, open_now = map(int, out.stdout.split())
    assert capacity < limit and kept <= capacity and open_now < limit
    assert kept > capacity // 2 and capacity >= limit // 2  # most of what the limit allows
