"""The read plan travels with the indices (``wids.plan``): every loader setting reads ahead.

Shards and the index are served by nginx; DataLoader workers are real processes under fork,
forkserver and spawn. Each test checks the samples against ``tarfile`` (the oracle) and that
the lookahead read batches early (its hits, counted in the worker that read them).
"""

from __future__ import annotations

import os
import pickle
import random
import time

import pytest
from latencyproxy import ProxyProcess
from tar_oracle import dataset_samples, strip_meta

from wids import ChunkedSampler, DistributedChunkedSampler, ShardListDataset, build_index
from wids.plan import STEP, PlannedIndex, plan_of
from wids.synth import write_dataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, get_worker_info  # noqa: E402

NS, NSAMPLES, BATCH = 4, 40, 8
CONTEXTS = ["fork", "forkserver", "spawn"]


@pytest.fixture(scope="module")
def remote(http_server, tmp_path_factory):
    """Shards and their index (with member sidecars) on nginx."""
    src = tmp_path_factory.mktemp("plan-src")
    paths = write_dataset(
        str(src), shards=NS, samples_per_shard=NSAMPLES, real_images=False, prefix="pl"
    )
    index = src / "train.json"
    build_index(paths, str(index), name="train")
    for root, _, files in os.walk(src):
        for name in files:
            path = os.path.join(root, name)
            http_server.put(path, "plan/" + os.path.relpath(path, src))
    url = http_server.url("plan/train.json")
    return {"paths": paths, "index": url, "oracle": dataset_samples(paths)}


def _batch_info(batch):
    """Collate in the worker: the samples, and this process's lookahead hits so far."""
    info = get_worker_info()
    ds = info.dataset if info is not None else None
    ahead = ds._pool._lookahead if ds is not None else None
    return batch, (ahead.hits if ahead is not None else 0)


def _check(remote, got, order=None):
    """The samples are the oracle's; in the sampler's order when ``order`` is given."""
    samples = [s for batch, _ in got for s in batch]
    indices = [s["__index__"] for s in samples]
    if order is not None:
        assert indices == order
    assert sorted(indices) == sorted(set(indices))
    for s in samples:
        assert strip_meta(s) == remote["oracle"][s["__index__"]]
    return indices


def _hits(got):
    return max(h for _, h in got)


# -- the plan itself ------------------------------------------------------------------------------


def test_indices_carry_their_plan_and_equal_the_plain_order(remote):
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=3)
    planned = list(sampler)
    sampler.set_epoch(0)
    plain = list(sampler)
    assert planned == plain and all(type(i) is PlannedIndex for i in planned)
    for k, i in enumerate(planned):
        assert i.position == k
        assert list(i.plan.ahead(k, STEP)) == plain[k : k + STEP][: len(i.plan.ahead(k, STEP))]
    assert plan_of(planned[5:9]) == (planned[5].plan, 5)
    assert plan_of([1, 2]) is None and plan_of([]) is None
    assert pickle.loads(pickle.dumps(planned[:3])) == planned[:3]
    assert pickle.loads(pickle.dumps(planned[3])).position == 3


def test_local_shards_get_plain_indices(tmp_path):
    paths = write_dataset(str(tmp_path), shards=2, samples_per_shard=5, real_images=False)
    build_index(paths, str(tmp_path / "i.json"))
    ds = ShardListDataset(str(tmp_path / "i.json"), transformations=[])
    assert all(type(i) is int for i in ChunkedSampler(ds, chunksize=3))


def test_building_samplers_leaves_the_dataset_alone(remote):
    """On the old code the last sampler built became the dataset's plan (and fork hooks)."""
    ds = ShardListDataset(remote["index"], transformations=[])
    len(ds)
    before = pickle.dumps(ds)
    first = ChunkedSampler(ds, chunksize=10, seed=1)
    DistributedChunkedSampler(ds, num_replicas=2, rank=1, seed=2)
    assert pickle.dumps(ds) == before
    assert "plan" not in vars(ds._pool)
    list(first)  # iterating configures nothing either
    assert pickle.dumps(ds) == before


# -- real DataLoader workers over nginx ------------------------------------------------------


def _loader(ds, sampler, ctx, **kw):
    return DataLoader(
        ds,
        sampler=sampler,
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context=ctx,
        collate_fn=_batch_info,
        **kw,
    )


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_natural_code_reads_ahead_under_every_start_method(remote, ctx):
    """A sampler built without num_workers/batch_size: the old lookahead predicted nothing
    it could use for it under forkserver and spawn (no fork hooks ran)."""
    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=4)
    got = list(_loader(ds, sampler, ctx))
    sampler.set_epoch(0)
    _check(remote, got, [int(i) for i in sampler])
    assert _hits(got) > 0


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_out_of_order_loader_reads_ahead(remote, ctx):
    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=5)
    got = list(_loader(ds, sampler, ctx, in_order=False))
    assert sorted(_check(remote, got)) == list(range(len(ds)))
    assert _hits(got) > 0


def _uneven_workers(batch):
    """Collate taking 0-40 ms by the batch: with ``in_order=False`` workers get uneven turns."""
    time.sleep((int(batch[0]["__index__"]) * 7919 % 5) / 100)
    return _batch_info(batch)


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_out_of_order_loader_reads_no_batch_twice(remote, http_server, ctx):
    """With ``in_order=False`` a batch goes to whichever worker has room. The old lookahead
    read ahead the batches at its stride, another worker was given them and read them again
    (here 1.1-1.3x the in-order loader's requests; 1.2x on the latency bench). Now a batch is
    read ahead by the worker that claimed it and handed to the one given it: no more
    requests than in order (within 5%: the first read of a shard in a process starts at a
    header), the samples exactly the oracle's. Counted by a proxy adding 25 ms per answer."""
    with ProxyProcess(http_server.base, delay=0.025, mbps=1000.0) as proxy:
        ds = ShardListDataset(proxy.url("plan/train.json"), access="range", transformations=[])
        sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=11, num_workers=3, batch_size=4)

        def run(in_order):
            loader = DataLoader(
                ds,
                sampler=sampler,
                batch_size=4,
                num_workers=3,
                multiprocessing_context=ctx,
                collate_fn=_uneven_workers,
                in_order=in_order,
            )
            proxy.settled()
            proxy.reset_counts()
            got = list(loader)
            return got, proxy.settled()

        ordered, baseline = run(True)
        got, counts = run(False)
    assert sorted(_check(remote, got)) == list(range(len(ds)))
    assert sorted(_check(remote, ordered)) == list(range(len(ds)))
    assert counts["requests"] <= 1.05 * baseline["requests"], (counts, baseline)
    assert counts["bytes_out"] <= 1.05 * baseline["bytes_out"], (counts, baseline)
    assert _hits(got) > 0


class _LocalShuffle:
    """A user's sampler over a wids sampler: its indices shuffled in blocks of 16 (a shuffle
    buffer). The indices keep their plan, but batches are not the plan's positions."""

    def __init__(self, inner, plain=False):
        self.inner, self.plain = inner, plain

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        order = [int(i) for i in self.inner] if self.plain else list(self.inner)
        for k in range(0, len(order), 16):
            block = order[k : k + 16]
            random.Random(k).shuffle(block)
            yield from block


def test_batches_off_the_plan_are_not_read_ahead_by_range(remote, http_server):
    """Read ahead at the plan's positions, the batches of a reordering sampler were never
    the ones prefetched: range reads moved 2.4x the bytes of the same order without a plan.
    Now such a batch reads nothing ahead by range (shards are still announced)."""
    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    len(ds)

    def run(plain):
        inner = ChunkedSampler(ds, chunksize=NSAMPLES, seed=12)
        sampler = _LocalShuffle(inner, plain)
        http_server.reset_counts()
        got = list(_loader(ds, sampler, "fork"))
        inner.set_epoch(0)
        _check(remote, got, [int(i) for i in sampler])
        return http_server.counts()[1]

    plain, planned = run(True), run(False)
    assert planned <= 1.05 * plain, (planned, plain)


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_a_second_sampler_over_the_same_dataset_keeps_its_own_plan(remote, ctx):
    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    train = ChunkedSampler(ds, chunksize=NSAMPLES, seed=6)
    valid = ChunkedSampler(ds, num_samples=(NSAMPLES, 3 * NSAMPLES), chunksize=NSAMPLES, seed=7)
    got_valid = list(_loader(ds, valid, ctx))
    got_train = list(_loader(ds, train, ctx))
    train.set_epoch(0)
    valid.set_epoch(0)
    _check(remote, got_train, [int(i) for i in train])
    _check(remote, got_valid, [int(i) for i in valid])
    assert _hits(got_train) > 0 and _hits(got_valid) > 0


def test_two_loaders_taking_turns_in_one_process_keep_their_reads_ahead(remote, http_server):
    """A training and a validation loader over one dataset, read in the main process
    (``num_workers=0``), a batch of each in turn. On the old code the process's one lookahead
    followed whichever iteration came last: each turn dropped the other's prefetches (2x the
    bytes of reading the two one after the other). Each iteration now keeps its own."""
    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    half = NS // 2 * NSAMPLES

    def samplers():
        train = ChunkedSampler(ds, num_samples=(0, half), chunksize=NSAMPLES, seed=13)
        valid = ChunkedSampler(ds, num_samples=(half, len(ds)), chunksize=NSAMPLES, seed=14)
        return train, valid

    def loader(sampler):
        return DataLoader(ds, sampler=sampler, batch_size=BATCH, collate_fn=list)

    def run(turns):
        train, valid = samplers()
        http_server.reset_counts()
        if turns:
            pairs = zip(loader(train), loader(valid), strict=True)
            got = [s for pair in pairs for b in pair for s in b]
        else:
            got = [s for b in [*loader(train), *loader(valid)] for s in b]
        train.set_epoch(0)
        valid.set_epoch(0)
        assert sorted(s["__index__"] for s in got) == sorted([*map(int, train), *map(int, valid)])
        for s in got:
            assert strip_meta(s) == remote["oracle"][s["__index__"]]
        return http_server.counts()[1]

    apart, turns = run(False), run(True)
    assert turns <= 1.1 * apart, (turns, apart)


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_persistent_workers_follow_each_epoch(remote, ctx):
    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=8)
    loader = _loader(ds, sampler, ctx, persistent_workers=True)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        got = list(loader)
        sampler.set_epoch(epoch)
        _check(remote, got, [int(i) for i in sampler])
        assert _hits(got) > 0
    del loader


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_stateful_dataloader_resume_reads_the_rest_ahead(remote, ctx):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds = ShardListDataset(remote["index"], access="range", transformations=[])

    def make():
        sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=9)
        return sampler, stateful.StatefulDataLoader(
            ds,
            sampler=sampler,
            batch_size=BATCH,
            num_workers=2,
            multiprocessing_context=ctx,
            collate_fn=_batch_info,
        )

    sampler, loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it
    sampler2, loader2 = make()
    loader2.load_state_dict(state)
    rest = list(loader2)
    sampler.set_epoch(0)
    _check(remote, head + rest, [int(i) for i in sampler])
    assert _hits(rest) > 0


def test_spawned_workers_do_not_read_the_index_again(remote, http_server):
    """The description and the first member tables go with the pickled dataset: on the old
    code each spawned worker read the index and its first sidecars again."""
    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=10)  # len(ds): the index is read
    http_server.reset_counts()
    got = list(_loader(ds, sampler, "spawn"))
    _check(remote, got)
    assert http_server.request_count("plan/train.json") == 0
    root = os.path.dirname(remote["paths"][0])
    sidecars = os.listdir(os.path.join(root, "train.members"))
    assert len(sidecars) == NS
    for name in sidecars:  # a small index: all fetched with it, by the main process
        assert http_server.request_count(f"plan/train.members/{name}") == 0, name
    assert http_server.request_count() > 0  # the shards were read


def test_the_lookahead_reads_ahead_at_the_stride_it_sees():
    """Which batch a process gets next is the DataLoader's choice: the lookahead reads ahead at
    the distance it saw between its own batches (a wrong guess costs no bytes: siblings claim
    positions, tests/test_dataset_claims.py), always up to ``depth`` batches."""
    import numpy as np

    from wids.dataset.lookahead import Lookahead
    from wids.plan import Plan

    ahead = Lookahead(lambda batch: [], lambda shard, share: False, lambda i: 0, [4096], depth=4)
    plan = Plan(7, 0, np.arange(4096, dtype=np.int64)[::-1].copy())
    ahead.observe(plan, 0, 8)  # the first batch: the workers (here 1) take turns
    assert ahead.stride == 8
    assert [p for p, _ in ahead.upcoming(ahead.depth)] == [8, 16, 24, 32]
    ahead.observe(plan, 32, 8)  # another worker took three batches meanwhile
    assert ahead.stride == 32
    assert [p for p, _ in ahead.upcoming(2)] == [64, 96]
    assert ahead.upcoming(1)[0][1] == plan.order[64:72].tolist()
    ahead.schedule()
    assert sorted(p for _, p in ahead._jobs) == [64, 96, 128, 160]
    ahead.observe(plan, 64, 8)  # its own prefetch (empty here: nothing remote)
    ahead.schedule()
    assert sorted(p for _, p in ahead._jobs) == [96, 128, 160, 192]
    other = Plan(8, 0, plan.order)  # the next iteration: its first batch again
    ahead.observe(other, 8, 8)
    assert ahead.stride == 8 and ahead.plan is other
    assert not any(t == 7 for t, _ in ahead._jobs)  # the old iteration's are dropped
    ahead.close()
