"""wids.WorkerStats: every DataLoader worker's ds.stats, gathered from the batches it sends."""

from __future__ import annotations

import pickle

import pytest
from torch.utils.data import DataLoader

from wids import ChunkedSampler, DatasetStats, ShardListDataset, WorkerStats, build_index
from wids.synth import write_dataset


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("workerstats")
    shards = write_dataset(str(d), shards=4, samples_per_shard=25, real_images=False)
    build_index(shards, str(d / "train.json"))
    return str(d / "train.json")


def keys(samples):
    return [s["__key__"] for s in samples]


@pytest.mark.parametrize("ctx", ["fork", "forkserver", "spawn"])
def test_the_workers_counters_add_up_to_the_epoch(index, ctx):
    ds = ShardListDataset(index, transformations=[])
    stats = WorkerStats()
    loader = DataLoader(ds, batch_size=10, num_workers=2, sampler=ChunkedSampler(ds, seed=1),
                        collate_fn=stats.collate(keys), multiprocessing_context=ctx)  # fmt: skip
    batches = list(stats.batches(loader))
    assert sorted(k for b in batches for k in b) == sorted(keys(ds[i] for i in range(100)))
    assert sorted(stats.per_worker) == [0, 1]
    total = stats.total()
    assert total.samples == total.accesses == 100 and total.bytes_read > 0
    assert sum(s.samples for s in stats.per_worker.values()) == 100
    assert ds.stats.samples == 100  # the main process read the 100 above for the oracle only


def test_without_workers_the_datasets_own_counters_count(index):
    ds = ShardListDataset(index, transformations=[])
    stats = WorkerStats()
    loader = DataLoader(ds, batch_size=7, collate_fn=stats.collate(keys))
    assert sum(len(b) for b in stats.batches(loader)) == 100
    assert stats.per_worker == {} and stats.total(ds) == ds.stats and ds.stats.samples == 100


def test_the_default_collate_and_pickling(index):
    ds = ShardListDataset(index, transformations=[lambda s: int(s[".cls"])])
    stats = WorkerStats()
    collate = pickle.loads(pickle.dumps(stats.collate()))  # spawn workers get a copy
    loader = DataLoader(ds, batch_size=50, num_workers=1, collate_fn=collate)
    tensors = list(stats.batches(loader))
    assert [t.shape[0] for t in tensors] == [50, 50] and stats.total().samples == 100


def test_stats_add_field_by_field():
    a = DatasetStats(1, 2, 3, 4, 5, 6, 7, 8)
    assert a + a == DatasetStats(2, 4, 6, 8, 10, 12, 14, 16)
