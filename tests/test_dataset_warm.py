"""An iteration's first shards are fetched by the process that iterates the sampler.

A wids sampler tells its dataset the first window of each iteration at the first index asked
of it (``ShardListDataset._plan_begins``): under a DataLoader, in the main process right after
the workers were started. With a cache the dataset fetches the shards that window reads most
of, while the workers start. Shards and index on nginx; real DataLoader workers under fork,
forkserver and spawn; samples checked against ``tarfile``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from tar_oracle import dataset_samples, strip_meta

from wids import ChunkedSampler, ShardListDataset, build_index
from wids.cache import ShardCache
from wids.synth import write_dataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, get_worker_info  # noqa: E402

NS, NSAMPLES, BATCH = 4, 200, 8  # a batch reads 1/25 of a shard: a worker reads its first by range


@pytest.fixture(scope="module")
def remote(http_server, tmp_path_factory):
    src = tmp_path_factory.mktemp("warm-src")
    paths = write_dataset(
        str(src), shards=NS, samples_per_shard=NSAMPLES, real_images=False, prefix="wm"
    )
    build_index(paths, str(src / "train.json"), name="train")
    for root, _, files in os.walk(src):
        for name in files:
            path = os.path.join(root, name)
            http_server.put(path, "warm/" + os.path.relpath(path, src))
    urls = [http_server.url("warm/" + os.path.basename(p)) for p in paths]
    return {
        "paths": paths,
        "urls": urls,
        "index": http_server.url("warm/train.json"),
        "oracle": dataset_samples(paths),
        "bytes": sum(os.path.getsize(p) for p in paths),
    }


def _wait_cached(cache_dir, urls, timeout=20.0):
    cache = ShardCache(str(cache_dir))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(cache.contains(u) for u in urls):
            return True
        time.sleep(0.02)
    return False


def _shard_traffic(http_server):
    """Body bytes the shards' answers carried since the last reset (not the index's)."""
    lines = http_server._lines()
    return sum(int(ln.rsplit(" ", 1)[-1]) for ln in lines if ln.split(" ", 1)[0].endswith(".tar"))


def test_iterating_the_sampler_fetches_the_first_shards_into_the_cache(remote, tmp_path):
    """Nothing is read with ``ds[i]``: the sampler's first index alone starts the downloads
    (on the old code nothing reached the cache before a read)."""
    ds = ShardListDataset(remote["index"], cache_dir=tmp_path, transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=1)
    iteration = iter(sampler)
    first = next(iteration)
    assert 0 <= first < NS * NSAMPLES
    # the window covers the whole epoch here: every shard is read whole, first ones first
    assert _wait_cached(tmp_path, remote["urls"])
    assert ds.stats.samples == 0
    # fetching for others does not make it a reader: the budget's shares per reader would
    # count it (with 2 workers on a budget of 2 shards each, their promotions stopped)
    count = "import sys, wids.cache as c; print(c.ShardCache(sys.argv[1]).marked_readers())"
    out = subprocess.run(
        [sys.executable, "-c", count, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "0"
    ds.close()


def test_a_dropped_or_finished_iteration_warms_nothing_more(remote, tmp_path):
    """The warm-up belongs to its iteration: one dropped at once fetches at most the shard
    it had started; one read to its end (here, with every shard read by range) leaves no
    download running after it."""
    ds = ShardListDataset(remote["index"], cache_dir=tmp_path, transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=1)
    next(iter(sampler))  # the iterator is dropped here
    time.sleep(1.0)
    assert len(ShardCache(str(tmp_path)).entries()) <= 1
    ds.close()


def test_range_access_and_a_plain_sampler_fetch_nothing(remote, tmp_path, http_server):
    ds = ShardListDataset(remote["index"], access="range", cache_dir=tmp_path, transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=1)
    len(ds)
    http_server.reset_counts()
    next(iter(sampler))
    time.sleep(0.3)
    assert http_server.request_count() == 0
    assert not ShardCache(str(tmp_path)).entries()


def _first_batch_cached(batch):
    """Collate in the worker: the samples, and whether this worker's reads so far all came
    from the cache (its pool's counters)."""
    info = get_worker_info()
    counts = info.dataset._pool.counts
    return batch, counts["cache_hits"] == counts["samples"]


@pytest.mark.parametrize("ctx", ["fork", "forkserver", "spawn"])
def test_workers_read_the_shards_the_main_process_fetched(remote, tmp_path, http_server, ctx):
    """Under forkserver and spawn the workers import torch (~1 s) while the main process
    fetches the first shards: their first batches come from the cache (on the old code they
    were read by range). Under every start method nothing is fetched twice."""
    ds = ShardListDataset(remote["index"], cache_dir=tmp_path, transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=2, num_workers=2, batch_size=BATCH)
    len(ds)
    http_server.reset_counts()
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=2,
        collate_fn=_first_batch_cached,
        multiprocessing_context=ctx,
    )
    got = list(loader)
    traffic = _shard_traffic(http_server)
    samples = [s for batch, _ in got for s in batch]
    sampler.set_epoch(0)
    assert [s["__index__"] for s in samples] == [int(i) for i in sampler]
    for s in samples:
        assert strip_meta(s) == remote["oracle"][s["__index__"]]
    if ctx != "fork":  # forked workers start before the sampler's first index is asked for
        assert all(cached for _, cached in got[:2])
    assert traffic <= 1.1 * remote["bytes"]
