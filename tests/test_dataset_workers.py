"""ShardListDataset in real DataLoader worker processes (fork, spawn, forkserver)."""

from __future__ import annotations

import gc
import pickle
import random

import pytest
from tar_oracle import dataset_samples, strip_meta

from wids import CorruptReadError, RetryPolicy, ShardListDataset, build_index
from wids.synth import write_dataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, default_collate  # noqa: E402

NS, NSAMPLES = 4, 25
CONTEXTS = ["fork", "spawn", "forkserver"]


def as_list(batch):
    return batch


def raw_by_index(batches):
    out = {}
    for batch in batches:
        for s in batch:
            out[s["__index__"]] = strip_meta(s)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("workers")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, extra_fields=True)
    index = str(d / "train.json")
    build_index(paths, index, name="train")
    return paths, index, dataset_samples(paths)


def _order(n, seed=0):
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def _loader(ds, ctx, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("collate_fn", as_list)
    return DataLoader(ds, num_workers=2, multiprocessing_context=ctx, sampler=_order(len(ds)), **kw)


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_workers_after_parent_read(data, ctx):
    _, index, oracle = data
    ds = ShardListDataset(index, transformations=[])
    assert strip_meta(ds[3]) == oracle[3]  # the parent has open readers and tables
    ds.__getitems__([0, 30, 99])
    got = raw_by_index(_loader(ds, ctx))
    assert got == dict(enumerate(oracle))
    assert strip_meta(ds[-1]) == oracle[-1]  # the parent still works


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_workers_fresh_dataset(data, ctx):
    _, index, oracle = data
    ds = ShardListDataset(index, transformations=[])
    assert raw_by_index(_loader(ds, ctx)) == dict(enumerate(oracle))


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_scanned_list_of_dicts(data, ctx):
    paths, _, oracle = data
    ds = ShardListDataset([{"url": p, "nsamples": NSAMPLES} for p in paths], transformations=[])
    ds[0]
    assert raw_by_index(_loader(ds, ctx)) == dict(enumerate(oracle))


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_persistent_workers_two_epochs(data, ctx):
    _, index, oracle = data
    ds = ShardListDataset(index, transformations=[])
    ds[0]
    loader = _loader(ds, ctx, persistent_workers=True)
    for _ in range(2):
        assert raw_by_index(loader) == dict(enumerate(oracle))


def test_default_collate_with_decoding(data):
    _, index, _ = data
    ds = ShardListDataset(index, transformations="numpy")
    ds[1]
    loader = DataLoader(ds, batch_size=10, num_workers=2, multiprocessing_context="spawn")
    n = 0
    for batch in loader:
        assert tuple(batch[".jpg"].shape[1:]) == (64, 64, 3)
        assert batch["__dataset__"] == ["train"] * len(batch["__key__"])
        assert batch[".txt.gz"][0].startswith("sample ")
        n += len(batch["__key__"])
    assert n == len(ds)


@pytest.mark.slow
def test_worker_errors_reach_the_parent(data, tmp_path):
    paths, _, _ = data
    ds = ShardListDataset([{"url": str(tmp_path / "gone.tar"), "nsamples": 3}])
    batches = iter(DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn"))
    with pytest.raises(Exception, match="gone.tar"):
        list(batches)
    # Shut the workers down now: a spawn worker still starting would otherwise die later (its
    # parent's semaphores are gone) and torch's SIGCHLD handler would fail the next test.
    del batches
    gc.collect()


def test_wrong_bytes_in_workers_raise_in_the_parent(data, http_server, fault_proxy, tmp_path):
    """Verified remote reads in worker processes: wrong bytes are an error, never a sample."""
    from faultproxy import FaultPlan

    paths, _, oracle = data
    for p in paths:
        http_server.put(p, f"workers-wrong/{p.rsplit('/', 1)[-1]}")
    proxy = fault_proxy(http_server.base)
    urls = [proxy.url(f"workers-wrong/{p.rsplit('/', 1)[-1]}") for p in paths]
    index = str(tmp_path / "remote.json")
    build_index(urls, index)
    policy = RetryPolicy(attempts=2, backoff=0.0, max_backoff=0.0, timeout=5.0)
    ds = ShardListDataset(index, transformations=[], access="range", retry=policy)
    good = list(_loader(ds, "fork"))  # the clean proxy: every sample right
    assert raw_by_index(good) == dict(enumerate(oracle))
    proxy.set_plan(FaultPlan({"wrong": 1}, rate=1.0))
    with pytest.raises(CorruptReadError, match="not the ones asked for"):
        list(_loader(ds, "fork"))


def test_pickle_roundtrip_each_stage(data):
    _, index, oracle = data
    ds = ShardListDataset(index, transformations="PIL")
    stages = [pickle.loads(pickle.dumps(ds))]
    len(ds)
    stages.append(pickle.loads(pickle.dumps(ds)))
    ds[7]
    stages.append(pickle.loads(pickle.dumps(ds)))
    ds.__getitems__([1, 2, 60])
    stages.append(pickle.loads(pickle.dumps(ds)))
    ds.close()
    stages.append(pickle.loads(pickle.dumps(ds)))
    for copy in stages:
        s = copy[8]
        assert s["__key__"] == oracle[8]["__key__"] and s[".jpg"].size == (64, 64)
    batch = default_collate([{"k": s["__dataset__"]} for s in ds.__getitems__([0, 1])])
    assert batch["k"] == ["train", "train"]
