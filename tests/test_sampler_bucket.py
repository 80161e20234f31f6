"""The bucketing batch sampler (wids.sampler.bucket): buckets, shard locality, exact lengths.

The order's properties are checked over many shard layouts and world sizes (hypothesis); real
shards are read through real DataLoader workers under fork, forkserver and spawn, locally (the
fast path) and over nginx (the read plan travels with the batches: the lookahead hits).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wids import BucketBatchSampler, ChunkedSampler, ShardListDataset, build_index
from wids.plan import PlannedIndex, plan_of
from wids.synth import write_shard


class Shards:
    """Shard lengths without samples: what the samplers read from ShardListDataset."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return sum(self.lengths)


def shard_of(lengths):
    cuts = np.cumsum([0, *lengths])
    return lambda order: np.searchsorted(cuts, np.asarray(order), "right") - 1


def locality(lengths, order) -> float:
    """The fraction of reads that stay in the shard of the read before."""
    shards = shard_of(lengths)(order)
    return float(np.mean(shards[1:] == shards[:-1]))


def all_ranks(ds, keys, replicas, **kw):
    samplers = [
        BucketBatchSampler(ds, keys, num_replicas=replicas, rank=r, **kw) for r in range(replicas)
    ]
    return samplers, [list(s) for s in samplers]


# -- the order ------------------------------------------------------------------------------------


layouts = st.lists(st.integers(0, 60), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    lengths=layouts,
    replicas=st.integers(1, 4),
    batch=st.integers(1, 7),
    nbuckets=st.integers(1, 4),
    chunksize=st.integers(1, 40),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 3),
)
def test_batches_are_full_homogeneous_and_exact_per_rank(
    lengths, replicas, batch, nbuckets, chunksize, drop_last, shuffle, seed
):
    ds = Shards(lengths)
    n = len(ds)
    keys = np.random.default_rng(seed).integers(0, nbuckets, n).astype(np.float64)
    samplers, got = all_ranks(
        ds,
        keys,
        replicas,
        batch_size=batch,
        boundaries=[b + 0.5 for b in range(nbuckets - 1)],
        chunksize=chunksize,
        drop_last=drop_last,
        shuffle=shuffle,
        seed=seed,
    )
    sizes = np.bincount(keys.astype(int), minlength=nbuckets)
    total = int((sizes // batch).sum())
    length = total // replicas if drop_last else -(-total // replicas)
    assert all(len(s) == length for s in samplers) and [len(g) for g in got] == [length] * replicas
    batches = [b for g in got for b in g]
    assert all(len(b) == batch and len(set(keys[b])) == 1 for b in batches)
    assert all(b == sorted(b) for b in batches)
    # every sample at most once, but the <= R - 1 batches that pad the ranks
    seen = Counter(i for b in batches for i in b)
    repeated = sum(c - 1 for c in seen.values())
    assert repeated == max(0, replicas * length - total) * batch
    # what is left out: each bucket's last partial batch, and the tail that drop_last drops
    dropped = (total - replicas * length) * batch if drop_last else 0
    assert n - len(seen) == int((sizes % batch).sum()) + dropped


@settings(max_examples=40, deadline=None)
@given(lengths=layouts, batch=st.integers(1, 5), chunksize=st.integers(1, 30))
def test_full_batches_of_a_chunk_come_from_its_shard(lengths, batch, chunksize):
    """All batches but the pooled ones (at most one per bucket and chunk) lie in one shard."""
    ds = Shards(lengths)
    keys = np.random.default_rng(1).random(len(ds))
    sampler = BucketBatchSampler(ds, keys, batch_size=batch, num_buckets=3, chunksize=chunksize)
    shard = shard_of(lengths)
    mixed = sum(len(set(shard(b))) > 1 for b in sampler)
    chunks = sum(-(-n // chunksize) for n in lengths)
    assert mixed <= chunks * sampler.num_buckets


def test_locality_is_at_least_nine_tenths_of_the_chunked_samplers():
    """The goal of issue 23 on a realistic layout: 64 shards of 500 samples, 4 aspect ratios."""
    lengths = [500] * 64
    ds = Shards(lengths)
    keys = np.random.default_rng(0).choice([0.75, 1.0, 1.33, 1.78], size=len(ds))
    bucketed = [i for b in BucketBatchSampler(ds, keys, batch_size=32, num_buckets=4) for i in b]
    chunked = list(ChunkedSampler(ds, chunksize=2000))
    ratio = locality(lengths, bucketed) / locality(lengths, chunked)
    assert ratio >= 0.9, ratio


def test_epochs_are_deterministic_from_seed_and_epoch():
    ds = Shards([30, 50, 20])
    keys = np.random.default_rng(2).random(100)
    a = BucketBatchSampler(ds, keys, batch_size=4, num_buckets=3, seed=5)
    b = BucketBatchSampler(ds, keys, batch_size=4, num_buckets=3, seed=5)
    first, second = list(a), list(a)  # a complete pass advances the epoch
    assert first != second and a.epoch == 2
    b.set_epoch(1)
    assert list(b) == second
    other = BucketBatchSampler(ds, keys, batch_size=4, num_buckets=3, seed=6)
    assert list(other) != first
    fixed = BucketBatchSampler(ds, keys, batch_size=4, num_buckets=3, auto_epoch=False)
    assert list(fixed) == list(fixed)


def test_no_shuffle_reads_chunks_in_order():
    ds = Shards([10, 10])
    keys = np.arange(20) % 2
    sampler = BucketBatchSampler(ds, keys, batch_size=5, boundaries=[0.5], shuffle=False)
    assert list(sampler) == [
        [0, 2, 4, 6, 8],
        [1, 3, 5, 7, 9],
        [10, 12, 14, 16, 18],
        [11, 13, 15, 17, 19],
    ]


def test_remainders_pool_by_bucket_and_the_last_partial_ones_are_dropped():
    ds = Shards([6, 6, 6])
    keys = np.array([0, 0, 0, 0, 0, 1] * 3)  # per shard: 5 of bucket 0, 1 of bucket 1
    sampler = BucketBatchSampler(ds, keys, batch_size=4, boundaries=[0.5], shuffle=False)
    batches = list(sampler)
    # each shard: one full batch of bucket 0 (one left over); the leftovers 4, 10, 16 and the
    # bucket-1 samples 5, 11, 17 stay in their pools: three each, fewer than a batch: dropped
    assert batches == [[0, 1, 2, 3], [6, 7, 8, 9], [12, 13, 14, 15]]
    assert sampler.total_batches == 3
    keys = np.array([0, 0, 0, 0, 0, 1] * 4)
    ds = Shards([6] * 4)
    batches = list(BucketBatchSampler(ds, keys, batch_size=4, boundaries=[0.5], shuffle=False))
    # the fourth shard completes both pools: its own batch, then the pooled ones
    assert batches[3:] == [[18, 19, 20, 21], [4, 10, 16, 22], [5, 11, 17, 23]]


def test_boundaries_and_quantile_buckets():
    ds = Shards([8])
    keys = [0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 3.0, 9.0]
    sampler = BucketBatchSampler(ds, keys, batch_size=1, boundaries=[1.0, 2.0])
    assert sampler.buckets.tolist() == [0, 1, 1, 2, 2, 2, 2, 2]  # [1, 2) is bucket 1
    assert sampler.bucket_sizes.tolist() == [1, 2, 5] and sampler.num_buckets == 3
    by_quantile = BucketBatchSampler(ds, keys, batch_size=1, num_buckets=4)
    assert by_quantile.boundaries.tolist() == [1.5, 2.0, 3.0]  # values that occur; ties kept
    assert by_quantile.bucket_sizes.tolist() == [2, 1, 3, 2]
    same = BucketBatchSampler(ds, [1.0] * 8, batch_size=2, num_buckets=4)
    assert same.num_buckets == 1 and len(same) == 4
    with pytest.raises(ValueError):
        sampler.buckets[0] = 1  # read-only


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(keys=[1.0] * 9), ValueError, "one value per sample"),
        (dict(keys=[1.0] * 7 + [float("nan")]), ValueError, "sample 7"),
        (dict(keys=["a"] * 8), TypeError, "numbers"),
        (dict(keys="width"), TypeError, "column"),
        (dict(boundaries=[2.0, 1.0]), ValueError, "increasing"),
        (dict(boundaries=[1.0], num_buckets=2), ValueError, "either"),
        (dict(boundaries=None), ValueError, "either"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(num_buckets=0, boundaries=None), ValueError, "num_buckets"),
        (dict(num_replicas=2, rank=2), ValueError, "rank"),
        (dict(num_replicas=2), ValueError, "torch.distributed"),
    ],
)
def test_bad_arguments_are_refused(kw, error, match):
    args = dict(keys=[1.0] * 8, batch_size=2, boundaries=[1.5])
    args.update(kw)
    with pytest.raises(error, match=match):
        BucketBatchSampler(Shards([8]), args.pop("keys"), **args)


class WithColumns(Shards):
    """A dataset that offers its columns by name (ShardListDataset.column's contract)."""

    def __init__(self, lengths, columns):
        super().__init__(lengths)
        self.columns = columns

    def column(self, name):
        return self.columns[name]


def test_keys_by_column_name():
    ratio = np.array([1.0, 2.0] * 6)
    ds = WithColumns([6, 6], {"ratio": ratio})
    sampler = BucketBatchSampler(ds, "ratio", batch_size=3, boundaries=[1.5])
    assert all(len(set(ratio[b])) == 1 for b in sampler) and len(sampler) == 4


# -- resume -------------------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 3])
def test_resume_at_any_position_gives_the_rest_of_the_epoch(replicas):
    ds = Shards([40, 33, 27])
    keys = np.random.default_rng(3).random(100)
    kw = dict(batch_size=4, num_buckets=3, seed=9, num_replicas=replicas)
    for rank in range(replicas):
        whole = BucketBatchSampler(ds, keys, rank=rank, **kw)
        whole.set_epoch(2)
        full = list(whole)
        for position in range(len(full) + 1):
            first = BucketBatchSampler(ds, keys, rank=rank, **kw)
            first.set_epoch(2)
            it = iter(first)
            head = [next(it) for _ in range(position)]
            state = json.loads(json.dumps(first.state_dict()))
            second = BucketBatchSampler(ds, keys, rank=rank, **kw)
            second.load_state_dict(state)
            assert len(second) == len(full)
            assert head + list(second) == full
            assert second.epoch == 3  # and the next pass is the next epoch


def test_a_state_from_other_data_or_settings_is_refused():
    from wids import SamplerStateError

    ds = Shards([40, 60])
    keys = np.random.default_rng(4).random(100)
    base = dict(batch_size=4, num_buckets=3, seed=1)
    state = BucketBatchSampler(ds, keys, **base).state_dict()
    for changed, match in [
        (dict(seed=2), "seed"),
        (dict(batch_size=5), "batch_size"),
        (dict(num_buckets=4), "bucket of each sample"),
        (dict(shuffle=False), "shuffle"),
        (dict(chunksize=7), "chunksize"),
        (dict(drop_last=True), "drop_last"),
    ]:
        with pytest.raises(SamplerStateError, match=match):
            BucketBatchSampler(ds, keys, **{**base, **changed}).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="shard layout"):
        BucketBatchSampler(Shards([50, 50]), keys, **base).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="bucket of each sample"):
        BucketBatchSampler(ds, keys[::-1].copy(), **base).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="not a"):
        BucketBatchSampler(ds, keys, **base).load_state_dict({"format": "wids-sampler-state"})


# -- real shards, real DataLoader workers ---------------------------------------------------------

SHAPES = [(64, 48), (48, 64), (64, 64), (96, 54)]  # four aspect ratios
SHARD_LENGTHS = [37, 52, 45, 61, 30]
BATCH = 6
CONTEXTS = ["fork", "forkserver", "spawn"]


def _make_shards(directory) -> tuple[list[str], np.ndarray]:
    """Shards whose samples carry their image size in ``.json``; the aspect ratio per sample."""
    rng = np.random.default_rng(7)
    paths, ratios = [], []
    for s, n in enumerate(SHARD_LENGTHS):
        members = []
        for i in range(n):
            w, h = SHAPES[int(rng.integers(len(SHAPES)))]
            key = f"s{s:02d}/{i:04d}"
            members.append((f"{key}.json", json.dumps({"width": w, "height": h}).encode()))
            members.append((f"{key}.txt", f"{s} {i}".encode()))
            ratios.append(w / h)
        path = os.path.join(directory, f"shard-{s:02d}.tar")
        write_shard(path, members)
        paths.append(path)
    return paths, np.array(ratios)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bucket")
    paths, ratios = _make_shards(str(directory))
    index = directory / "train.json"
    build_index(paths, str(index), name="train")
    return {"index": str(index), "paths": paths, "ratios": ratios}


def _ratio_of(sample) -> float:
    meta = json.loads(sample[".json"])
    return meta["width"] / meta["height"]


def _check_epoch(sampler, got, ratios):
    """The batches are the sampler's (same order), each sample what its index says."""
    sampler.set_epoch(0)
    expected = [[int(i) for i in b] for b in sampler]
    assert [[s["__index__"] for s in batch] for batch in got] == expected
    for batch in got:
        assert len({_ratio_of(s) for s in batch}) == 1  # homogeneous, from the bytes read
        for s in batch:
            assert _ratio_of(s) == ratios[s["__index__"]]
            shard, i = s[".txt"].decode().split()
            assert s["__key__"] == f"s{int(shard):02d}/{int(i):04d}"


def _collate(batch):
    return batch


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_a_dataloader_reads_bucketed_batches_from_local_shards(local, ctx):
    torch = pytest.importorskip("torch")
    ds = ShardListDataset(local["index"], transformations=[])
    sampler = BucketBatchSampler(ds, local["ratios"], batch_size=BATCH, num_buckets=4, seed=3)
    assert sampler.num_buckets == 4
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, num_workers=2, multiprocessing_context=ctx, collate_fn=_collate
    )
    assert len(loader) == len(sampler)
    got = list(loader)
    _check_epoch(sampler, got, local["ratios"])
    assert all(type(i) is int for b in sampler for i in b)  # local shards: plain indices


def test_distributed_ranks_read_disjoint_batches_of_equal_count(local):
    torch = pytest.importorskip("torch")
    ds = ShardListDataset(local["index"], transformations=[])
    lengths, seen = set(), Counter()
    for rank in range(3):
        sampler = BucketBatchSampler(
            ds, local["ratios"], batch_size=BATCH, num_buckets=4, num_replicas=3, rank=rank
        )
        loader = torch.utils.data.DataLoader(
            ds, batch_sampler=sampler, num_workers=2, collate_fn=_collate
        )
        got = list(loader)
        lengths.add((len(sampler), len(got)))
        seen.update(s["__index__"] for batch in got for s in batch)
        assert all(len({_ratio_of(s) for s in batch}) == 1 for batch in got)
    ((length, count),) = lengths
    assert length == count
    padded = 3 * length - sampler.total_batches
    assert sum(c - 1 for c in seen.values()) == padded * BATCH


@pytest.fixture(scope="module")
def remote(local, http_server):
    root = os.path.dirname(local["index"])
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isfile(path):
            http_server.put(path, "bucket/" + name)
        else:
            for sub in os.listdir(path):
                http_server.put(os.path.join(path, sub), f"bucket/{name}/{sub}")
    return http_server.url("bucket/train.json")


def _collate_hits(batch):
    """The samples, and the lookahead hits of the worker that read them."""
    from torch.utils.data import get_worker_info

    ds = get_worker_info().dataset
    ahead = ds._pool._lookahead
    return batch, (ahead.hits if ahead is not None else 0)


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_batches_over_remote_shards_carry_the_read_plan(local, remote, ctx):
    """The batches are read ahead as ChunkedSampler's are: the lookahead hits in the workers."""
    torch = pytest.importorskip("torch")
    ds = ShardListDataset(remote, access="range", transformations=[])
    sampler = BucketBatchSampler(ds, local["ratios"], batch_size=BATCH, num_buckets=4, seed=4)
    batches = list(sampler)
    assert all(type(i) is PlannedIndex for b in batches for i in b)
    assert [plan_of(b)[1] for b in batches] == [k * BATCH for k in range(len(batches))]
    sampler.set_epoch(0)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_sampler=sampler,
        num_workers=2,
        multiprocessing_context=ctx,
        collate_fn=_collate_hits,
    )
    got = list(loader)
    _check_epoch(sampler, [b for b, _ in got], local["ratios"])
    assert max(h for _, h in got) > 0


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_stateful_dataloader_resumes_the_epoch(local, ctx):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds = ShardListDataset(local["index"], transformations=[])

    def make():
        sampler = BucketBatchSampler(ds, local["ratios"], batch_size=BATCH, num_buckets=4, seed=8)
        loader = stateful.StatefulDataLoader(
            ds,
            batch_sampler=sampler,
            num_workers=2,
            multiprocessing_context=ctx,
            collate_fn=_collate,
        )
        return sampler, loader

    sampler, loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it
    sampler2, loader2 = make()
    loader2.load_state_dict(state)
    rest = list(loader2)
    _check_epoch(sampler, head + rest, local["ratios"])


def test_the_documented_example_runs(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    doc = (Path(__file__).resolve().parent.parent / "docs" / "bucketing.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/bucketing.md", "exec"), scope)
    assert scope["sampler"].epoch == 2 and len(scope["sampler"]) == 12


# -- resume on another world size -------------------------------------------------------------


def _resume_on(ds, keys, state, replicas, **kw):
    """Every rank of a new world size loads the state."""
    samplers = [
        BucketBatchSampler(ds, keys, num_replicas=replicas, rank=r, **kw) for r in range(replicas)
    ]
    for s in samplers:
        s.load_state_dict(json.loads(json.dumps(state)))
    return samplers


def _stage_reads(samplers, stop=None):
    """What the ranks of a stage read from where they start to ``stop``: (originals, copies)."""
    total = len(samplers[0]._stage_batches())
    real, copies = [], []
    for r, s in enumerate(samplers):
        order = [tuple(b) for b in s._rank_batches()]
        for pos in range(s._resume, len(order) if stop is None else stop):
            (real if r * len(order) + pos < total else copies).append(order[pos])
    return real, copies


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=5),
    worlds=st.lists(st.integers(1, 6), min_size=2, max_size=4),
    cuts=st.lists(st.floats(0, 1), min_size=3, max_size=3),
    drop_last=st.booleans(),
)
def test_an_epoch_resumed_on_other_world_sizes_reads_every_batch_once(
    lengths, worlds, cuts, drop_last
):
    """Checkpoint at a step on R1 ranks, resume on R2 (and again on R3 ...): no batch is read
    twice (but a padding copy and its original, as in an epoch without a resume), none is
    lost, and a copy read before a resume on another world size is not read again after it."""
    ds = Shards(lengths)
    keys = np.random.default_rng(len(lengths)).random(len(ds))
    kw = dict(batch_size=3, num_buckets=2, seed=4, drop_last=drop_last, chunksize=16)
    full = BucketBatchSampler(ds, keys, **kw)
    full.set_epoch(1)
    everything = {tuple(b) for b in full}
    samplers, _ = all_ranks(ds, keys, worlds[0], **kw)
    for s in samplers:
        s.set_epoch(1)
    before: set[tuple] = set()  # read before (originals, and copies of finished stages)
    stage_copies: set[tuple] = set()  # copies read in the stage still being read
    for k, replicas in enumerate(worlds[1:]):
        # lockstep: every rank consumed the same number of batches of its order
        start = samplers[0]._resume
        step = start + int(cuts[k] * (len(samplers[0]._rank_batches()) - start))
        real, copies = _stage_reads(samplers, step)
        assert not set(real) & before and len(set(real)) == len(real)
        before |= set(real)
        stage_copies |= set(copies)
        if replicas != samplers[0].num_replicas:  # a new stage: those copies count as read
            before |= stage_copies
            stage_copies = set()
        samplers = _resume_on(ds, keys, samplers[0].state_dict(step), replicas, **kw)
        assert all(s.epoch == 1 for s in samplers)
    real, copies = _stage_reads(samplers)
    assert not set(real) & before and len(set(real)) == len(real)  # none twice
    expected = [[list(b) for b in s._rank_batches()[s._resume :]] for s in samplers]
    got = [list(s) for s in samplers]
    assert got == expected and len({len(g) for g in got}) == 1  # equal per rank
    assert before | stage_copies | set(real) <= everything
    if not drop_last:  # none lost
        assert before | stage_copies | set(real) == everything
    # the next epoch is the new world size's normal order
    fresh, _ = all_ranks(ds, keys, worlds[-1], **kw)
    for s, f in zip(samplers, fresh, strict=True):
        f.set_epoch(2)
        assert s.epoch == 2 and list(s) == list(f)


def test_a_batch_whose_padding_copy_was_read_is_not_read_again():
    """5 batches on 4 ranks of 2: slot 6 (rank 3, position 0) is a copy of batch 1, whose
    original is rank 0's position 1. A checkpoint at step 1 has read the copy."""
    ds = Shards([20])
    keys = np.zeros(20)
    kw = dict(batch_size=4, boundaries=[0.5], shuffle=False)
    old = [BucketBatchSampler(ds, keys, num_replicas=4, rank=r, **kw) for r in range(4)]
    assert [len(s) for s in old] == [2] * 4 and old[0].total_batches == 5
    first = [list(s)[0] for s in old]
    assert first[3] == list(range(4, 8))  # batch 1, read at step 1 by rank 3
    new = BucketBatchSampler(ds, keys, num_replicas=1, rank=0, **kw)
    new.load_state_dict(old[0].state_dict(1))
    assert list(new) == [list(range(12, 16))]  # batch 3 only; batch 1 is not read again


def test_resumed_stage_state_round_trips_on_the_same_world_size():
    ds = Shards([50, 50, 20])
    keys = np.random.default_rng(9).random(120)
    kw = dict(batch_size=4, num_buckets=3, seed=2)
    old = [BucketBatchSampler(ds, keys, num_replicas=2, rank=r, **kw) for r in range(2)]
    state = old[0].state_dict(5)
    new = BucketBatchSampler(ds, keys, num_replicas=3, rank=1, **kw)
    new.load_state_dict(state)
    whole = list(new)
    again = BucketBatchSampler(ds, keys, num_replicas=3, rank=1, **kw)
    again.load_state_dict(state)
    it = iter(again)
    head = [next(it) for _ in range(2)]
    mid = again.state_dict()
    assert [s["num_replicas"] for s in mid["stages"]] == [2, 3]
    third = BucketBatchSampler(ds, keys, num_replicas=3, rank=1, **kw)
    third.load_state_dict(mid)
    assert head + list(third) == whole


def test_checkpoint_on_two_ranks_of_two_workers_resumes_on_three_ranks_of_one(local):
    """Real reads: 2 ranks x 2 workers read ``k`` steps; 3 ranks x 1 worker read the rest."""
    torch = pytest.importorskip("torch")
    ds = ShardListDataset(local["index"], transformations=[])
    kw = dict(batch_size=BATCH, num_buckets=4, seed=12)

    def loader(sampler, workers):
        return torch.utils.data.DataLoader(
            ds, batch_sampler=sampler, num_workers=workers, collate_fn=_collate
        )

    def indices(batch):
        assert len({_ratio_of(s) for s in batch}) == 1
        return [s["__index__"] for s in batch]

    k = 4
    read, old = [], []
    for rank in range(2):
        sampler = BucketBatchSampler(ds, local["ratios"], num_replicas=2, rank=rank, **kw)
        it = iter(loader(sampler, 2))
        read += [indices(next(it)) for _ in range(k)]
        del it
        old.append(sampler)
    state = old[0].state_dict(position=k)  # the step the training loop reached
    lengths = set()
    for rank in range(3):
        sampler = BucketBatchSampler(ds, local["ratios"], num_replicas=3, rank=rank, **kw)
        sampler.load_state_dict(state)
        got = [indices(b) for b in loader(sampler, 1)]
        lengths.add(len(got))
        read += got
    assert len(lengths) == 1  # equal per rank
    every = BucketBatchSampler(ds, local["ratios"], **kw)
    epoch = sorted(i for b in every for i in b)
    counts = Counter(i for b in read for i in b)
    # all of the epoch's batches; the only repeats are the new ranks' padding (<= 2 batches)
    assert set(counts) == set(epoch)
    assert sum(c - 1 for c in counts.values()) <= 2 * BATCH


def test_keys_by_the_name_of_an_index_column(tmp_path):
    """The column comes from the index (ShardWriter(columns=...)); a missing value is refused."""
    from wids import ShardWriter

    pattern, index = str(tmp_path / "t-%06d.tar"), str(tmp_path / "t.json")
    with ShardWriter(pattern, maxcount=10, index=index, columns=["json:tokens"]) as sink:
        for i in range(30):
            meta = {"tokens": 100 * (i % 3)} if i != 17 else {}
            sink.write({"__key__": f"{i:04d}", "json": meta})
    ds = ShardListDataset(index, transformations=[])
    with pytest.raises(ValueError, match="sample 17"):
        BucketBatchSampler(ds, "tokens", batch_size=3, num_buckets=3)
    kept = ShardListDataset(index, exclude=[17], transformations=[])
    sampler = BucketBatchSampler(kept, "tokens", batch_size=3, num_buckets=3)
    assert sampler.boundaries.tolist() == [100.0, 200.0]
    tokens = kept.column("tokens")
    assert all(len(set(tokens[b])) == 1 for b in sampler) and len(sampler) == 9


def test_a_position_saved_after_the_loader_drew_the_last_batch_names_that_epoch(local):
    """The loader's workers prefetch: the sampler has finished (and advanced) its epoch before
    the training loop has seen the last batches; state_dict(position=step) is of that epoch."""
    torch = pytest.importorskip("torch")
    ds = ShardListDataset(local["index"], transformations=[])
    kw = dict(batch_size=BATCH, num_buckets=4, seed=13)
    sampler = BucketBatchSampler(ds, local["ratios"], **kw)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, num_workers=2, collate_fn=_collate
    )
    it = iter(loader)
    step = len(sampler) - 1
    head = [next(it) for _ in range(step)]
    assert sampler.epoch == 1  # it has handed out the whole epoch already
    state = sampler.state_dict(position=step)
    last = next(it)
    del it
    again = BucketBatchSampler(ds, local["ratios"], **kw)
    again.load_state_dict(state)
    assert again.epoch == 0
    rest = list(again)
    assert [[s["__index__"] for s in b] for b in [*head, last]] == [
        *[[s["__index__"] for s in b] for b in head],
        *rest,
    ]


# -- torchrun ---------------------------------------------------------------------------------


def _torchrun(local, tmp, phase, ranks, workers):
    import socket
    import sys

    from procgroup import run_group

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    keys = tmp / "keys.json"
    keys.write_text(json.dumps(local["ratios"].tolist()))
    job = Path(__file__).with_name("bucket_job.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}"]
    cmd += ["--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(job)]
    cmd += [local["index"], str(keys), str(tmp), phase, str(workers)]
    proc = run_group(cmd, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((tmp / f"{phase}.json").read_text())


@pytest.mark.slow
def test_torchrun_two_ranks_of_two_workers_then_three_of_one(local, tmp_path):
    """World size from the process group; exact lengths; a checkpoint at step 3 on 2 ranks x 2
    workers resumed on 3 ranks x 1 worker reads every batch of the epoch once overall; a loader
    prepared by Accelerate is refused."""
    pytest.importorskip("torch")
    run = _torchrun(local, tmp_path, "run", 2, 2)
    ratios = local["ratios"]
    assert run["replicas"] == [2, 2] and len(set(run["len"])) == 1
    length = run["len"][0]

    def check(batches):
        for batch in batches:
            assert len(batch) == 4 and len({key for _, key in batch}) == 1
            assert all(key == ratios[i] for i, key in batch)  # the bytes read are the sample's
        return [tuple(i for i, _ in batch) for batch in batches]

    epoch1 = [check(rank) for rank in run["epoch1"]]
    assert [len(r) for r in epoch1] == [length, length]
    # the same order as the shard lengths, keys and seed give in this process
    whole = BucketBatchSampler(Shards(SHARD_LENGTHS), ratios, batch_size=4, num_buckets=4, seed=5)
    batches = Counter(b for rank in epoch1 for b in rank)
    assert set(batches) == {tuple(b) for b in whole.epoch_batches(1).tolist()}
    assert sum(batches.values()) - len(batches) == 2 * length - whole.total_batches  # padding

    for name, message in run["accelerate"]:  # prepare() would keep every 2nd batch: refused
        assert name == "SamplerWrappedError" and "BatchSamplerShard" in message

    resume = _torchrun(local, tmp_path, "resume", 3, 1)
    assert resume["replicas"] == [3, 3, 3]
    rest = [check(rank) for rank in resume["rest"]]
    assert len({len(r) for r in rest}) == 1  # equal per rank
    done = [b for rank in run["partial"] for b in check(rank)]
    read = Counter(done + [b for rank in rest for b in rank])
    epoch2 = {tuple(b) for b in whole.epoch_batches(2).tolist()}
    assert set(read) == epoch2  # none lost
    assert sum(c - 1 for c in read.values()) <= 2  # the new ranks' padding: at most R - 1
    nxt = [check(rank) for rank in resume["next"]]
    assert [len(r) for r in nxt] == resume["len"]  # the next epoch: the normal order of 3 ranks


def test_stateful_dataloader_state_resumes_on_another_world_size(local):
    """StatefulDataLoader 2 ranks x 2 workers -> 3 ranks x 2 workers (its state holds the
    batch sampler's, loaded through load_state_dict): each batch of the epoch once overall."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds = ShardListDataset(local["index"], transformations=[])
    kw = dict(batch_size=BATCH, num_buckets=4, seed=14)

    def make(replicas, rank):
        sampler = BucketBatchSampler(ds, local["ratios"], num_replicas=replicas, rank=rank, **kw)
        loader = stateful.StatefulDataLoader(
            ds, batch_sampler=sampler, num_workers=2, collate_fn=_collate
        )
        return loader

    k, read, states = 5, [], []
    for rank in range(2):
        loader = make(2, rank)
        it = iter(loader)
        read += [tuple(s["__index__"] for s in next(it)) for _ in range(k)]
        states.append(loader.state_dict())
        del it
    lengths = set()
    for rank in range(3):
        loader = make(3, rank)
        loader.load_state_dict(states[0])  # one rank's state is everybody's (lockstep)
        got = [tuple(s["__index__"] for s in b) for b in loader]
        lengths.add(len(got))
        read += got
    assert len(lengths) == 1
    every = BucketBatchSampler(ds, local["ratios"], **kw)
    counts = Counter(read)
    assert set(counts) == {tuple(b) for b in every}
    assert sum(c - 1 for c in counts.values()) <= 2  # the new ranks' padding


def test_the_docstring_examples_run():
    import doctest

    import wids.sampler.bucket

    result = doctest.testmod(
        wids.sampler.bucket, extraglobs={"BucketBatchSampler": BucketBatchSampler}
    )
    assert result.attempted >= 2 and result.failed == 0


@pytest.mark.parametrize(
    "stages",
    [
        [{"num_replicas": 10**12, "length": 1, "position": 0}],  # 10^12 slots: refused, not built
        [{"num_replicas": 1, "length": 25, "position": 0}] * 1025,
        [{"num_replicas": 0, "length": 25, "position": 0}],
        [{"num_replicas": 1, "length": 25, "position": 26}],
        [{"num_replicas": "1", "length": 25, "position": 0}],
        [],
        "stages",
        [{"num_replicas": 3, "length": 5, "position": 0}],  # 3 ranks of 25 batches have 9
    ],
)
def test_a_hostile_state_is_refused_before_any_work(stages):
    from wids import SamplerStateError

    ds = Shards([100])
    keys = np.zeros(100)
    sampler = BucketBatchSampler(ds, keys, batch_size=4, boundaries=[0.5])
    state = {**sampler.state_dict(), "stages": stages}
    with pytest.raises(SamplerStateError):
        sampler.load_state_dict(state)


@pytest.mark.parametrize(
    "forged",
    [None, [], "state", {"epoch": None}, {"epoch": "3"}, {"epoch": 1.5}, {"epoch": ...}],
)
def test_a_malformed_state_is_a_typed_error(forged):
    """Not a dict, or no integer epoch: SamplerStateError (was AttributeError, KeyError or
    TypeError from deep inside load_state_dict), and the sampler is unchanged."""
    from wids import SamplerStateError

    sampler = BucketBatchSampler(Shards([100]), np.zeros(100), batch_size=4, boundaries=[0.5])
    state = sampler.state_dict()
    if isinstance(forged, dict):
        forged = {**state, **forged}
        if forged["epoch"] is ...:
            del forged["epoch"]
    with pytest.raises(SamplerStateError):
        sampler.load_state_dict(forged)
    assert sampler.epoch == 0 and len(list(sampler)) == 25
