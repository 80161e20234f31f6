"""Lookahead prefetch (``wids.dataset.lookahead``): the sampler's plan, prefetched reads."""

from __future__ import annotations

import os
import pickle
import random
import threading

import pytest
from tar_oracle import dataset_samples, strip_meta

from wids import (
    ChunkedSampler,
    DistributedChunkedSampler,
    IndexMismatchError,
    ShardListDataset,
    build_index,
)
from wids.synth import write_dataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, get_worker_info  # noqa: E402

NS, NSAMPLES = 4, 25


@pytest.fixture(scope="module")
def local_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("lookahead")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, real_images=False)
    index = str(d / "train.json")
    build_index(paths, index, name="train")
    return index


@pytest.mark.parametrize("cls", [ChunkedSampler, DistributedChunkedSampler])
def test_a_sampler_offers_its_order_to_the_dataset_it_was_built_from(local_index, cls):
    ds = ShardListDataset(local_index, transformations=[])
    sampler = cls(ds, chunksize=10, seed=3)
    assert ds._pool.plan is sampler
    sampler.set_epoch(2)
    assert list(sampler._planned_order()) == list(sampler)
    state = sampler.state_dict(position=17)
    sampler.load_state_dict(state)
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets
    expected = list(sampler)  # the resumed rest of epoch 2
    assert list(copy._pool.plan._planned_order()) == expected
    assert len(expected) == len(ds) - 17


# -- prefetched reads against nginx, in real DataLoader workers --------------------------------


@pytest.fixture(scope="module")
def remote(http_server, tmp_path_factory):
    """Shards on nginx and a local index naming their HTTP URLs."""
    src = tmp_path_factory.mktemp("la-src")
    paths = write_dataset(
        str(src), shards=NS, samples_per_shard=NSAMPLES, real_images=False, prefix="la"
    )
    urls = [http_server.put(p, f"la/{os.path.basename(p)}") for p in paths]
    index = str(tmp_path_factory.mktemp("la-idx") / "train.json")
    build_index(urls, index, name="train")
    return {"paths": paths, "urls": urls, "index": index, "oracle": dataset_samples(paths)}


def _with_hits(batch):
    """Collate in the worker: the samples, and the worker's lookahead hits so far."""
    info = get_worker_info()
    ds = info.dataset if info is not None else None
    ahead = ds._pool._lookahead if ds is not None else None
    return batch, (ahead.hits if ahead is not None else 0)


def _epoch(ds, sampler, ctx, oracle, workers=2, batch_size=8, **kw):
    loader = DataLoader(
        ds,
        sampler=sampler,
        batch_size=batch_size,
        num_workers=workers,
        multiprocessing_context=ctx if workers else None,
        collate_fn=_with_hits,
        timeout=60 if workers else 0,
        **kw,
    )
    seen, hits = [], 0
    for batch, worker_hits in loader:
        for s in batch:
            assert strip_meta(s) == oracle[s["__index__"]], s["__index__"]
            seen.append(s["__index__"])
        hits = max(hits, worker_hits)
    return seen, hits


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_prefetched_epoch_of_chunked_sampler_is_byte_identical(remote, ctx):
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=1, num_workers=2, batch_size=8)
    sampler.set_epoch(1)
    seen, hits = _epoch(ds, sampler, ctx, remote["oracle"])
    assert sorted(seen) == list(range(len(ds)))
    assert seen == list(sampler)  # the sampler's order: nothing reordered by the prefetch
    assert hits > 0  # batches were served from prefetched bytes


@pytest.mark.parametrize("rank", [0, 1])
def test_prefetched_epoch_of_distributed_sampler_is_byte_identical(remote, rank):
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = DistributedChunkedSampler(ds, num_replicas=2, rank=rank, chunksize=7, seed=5)
    seen, hits = _epoch(ds, sampler, "fork", remote["oracle"], batch_size=4)
    assert seen == list(sampler._planned_order(epoch=0)) and len(seen) == len(ds) // 2
    assert hits > 0


def test_resume_predicts_the_rest_of_the_epoch(remote):
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=2)
    sampler.load_state_dict(sampler.state_dict(position=30))
    expected = list(sampler._planned_order())
    seen, hits = _epoch(ds, sampler, "spawn", remote["oracle"])
    assert seen == expected and len(seen) == len(ds) - 30
    assert hits > 0


def test_a_users_own_sampler_turns_the_lookahead_off(remote):
    ds = ShardListDataset(remote["index"], transformations=[])
    ChunkedSampler(ds, chunksize=10, seed=2)  # built, then not used
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    seen, hits = _epoch(ds, order, "fork", remote["oracle"])
    assert seen == order and hits == 0


def _worker_hits(batch):
    """Collate in the worker: the samples, the worker's id and its lookahead hits so far."""
    batch, hits = _with_hits(batch)
    return batch, get_worker_info().id, hits


@pytest.mark.parametrize(("ctx", "auto_epoch"), [("fork", False), ("spawn", True)])
def test_persistent_workers_follow_the_sampler_into_later_epochs(remote, ctx, auto_epoch):
    # the workers keep their copy of the sampler (epoch 0) across epochs; they predict the
    # epochs that follow from the batches they are given
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=2, auto_epoch=auto_epoch)
    loader = DataLoader(
        ds,
        sampler=sampler,
        batch_size=4,
        num_workers=2,
        multiprocessing_context=ctx,
        collate_fn=_worker_hits,
        persistent_workers=True,
        timeout=60,
    )
    hits: dict[int, int] = {}
    for epoch in range(3):
        if not auto_epoch:
            sampler.set_epoch(epoch)
        expected = list(sampler._planned_order())
        before = sum(hits.values())
        seen = []
        for batch, worker, worker_hits in loader:
            for s in batch:
                assert strip_meta(s) == remote["oracle"][s["__index__"]], s["__index__"]
                seen.append(s["__index__"])
            hits[worker] = max(hits.get(worker, 0), worker_hits)
        assert seen == expected and sorted(seen) == list(range(len(ds)))
        assert sum(hits.values()) > before, epoch  # prefetched batches in every epoch
    assert sampler.epoch == (3 if auto_epoch else 2)


def test_main_process_window_bounds_and_close_stops_threads(remote):
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=25, shuffle=False)
    batch_bytes = max(os.path.getsize(p) for p in remote["paths"]) // NSAMPLES * 5
    ds._pool.lookahead_limits = {"max_bytes": 3 * batch_bytes, "max_requests": 3}
    loader = DataLoader(ds, sampler=sampler, batch_size=5, collate_fn=_with_hits)
    it = iter(loader)
    first, _ = next(it)
    ahead = ds._pool._lookahead
    assert ahead is not None and ahead.plan.ok and ahead.max_requests == 3
    seen = [s["__index__"] for s in first]
    for batch, _ in it:
        for s in batch:
            assert strip_meta(s) == remote["oracle"][s["__index__"]]
            seen.append(s["__index__"])
    assert seen == list(range(len(ds)))
    assert ahead.hits > 0
    assert 0 < ahead.peak_bytes <= ahead.max_bytes
    assert ahead.peak_requests <= ahead.max_requests
    assert any(t.name.startswith("wids-lookahead") for t in threading.enumerate())
    ds.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("wids-lookahead")]


def test_a_shard_replaced_after_prefetch_began_never_yields_a_stale_sample(
    remote, http_server, tmp_path
):
    # a copy of the dataset under its own names, so the replacement touches no other test
    urls = [http_server.put(p, f"la-r/{os.path.basename(p)}") for p in remote["paths"]]
    index = str(tmp_path / "train.json")
    build_index(urls, index, name="train")
    ds = ShardListDataset(index, transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, shuffle=False)
    loader = DataLoader(ds, sampler=sampler, batch_size=5, collate_fn=_with_hits)
    it = iter(loader)
    for _ in range(4):  # up to sample 20: the window reaches into shard 1
        next(it)
    replaced = os.path.basename(remote["paths"][1])
    http_server.put(remote["paths"][2], f"la-r/{replaced}")  # other bytes, another etag
    seen = []
    with pytest.raises(IndexMismatchError, match=replaced):
        for batch, _ in it:
            for s in batch:
                assert strip_meta(s) == remote["oracle"][s["__index__"]]  # never the new bytes
                seen.append(s["__index__"])
    assert seen == list(range(20, 20 + len(seen)))
    ds.close()


class _SlowToPlan(ChunkedSampler):
    """A ChunkedSampler whose order, replayed for the lookahead, waits for ``gate`` after the
    first ``free`` indices (those the batch being read is checked against)."""

    def __init__(self, *args, free, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.free = threading.Event(), free

    def _planned_order(self, start=None, epoch=None):
        for k, index in enumerate(super()._planned_order(start, epoch)):
            if k == self.free:
                assert self.gate.wait(60)
            yield index


def test_a_batch_goes_back_before_the_lookahead_plans_the_next(remote):
    # planning walks the sampler's order (a whole epoch the first time): it runs in the
    # lookahead's own thread, so the batch that asked for it is not held back
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = _SlowToPlan(ds, chunksize=25, shuffle=False, free=5)
    loader = DataLoader(ds, sampler=sampler, batch_size=5, collate_fn=lambda b: b)
    it = iter(loader)
    first: list = []
    reader = threading.Thread(target=lambda: first.extend(next(it)), daemon=True)
    reader.start()
    reader.join(20)
    returned = not reader.is_alive()
    sampler.gate.set()  # planning goes on; the rest of the epoch reads as before
    reader.join(60)
    assert returned, "the first batch waited for the lookahead's planning"
    seen = [s["__index__"] for s in first] + [s["__index__"] for b in it for s in b]
    assert seen == list(range(len(ds)))
    assert ds._pool._lookahead.plan.ok
    ds.close()


# -- member tables fetched before the workers start (remote index) -----------------------------


@pytest.fixture(scope="module")
def remote_index(http_server, tmp_path_factory):
    """Shards, index and member sidecars all on nginx: tables are one request each."""
    d = tmp_path_factory.mktemp("la-ri")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, real_images=False)
    build_index(paths, str(d / "train.json"), name="train")  # shards stored relative
    for root, _, files in os.walk(d):
        for f in files:
            http_server.put(
                os.path.join(root, f), f"la-ri/{os.path.relpath(os.path.join(root, f), d)}"
            )
    sidecars = [f"la-ri/train.members/{n}" for n in sorted(os.listdir(d / "train.members"))]
    assert len(sidecars) == NS
    return {"paths": paths, "index": http_server.url("la-ri/train.json"), "sidecars": sidecars}


def _sidecar_requests(http_server, remote_index):
    return [http_server.request_count(s) for s in remote_index["sidecars"]]


@pytest.mark.parametrize("cls", [ChunkedSampler, DistributedChunkedSampler])
def test_forked_workers_inherit_the_tables_the_plan_starts_with(http_server, remote_index, cls):
    oracle = dataset_samples(remote_index["paths"])
    ds = ShardListDataset(remote_index["index"], transformations=[])
    len(ds)
    http_server.reset_counts()
    sampler = cls(ds, chunksize=10, seed=1, num_workers=2, batch_size=8)
    assert _sidecar_requests(http_server, remote_index) == [0] * NS  # no I/O in its constructor
    seen, _ = _epoch(ds, sampler, "fork", oracle)
    # the plan's first shards (here every shard): one request each, in the main process
    assert set(ds._catalog._members) == set(range(NS))
    assert seen == list(sampler._planned_order(epoch=0)) and seen
    # no worker asked for a table again: they inherited them, parsed
    assert _sidecar_requests(http_server, remote_index) == [1] * NS
    ds.close()


def test_spawned_workers_and_a_replaced_shard_after_tables_were_fetched(
    http_server, remote_index, tmp_path
):
    oracle = dataset_samples(remote_index["paths"])
    ds = ShardListDataset(remote_index["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=2, num_workers=2, batch_size=8)
    seen, _ = _epoch(ds, sampler, "spawn", oracle)  # spawned: they fetch their own tables
    assert seen == list(sampler._planned_order(epoch=0))
    # a shard replaced after the main process fetched its table: never read as indexed
    name = f"la-ri/{os.path.basename(remote_index['paths'][0])}"
    ds = ShardListDataset(remote_index["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, shuffle=False, num_workers=2, batch_size=5)
    _epoch(ds, sampler, "fork", oracle, batch_size=5)  # fetched before its workers were forked
    assert 0 in ds._catalog._members
    http_server.put(remote_index["paths"][1], name)  # other bytes, another etag
    try:
        with pytest.raises(Exception, match="not the shard the index describes"):
            _epoch(ds, sampler, "fork", oracle, batch_size=5)
    finally:
        http_server.put(remote_index["paths"][0], name)
    ds.close()


# -- a forked worker reads its first batch before the DataLoader hands it over -----------------


def _first_hits(batch):
    """Collate: the worker's lookahead hits when this batch was read, and the batch."""
    info = get_worker_info()
    ahead = info.dataset._pool._lookahead
    return batch, (ahead.hits if ahead is not None else -1), info.id


def _slow_start(_worker_id):
    import time

    time.sleep(1.0)  # the worker takes its first batch only after this


@pytest.mark.parametrize("loader_batch", [8, 5])
def test_a_forked_worker_prefetches_its_first_batch_before_it_arrives(remote, loader_batch):
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=4, num_workers=2, batch_size=8)
    loader = DataLoader(
        ds,
        sampler=sampler,
        batch_size=loader_batch,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=_first_hits,
        worker_init_fn=_slow_start,
        timeout=60,
    )
    seen, first, last = [], {}, {}
    for batch, hits, worker in loader:
        first.setdefault(worker, hits)
        last[worker] = hits
        for s in batch:
            assert strip_meta(s) == remote["oracle"][s["__index__"]], s["__index__"]
            seen.append(s["__index__"])
    assert seen == list(sampler._planned_order(epoch=0))
    if loader_batch == 8:  # the sampler's batch size: each worker's first batch was read early
        assert first == {0: 1, 1: 1}
    else:  # another batch size: what was read early is dropped, the lookahead goes on
        assert first == {0: 0, 1: 0} and min(last.values()) > 0
    ds.close()


def test_the_first_batch_plans_and_prefetches_the_next_during_its_own_reads(
    remote, http_server, tmp_path
):
    """Behind a store with 0.5 s to the first byte, the batches after the first are prefetched
    while the first batch's own reads are out (they share the lookahead's window, the batch's
    reads first), not after it returned: three batches in about one round trip, not two."""
    import shutil
    import time

    from latencyproxy import LatencyProxy

    delay = 0.5
    index = os.path.dirname(remote["index"])
    with LatencyProxy(http_server.base, delay=delay, mbps=0) as proxy:
        text = open(remote["index"]).read().replace(http_server.base, proxy.base)
        (tmp_path / "train.json").write_text(text)
        shutil.copytree(os.path.join(index, "train.members"), tmp_path / "train.members")
        ds = ShardListDataset(str(tmp_path / "train.json"), transformations=[])
        for s in range(NS):  # every shard's table loaded and first answer checked
            ds[s * NSAMPLES]
        sampler = ChunkedSampler(ds, chunksize=NSAMPLES, shuffle=False)
        loader = DataLoader(ds, sampler=sampler, batch_size=5, collate_fn=lambda b: b)
        it = iter(loader)
        t = time.perf_counter()
        batches = [next(it) for _ in range(3)]
        took = time.perf_counter() - t
        peak = ds._pool._lookahead.peak_requests
        ds.close()
    assert [s["__index__"] for b in batches for s in b] == list(range(15))
    assert took < 1.6 * delay, took  # after the first batch, the next two took another delay
    assert peak <= 32  # the window: the first batch's reads and the prefetches together


def test_a_resumed_forked_worker_prefetches_the_first_batch_it_resumes_with(remote):
    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = DistributedChunkedSampler(
        ds, num_replicas=2, rank=1, chunksize=10, seed=6, num_workers=2, batch_size=4
    )
    sampler.load_state_dict(sampler.state_dict(position=12))
    expected = list(sampler._planned_order())
    loader = DataLoader(
        ds,
        sampler=sampler,
        batch_size=4,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=_first_hits,
        worker_init_fn=_slow_start,
        timeout=60,
    )
    seen, first = [], {}
    for batch, hits, worker in loader:
        first.setdefault(worker, hits)
        for s in batch:
            assert strip_meta(s) == remote["oracle"][s["__index__"]], s["__index__"]
            seen.append(s["__index__"])
    assert seen == expected and len(seen) == len(ds) // 2 - 12
    assert first == {0: 1, 1: 1}  # read early: the resumed position's batches
    ds.close()


def _no_lookahead(batch):
    """Collate: the batch, and whether this worker has no lookahead working or threads."""
    info = get_worker_info()
    threads = [t.name for t in threading.enumerate() if t.name.startswith("wids-lookahead")]
    ahead = info.dataset._pool._lookahead
    return batch, (ahead is None or not ahead.plan.ok) and not threads


def test_forked_workers_over_local_shards_start_no_lookahead(local_index):
    ds = ShardListDataset(local_index, transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=1, num_workers=2, batch_size=5)
    loader = DataLoader(
        ds,
        sampler=sampler,
        batch_size=5,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=_no_lookahead,
        worker_init_fn=_slow_start,
        timeout=60,
    )
    got = list(loader)
    assert [s["__index__"] for b, _ in got for s in b] == list(sampler._planned_order(epoch=0))
    assert all(none for _, none in got)  # read in place: nothing started early either


# -- the early start: one lookahead per worker, tables of the iteration's own start -------------


def _threads_at_first_batch(batch):
    """Collate: the batch, the worker's id, and the wids threads alive in the worker."""
    names = sorted(t.name.rsplit("_", 1)[0] for t in threading.enumerate())
    return batch, get_worker_info().id, [n for n in names if n.startswith("wids-lookahead")]


def test_an_early_worker_start_and_its_first_batch_build_one_lookahead(remote, monkeypatch):
    """The worker's first batch and its early thread both notice the fork at once (the
    DataLoader queues the first batch before the worker starts): one of them resets the
    dataset's per-process state, and one lookahead is built, none left running unowned."""
    import time

    import wids.dataset.lookahead as lookahead_module
    import wids.dataset.pool as pool_module

    made = []  # in each forked worker: its resets and lookaheads (inherited, then its own)
    reset, init = pool_module.ReaderPool.reset_process, lookahead_module.Lookahead.__init__

    def slow_reset(self):
        made.append(("reset", os.getpid()))
        time.sleep(0.02)  # widens the window in which the other thread checks too
        reset(self)

    def counted_init(self, *args, **kwargs):
        made.append(("lookahead", os.getpid()))
        init(self, *args, **kwargs)

    monkeypatch.setattr(pool_module.ReaderPool, "reset_process", slow_reset)
    monkeypatch.setattr(lookahead_module.Lookahead, "__init__", counted_init)

    def collate(batch):
        pid = os.getpid()
        counts = [
            sum(1 for k, p in made if k == kind and p == pid) for kind in ("reset", "lookahead")
        ]
        return (*_threads_at_first_batch(batch), counts)

    ds = ShardListDataset(remote["index"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=10, seed=4, num_workers=2, batch_size=8)
    starts = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        loader = DataLoader(
            ds,
            sampler=sampler,
            batch_size=8,
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=collate,
            timeout=60,
        )
        first = {}
        seen = []
        for batch, worker, threads, counts in loader:
            first.setdefault(worker, (threads, counts))
            for s in batch:
                assert strip_meta(s) == remote["oracle"][s["__index__"]], s["__index__"]
                seen.append(s["__index__"])
        assert seen == list(sampler._planned_order())
        starts += first.values()
    assert len(starts) == 8
    for threads, counts in starts:
        assert counts == [1, 1], starts  # one reset, one lookahead per worker
        assert threads.count("wids-lookahead-plan") <= 1, starts  # no orphaned planner
    ds.close()


@pytest.fixture(scope="module")
def many_tables(http_server, tmp_path_factory):
    """64 shards of 20 samples, index and sidecars on nginx: more than a start fetches."""
    d = tmp_path_factory.mktemp("la-many")
    paths = write_dataset(str(d), shards=64, samples_per_shard=20, real_images=False)
    build_index(paths, str(d / "train.json"), name="train")
    for root, _, files in os.walk(d):
        for f in files:
            http_server.put(
                os.path.join(root, f), f"la-many/{os.path.relpath(os.path.join(root, f), d)}"
            )
    return http_server.url("la-many/train.json")


def test_tables_fetched_before_the_fork_follow_the_sampler_state_of_each_iteration(
    http_server, many_tables
):
    ds = ShardListDataset(many_tables, transformations=[])
    len(ds)
    sampler = ChunkedSampler(ds, chunksize=20, seed=1, num_workers=2, batch_size=8)
    assert not ds._catalog._members  # no I/O in the sampler's constructor
    sampler.set_epoch(5)
    sampler.load_state_dict(sampler.state_dict(position=700))  # a resumed run
    for epoch in (5, 6):
        if epoch == 6:
            sampler.set_epoch(6)  # the next epoch: its own first tables
        first = list(sampler._planned_order())[: 2 * 2 * 8]  # two rounds of two workers
        need = {ds._catalog.locate(i)[1] for i in first}
        loader = DataLoader(
            ds, sampler=sampler, batch_size=8, num_workers=2, multiprocessing_context="fork"
        )
        it = iter(loader)  # forks the workers
        assert need <= set(ds._catalog._members), (epoch, sorted(need))
        batch = next(it)
        assert batch["__index__"].tolist() == first[:8]
        del it
    ds.close()


def test_a_loader_over_another_sampler_reads_nothing_early(remote):
    """A sampler built on the dataset but not given to the loader: its plan is never asked
    for, so no worker starts reading its predicted first batch (nor tables are fetched)."""
    ds = ShardListDataset(remote["index"], transformations=[])
    ChunkedSampler(ds, chunksize=10, seed=4, num_workers=2, batch_size=8)  # unused
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=_threads_at_first_batch,
        worker_init_fn=_slow_start,
        timeout=60,
    )
    first = {}
    seen = []
    for batch, worker, threads in loader:
        first.setdefault(worker, threads)
        seen += [s["__index__"] for s in batch]
    assert seen == list(range(len(ds)))
    for threads in first.values():  # no early thread, no prefetch threads: nothing predicted
        assert "wids-lookahead-early" not in threads and "wids-lookahead" not in threads, first
    ds.close()
