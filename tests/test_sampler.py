"""Tests for wids.sampler: the reference's pinned behaviour, properties, resume, mixing, workers."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import warnings
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wids import ChunkedSampler, DistributedChunkedSampler, SamplerStateError, ShardedSampler


class Shards:
    """Shard lengths without samples: what the samplers read from ShardListDataset."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return sum(self.lengths)


class Sized:
    """A dataset that only has a length: one shard."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


@dataclass(frozen=True)
class Component:
    name: str
    weight: float | None
    start: int
    stop: int


class Mixed:
    """What the mixing sampler reads from ShardListDataset: .lengths and .components."""

    def __init__(self, lengths: list[int], components: list[Component]) -> None:
        self.lengths = lengths
        self.components = components


def oracle(ranges, seed, epoch, shuffle, shufflefirst, sharded=False):
    """The reference order (docs/compat.md): one RNG per epoch, chunk order, chunks."""
    rng = random.Random(seed + 1289738273 * epoch)
    order = list(range(len(ranges)))
    if (shuffle or sharded) and (shufflefirst or epoch > 0):
        rng.shuffle(order)
    result = []
    for i in order:
        chunk = list(range(*ranges[i]))
        if shuffle or sharded:
            rng.shuffle(chunk)
        result.extend(chunk)
    return result


def shard_of(lengths):
    table = [s for s, n in enumerate(lengths) for _ in range(n)]
    return table.__getitem__


@pytest.fixture
def fake_dist(monkeypatch):
    """The reference tests' way of faking a process group: patch torch.distributed."""
    import torch.distributed as dist

    def install(rank: int, world_size: int) -> None:
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda: rank)
        monkeypatch.setattr(dist, "get_world_size", lambda: world_size)

    return install


# -- the reference's scenarios (docs/compat.md) -----------------------------------------------


class TestChunkedSamplerReference:
    def make(self, **kw):
        args = dict(num_samples=5000, chunksize=1000, seed=0, shuffle=True, shufflefirst=False)
        return ChunkedSampler(Sized(10000), **{**args, **kw})

    def test_init(self):
        s = self.make()
        assert s.ranges == [(i, i + 1000) for i in range(0, 5000, 1000)]
        assert (s.seed, s.shuffle, s.shufflefirst, s.epoch) == (0, True, False, 0)
        s.set_epoch(5)
        assert s.epoch == 5

    def test_iter(self):
        samples = list(self.make())
        assert len(samples) == 5000 and samples != list(range(5000))
        assert sorted(samples) == list(range(5000))

    def test_no_shuffle_attribute_read_at_iteration(self):
        s = self.make()
        s.shuffle = False
        assert list(s) == list(range(5000))
        s.set_epoch(3)
        assert list(s) == list(range(5000))

    def test_num_samples_tuple(self):
        s = self.make(num_samples=(1111, 2222))
        assert s.ranges == [(1111, 2111), (2111, 2222)]
        assert sorted(s) == list(range(1111, 2222))

    def test_epoch0_keeps_chunk_order(self):
        samples = list(self.make())
        for k in range(5):
            assert sorted(samples[k * 1000 : (k + 1) * 1000]) == list(
                range(k * 1000, (k + 1) * 1000)
            )
        s = self.make()
        s.set_epoch(1)
        firsts = [min(list(s)[k * 1000 : (k + 1) * 1000]) for k in range(5)]
        assert firsts != sorted(firsts)
        s = self.make(shufflefirst=True)
        firsts = [min(list(s)[k * 1000 : (k + 1) * 1000]) for k in range(5)]
        assert firsts != sorted(firsts)

    @pytest.mark.parametrize("epoch", [0, 1, 7])
    @pytest.mark.parametrize("shuffle", [True, False])
    @pytest.mark.parametrize("shufflefirst", [True, False])
    def test_exact_reference_order(self, epoch, shuffle, shufflefirst):
        s = self.make(num_samples=(10, 3500), seed=17, shuffle=shuffle, shufflefirst=shufflefirst)
        s.set_epoch(epoch)
        assert list(s) == oracle(s.ranges, 17, epoch, shuffle, shufflefirst)

    def test_fixed_chunking_ignores_shards(self):
        s = ChunkedSampler(Shards([7, 7, 7]), chunksize=5, chunking="fixed", seed=3)
        assert s.ranges == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 21)]
        s.set_epoch(2)
        assert list(s) == oracle(s.ranges, 3, 2, True, False)


class TestDistributedChunkedSamplerReference:
    kw = dict(num_samples=5000, chunksize=1000, seed=0, shuffle=True, shufflefirst=False)

    def test_rank_blocks_from_torch_distributed(self, fake_dist):
        fake_dist(0, 2)
        s0 = DistributedChunkedSampler(Sized(10000), **self.kw)
        assert s0.ranges == [(0, 1000), (1000, 2000), (2000, 2500)]
        assert (s0.seed, s0.shuffle, s0.shufflefirst, s0.epoch) == (0, True, False, 0)
        fake_dist(1, 2)
        s1 = DistributedChunkedSampler(Sized(10000), **self.kw)
        a, b = list(s0), list(s1)
        assert len(a) == len(b) == len(s0) == len(s1) == 2500
        assert sorted(a) == list(range(2500)) and sorted(b) == list(range(2500, 5000))
        assert a != list(range(2500)) and b != list(range(2500, 5000))
        assert a == oracle(s0.ranges, 0, 0, True, False)

    def test_no_shuffle(self, fake_dist):
        fake_dist(0, 2)
        s = DistributedChunkedSampler(Sized(10000), **{**self.kw, "shuffle": False})
        assert list(s) == list(range(2500))

    def test_explicit_values_win(self, fake_dist):
        fake_dist(1, 4)
        s = DistributedChunkedSampler(
            Shards([10]), rank=0
        )  # the reference replaced rank 0 by get_rank()
        assert (s.rank, s.num_replicas) == (0, 4)
        s = DistributedChunkedSampler(Shards([10]), num_replicas=2)
        assert (s.rank, s.num_replicas) == (1, 2)

    def test_without_process_group(self):
        s = DistributedChunkedSampler(Shards([10]))
        assert (s.rank, s.num_replicas, len(s)) == (0, 1, 10)
        s = DistributedChunkedSampler(
            Shards([10]), num_replicas=3, rank=2
        )  # honoured, not reset to 1
        assert (s.rank, s.num_replicas, len(s)) == (2, 3, 4)
        with pytest.raises(ValueError, match="both"):
            DistributedChunkedSampler(Shards([10]), rank=1)
        with pytest.raises(ValueError, match="both"):
            DistributedChunkedSampler(Shards([10]), num_replicas=2)

    @pytest.mark.parametrize("replicas, rank", [(0, 0), (2, 2), (2, -1), (-1, 0)])
    def test_bad_rank(self, replicas, rank):
        with pytest.raises(ValueError):
            DistributedChunkedSampler(Shards([10]), num_replicas=replicas, rank=rank)

    @pytest.mark.parametrize("drop_last, expected", [(False, 4), (None, 4), (True, 3)])
    def test_ten_samples_three_ranks(self, drop_last, expected):
        outs = [
            list(
                DistributedChunkedSampler(Shards([10]), num_replicas=3, rank=r, drop_last=drop_last)
            )
            for r in range(3)
        ]
        assert [len(o) for o in outs] == [expected] * 3
        if drop_last:
            assert sorted(sum(outs, [])) == list(range(9))
        else:  # rank 2 wraps around to the start of the range: 8, 9, then 0, 1
            assert sorted(outs[2]) == [0, 1, 8, 9]
            assert sorted(sum(outs, [])) == sorted([*range(10), 0, 1])


class TestShardedSampler:
    def test_reference(self):
        s = ShardedSampler(Shards([100, 100, 3]))
        assert s.ranges == [(0, 100), (100, 200), (200, 203)]
        first = list(s)
        assert sorted(first) == list(range(203))
        assert first == oracle(s.ranges, 0, 0, False, False, sharded=True)
        s.set_epoch(4)
        assert list(s) == oracle(s.ranges, 0, 4, False, False, sharded=True)
        assert ShardedSampler(None, lengths=[5, 0, 5]).ranges == [(0, 5), (5, 5), (5, 10)]

    def test_each_pass_advances_the_epoch(self):
        """The reference's bump: code that never calls set_epoch gets a new order every pass."""
        s = ShardedSampler(Shards([100, 100, 3]))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning any more: this is the default
            a, b = list(s), list(s)
        assert a != b and s.epoch == 2
        assert a == oracle(s.ranges, 0, 0, False, False, sharded=True)
        assert b == oracle(s.ranges, 0, 1, False, False, sharded=True)
        it = iter(s)
        next(it)
        assert s.epoch == 2  # only a complete pass advances
        s.set_epoch(1)  # an explicit epoch wins for the next pass; passes go on from there
        assert list(s) == b and s.epoch == 2
        assert list(s) == oracle(s.ranges, 0, 2, False, False, sharded=True)

    def test_set_epoch_once_then_passes_keep_advancing(self):
        """set_epoch(start) once, on resume (review-1 #4): later passes must not repeat it."""
        s = ChunkedSampler(Sized(12), chunksize=4, seed=0)
        s.set_epoch(3)
        a, b, c = list(s), list(s), list(s)
        assert s.epoch == 6 and a != b and b != c
        assert [a, b, c] == [oracle(s.ranges, 0, e, True, False) for e in (3, 4, 5)]

    def test_auto_epoch_false_repeats_an_epoch(self):
        s = ShardedSampler(Shards([100, 100, 3]), auto_epoch=False)
        first = list(s)
        assert list(s) == first and s.epoch == 0
        s.set_epoch(1)
        assert list(s) != first

    def test_auto_epoch_true_advances_after_set_epoch_too(self):
        s = ShardedSampler(Shards([100, 100, 3]), auto_epoch=True)
        s.set_epoch(3)
        list(s)
        assert s.epoch == 4

    def test_set_epoch_every_epoch_is_not_advanced_behind_its_back(self):
        """A loop calling set_epoch (torch style) sees exactly its epochs, and no warning."""
        s = ChunkedSampler(Shards([50]), chunksize=10)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for epoch in range(3):
                s.set_epoch(epoch)
                it = iter(s)
                head = [next(it) for _ in range(5)]
                assert s.state_dict()["epoch"] == epoch  # saved inside the epoch: names it
                assert head + list(it) == oracle(s.ranges, 0, epoch, True, False)
                assert s.epoch == epoch + 1  # and set_epoch(epoch + 1) changes nothing

    def test_a_resumed_automatic_sampler_goes_on_to_the_next_epoch(self):
        s = ChunkedSampler(Sized(40), chunksize=8)
        list(s)
        it = iter(s)
        head = [next(it) for _ in range(13)]
        state = s.state_dict()
        assert (state["epoch"], state["position"]) == (1, 13)
        t = ChunkedSampler(Sized(40), chunksize=8)
        t.load_state_dict(state)
        assert head + list(t) == oracle(t.ranges, 0, 1, True, False)
        assert t.epoch == 2 and list(t) == oracle(t.ranges, 0, 2, True, False)


# -- inputs, locality, no torch ---------------------------------------------------------------


def test_lengths_that_are_not_shard_lengths_are_one_shard():
    """``.lengths`` of tokens per sample (an NLP dataset) handed out indices past len()."""
    for other in ([512, 87, 301, 44, 120], [1.5, 2, 1, 0.5, 0], ["a"] * 5):
        text = type("Text", (Sized,), {"lengths": other})(5)
        sampler = ChunkedSampler(text, chunksize=100)
        assert sampler.ranges == [(0, 5)] and sorted(sampler) == list(range(5)) == list(
            range(len(sampler))
        )


def test_dataset_kinds():
    import torch.utils.data

    class TorchDs(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return i

    class WithLengths:
        lengths = [5, 7]

        def __len__(self):
            return 12

    assert ChunkedSampler(TorchDs(), chunksize=100).ranges == [(0, 12)]
    assert ChunkedSampler(WithLengths(), chunksize=100).ranges == [(0, 5), (5, 12)]
    # a list or tuple is a dataset of len() samples, not a list of shard lengths (the reference)
    assert ChunkedSampler((5, 7), chunksize=100).ranges == [(0, 2)]
    assert ChunkedSampler([3, 1, 2, 5], chunksize=3).ranges == [(0, 3), (3, 4)]
    assert ChunkedSampler(range(12), chunksize=100).ranges == [(0, 12)]  # a sized object
    assert list(ChunkedSampler(Shards([]), chunksize=3)) == []
    with pytest.raises(TypeError):
        ChunkedSampler(object())
    with pytest.raises(ValueError):
        ChunkedSampler(Shards([5, -1]))
    for bad in [13, (3, 2), (-1, 4)]:
        with pytest.raises(ValueError, match="num_samples"):
            ChunkedSampler(Shards([5, 7]), num_samples=bad)
    for kw in [dict(chunksize=0), dict(chunking="x"), dict(batch_size=0), dict(num_workers=-1)]:
        with pytest.raises(ValueError):
            ChunkedSampler(Shards([5, 7]), **kw)
    with pytest.raises(ValueError, match="partition"):
        DistributedChunkedSampler(Shards([5]), num_replicas=1, rank=0, partition="rows")


def test_chunks_follow_shards_and_cap():
    s = ChunkedSampler(Shards([10, 3, 0, 8]), chunksize=4, num_samples=(2, 19))
    assert s.ranges == [(2, 6), (6, 10), (10, 13), (13, 17), (17, 19)]


def test_import_and_non_distributed_samplers_do_not_import_torch():
    code = (
        "import sys, wids.sampler as m\n"
        "list(m.ChunkedSampler(range(7)))\n"
        "list(m.ShardedSampler(lengths=[3, 4]))\n"
        "assert 'torch' not in sys.modules, sorted(k for k in sys.modules if 'torch' in k)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_distributed_sampler_works_without_torch():
    """torch blocked (as if not installed): a plain object, explicit ranks, the same order."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import wids.sampler as m\n"
        "s = m.DistributedChunkedSampler(range(7), num_replicas=2, rank=1, shuffle=False)\n"
        "assert list(s) == [4, 5, 6, 0], list(s)\n"
        "assert type(s).__mro__[-1] is object and len(type(s).__mro__) == 3, type(s).__mro__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_distributed_sampler_is_a_torch_distributed_sampler():
    """Lightning passes it through only if isinstance(sampler, DistributedSampler)."""
    from torch.utils.data import DistributedSampler

    s = DistributedChunkedSampler(Shards([5, 5, 3]), num_replicas=2, rank=1, shuffle=False)
    assert isinstance(s, DistributedSampler)
    assert (s.epoch, s.seed, s.shuffle, s.drop_last) == (0, 0, False, False)
    assert list(s) == [7, 8, 9, 10, 11, 12, 0]  # our order, not torch's
    assert (s.num_replicas, s.rank, s.num_samples, s.total_size) == (2, 1, 7, 14)
    s.set_epoch(3)
    assert s.state_dict()["epoch"] == 3


# -- properties ---------------------------------------------------------------------------------

configs = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.integers(0, 30), min_size=0, max_size=8),
        "replicas": st.integers(1, 8),
        "chunksize": st.integers(1, 20),
        "drop_last": st.booleans(),
        "partition": st.sampled_from(["block", "global"]),
        "chunking": st.sampled_from(["shard", "fixed"]),
        "shuffle": st.booleans(),
        "shufflefirst": st.booleans(),
        "seed": st.integers(0, 2**32),
        "epoch": st.integers(0, 4),
    }
)


def ranks(cfg, **extra):
    samplers = [
        DistributedChunkedSampler(
            Shards(cfg["lengths"]),
            num_replicas=cfg["replicas"],
            rank=r,
            chunksize=cfg["chunksize"],
            drop_last=cfg["drop_last"],
            partition=cfg["partition"],
            chunking=cfg["chunking"],
            shuffle=cfg["shuffle"],
            shufflefirst=cfg["shufflefirst"],
            seed=cfg["seed"],
            **extra,
        )
        for r in range(cfg["replicas"])
    ]
    for s in samplers:
        s.set_epoch(cfg["epoch"])
    return samplers


@settings(max_examples=300, deadline=None)
@given(configs)
def test_partition_properties(cfg):
    n, replicas = sum(cfg["lengths"]), cfg["replicas"]
    samplers = ranks(cfg)
    outs = [list(s) for s in samplers]
    length = n // replicas if cfg["drop_last"] else -(-n // replicas)
    assert [len(o) for o in outs] == [len(s) for s in samplers] == [length] * replicas
    counts = Counter(i for o in outs for i in o)
    assert set(counts) <= set(range(n))
    if cfg["drop_last"]:  # disjoint, only the tail of n mod R indices is missing
        assert max(counts.values(), default=1) == 1 and len(counts) == replicas * length
    else:  # everything at least once; the repeats are the wrap-around padding
        assert set(counts) == set(range(n))
        padding = counts - Counter(range(n))
        assert padding.total() == replicas * length - n < replicas
        if cfg["partition"] == "block":
            assert padding == Counter(i % n for i in range(padding.total()))
        else:
            flat = [i for o in outs for i in o]
            assert all(flat[p] == flat[p - n] for p in range(n, len(flat)))
    # same configuration, same order; shard locality of chunks
    assert [list(s) for s in ranks(cfg)] == outs
    bounds = set(itertools.accumulate(cfg["lengths"]))
    for s in samplers:
        assert all(b - a <= cfg["chunksize"] for a, b in s.ranges)
        if cfg["chunking"] == "shard":
            assert not any(a < c < b for a, b in s.ranges for c in bounds)


@settings(max_examples=100, deadline=None)
@given(configs.filter(lambda c: sum(c["lengths"]) >= 64))
def test_epochs_differ(cfg):
    cfg = {**cfg, "shuffle": True}
    now = [list(s) for s in ranks(cfg)]
    cfg["epoch"] += 1
    assert [list(s) for s in ranks(cfg)] != now


@settings(max_examples=150, deadline=None)
@given(
    configs,
    st.floats(0, 1),
    st.sampled_from([(0, 1), (2, 3), (3, 4)]),
    st.booleans(),
)
def test_resume_at_any_position(cfg, where, workers, via_json):
    num_workers, batch_size = workers
    for s in ranks(cfg, num_workers=num_workers, batch_size=batch_size):
        full = list(s)
        s.set_epoch(cfg["epoch"])  # the pass advanced it
        position = int(where * len(s))
        it = iter(s)
        for _ in range(position):
            next(it)
        state = s.state_dict()
        assert (state["position"], state["epoch"], state["seed"]) == (
            position,
            cfg["epoch"],
            cfg["seed"],
        )
        if via_json:
            state = json.loads(json.dumps(state))
        fresh = ranks({**cfg, "epoch": 0}, num_workers=num_workers, batch_size=batch_size)
        other = fresh[s.rank]
        other.seed = 12345  # a state of another seed is another order: refused
        with pytest.raises(SamplerStateError, match="seed=12345"):
            other.load_state_dict(state)
        other.seed = cfg["seed"]
        other.load_state_dict(state)
        other.set_epoch(cfg["epoch"])  # setting the saved epoch keeps the position
        assert list(other) == full[position:]
        assert other.epoch == cfg["epoch"] + 1  # the next pass is the next epoch
        other.set_epoch(cfg["epoch"])
        assert list(other) == full  # an epoch set again starts over
        other.set_epoch(cfg["epoch"] + 1)
        s.set_epoch(cfg["epoch"] + 1)
        assert list(other) == list(s)


def test_len_after_a_resume_is_the_full_epoch_as_torchdata_does():
    """len() after load_state_dict counts the whole epoch, the resumed pass only the rest."""
    samplers = pytest.importorskip("torchdata.stateful_dataloader.sampler")
    s = DistributedChunkedSampler(Shards([7, 5, 9]), num_replicas=3, rank=1, chunksize=4)
    t = DistributedChunkedSampler(Shards([7, 5, 9]), num_replicas=3, rank=1, chunksize=4)
    t.load_state_dict(s.state_dict(position=2))
    assert len(t) == len(s) == 7 and len(list(t)) == 5
    theirs = samplers.StatefulDistributedSampler(range(21), num_replicas=3, rank=1)
    theirs.load_state_dict({"yielded": 2})
    assert len(theirs) == 7 and len(list(theirs)) == 5


def test_resume_with_explicit_position_and_set_epoch_clears():
    s = ChunkedSampler(Shards([40, 40]), chunksize=8)
    s.set_epoch(2)
    full = list(s)
    s.set_epoch(2)  # the pass advanced it
    state = s.state_dict(position=30)  # e.g. steps * batch_size, not what was prefetched
    t = ChunkedSampler(Shards([40, 40]), chunksize=8)
    t.load_state_dict(state)
    assert list(t) == full[30:]
    t.load_state_dict(state)
    t.set_epoch(3)  # another epoch: the saved position no longer applies
    assert len(list(t)) == 80
    with pytest.raises(ValueError):
        s.state_dict(position=81)


def test_resume_rejects_other_settings():
    state = DistributedChunkedSampler(Shards([50]), num_replicas=4, rank=1).state_dict()
    # another world size resumes elastically (tests/test_sampler_elastic.py)
    DistributedChunkedSampler(Shards([50]), num_replicas=2, rank=1).load_state_dict(state)
    # rank 0's state fits every rank: positions are equal in lockstep
    DistributedChunkedSampler(Shards([50]), num_replicas=4, rank=3).load_state_dict(state)
    for kw in [dict(drop_last=True), dict(chunksize=7), dict(shuffle=False), dict(num_samples=40)]:
        other = DistributedChunkedSampler(Shards([50]), num_replicas=4, rank=1, **kw)
        with pytest.raises(ValueError, match="saved with"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="wids-sampler-state"):
        ChunkedSampler(Shards([50])).load_state_dict({"epoch": 1})
    with pytest.raises(ValueError, match="position"):
        DistributedChunkedSampler(Shards([50]), num_replicas=4, rank=1).load_state_dict(
            {**state, "position": 14}
        )


# -- DataLoader workers ---------------------------------------------------------------------


class WhoReads:
    """A map-style dataset whose samples say which DataLoader worker read them."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return sum(self.lengths)

    def __getitem__(self, i):
        import torch.utils.data

        return i, torch.utils.data.get_worker_info().id


def shards_per_worker(sampler, ds, batch_size, num_workers):
    from torch.utils.data import DataLoader

    loader = DataLoader(ds, sampler=sampler, batch_size=batch_size, num_workers=num_workers)
    shard = shard_of(ds.lengths)
    seen: dict[int, set[int]] = {}
    order = []
    for indices, workers in loader:
        for i, w in zip(indices.tolist(), workers.tolist(), strict=True):
            seen.setdefault(w, set()).add(shard(i))
            order.append(i)
    return seen, order


def test_dataloader_worker_mapping():
    """Default: batch k goes to worker k % W, so every worker reads every chunk's shard.
    With num_workers/batch_size given, each worker reads its own chunks."""
    ds = WhoReads([40] * 8)
    plain = ChunkedSampler(ds, chunksize=40)
    seen, order = shards_per_worker(plain, ds, 5, 2)
    plain.set_epoch(0)  # the loader's pass advanced it to epoch 1
    assert order == list(plain) and all(len(s) == 8 for s in seen.values())

    aware = ChunkedSampler(ds, chunksize=40, num_workers=2, batch_size=5)
    seen, order = shards_per_worker(aware, ds, 5, 2)
    aware.set_epoch(0)  # the loader's pass advanced it to epoch 1
    assert order == list(aware) and sorted(order) == list(range(320))
    assert [len(s) for s in seen.values()] == [4, 4] and not set.intersection(*seen.values())


def test_worker_aware_tail_borrows():
    s = ChunkedSampler(
        Shards([10, 10, 3]), chunksize=10, num_workers=2, batch_size=4, shuffle=False
    )
    out = list(s)
    assert sorted(out) == list(range(23)) and len(s) == 23
    assert out[:4] == [0, 1, 2, 3] and out[4:8] == [10, 11, 12, 13]


# -- mixing -----------------------------------------------------------------------------------


def mixed(weights=(3.0, 1.0)):
    return Mixed(
        [60, 40, 50, 50],
        [Component("a", weights[0], 0, 100), Component("b", weights[1], 100, 200)],
    )


def test_mix_proportions_and_passes():
    s = ChunkedSampler(mixed(), chunksize=16, mix=True)
    assert s.partition == "global" and len(s) == 200
    for epoch in range(3):
        s.set_epoch(epoch)
        counts = Counter(s)
        a = {i: c for i, c in counts.items() if i < 100}
        b = {i: c for i, c in counts.items() if i >= 100}
        assert sum(a.values()) == 150 and sum(b.values()) == 50
        assert set(a) == set(range(100)) and set(a.values()) <= {1, 2}  # one pass + half
        assert set(b.values()) == {1}  # a subset, without replacement
    s.set_epoch(0)
    b0 = {i for i in s if i >= 100}
    s.set_epoch(1)
    assert {i for i in s if i >= 100} != b0  # another subset next epoch


def test_mix_distributed_and_weights():
    ds = mixed((1.0, None))  # a missing weight counts as 1.0
    outs = [
        list(DistributedChunkedSampler(ds, num_replicas=3, rank=r, mix=True, chunksize=10))
        for r in range(3)
    ]
    assert [len(o) for o in outs] == [67] * 3
    single = list(ChunkedSampler(ds, mix=True, chunksize=10))
    flat = sum(outs, [])
    assert flat[:200] == single and flat[200:] == single[:1]
    assert sum(1 for i in single if i < 100) == 100
    zero = Counter(ChunkedSampler(mixed((1.0, 0.0)), mix=True))
    assert max(zero) < 100 and set(zero.values()) == {2}
    with pytest.raises(ValueError, match="weight"):
        ChunkedSampler(mixed((1.0, -1.0)), mix=True)
    with pytest.raises(ValueError, match="components"):
        ChunkedSampler(Shards([10]), mix=True)
    with pytest.raises(ValueError, match="global"):
        DistributedChunkedSampler(ds, num_replicas=1, rank=0, mix=True, partition="block")


# -- memory proportional to shards, not samples -------------------------------------------------


def _eager_interleave(pieces, num_workers, batch_size):
    """The previous implementation (all of an epoch in memory): the lazy one must equal it."""
    streams = [[] for _ in range(num_workers)]
    for piece in pieces:
        min(streams, key=len).extend(piece)
    taken = [0] * num_workers
    remaining = sum(len(s) for s in streams)
    for k in itertools.count():
        if remaining == 0:
            return
        w = k % num_workers
        need = batch_size
        while need:
            if taken[w] == len(streams[w]):
                w = max(range(num_workers), key=lambda j: len(streams[j]) - taken[j])
                if taken[w] == len(streams[w]):
                    break
            part = streams[w][taken[w] : taken[w] + need]
            taken[w] += len(part)
            need -= len(part)
            remaining -= len(part)
            yield from part


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=30),
    workers=st.integers(1, 6),
    batch=st.integers(1, 9),
)
def test_lazy_interleave_equals_the_eager_one(sizes, workers, batch):
    from wids.sampler.workers import _interleave

    pieces, start = [], 0
    for n in sizes:
        pieces.append(list(range(start, start + n)))
        start += n
    assert list(_interleave(iter(pieces), workers, batch)) == list(
        _eager_interleave(pieces, workers, batch)
    )


@pytest.mark.parametrize("n", [2, 3, 5, 1000, 4097, 65536, 70001])
def test_lazy_permutation_is_a_permutation(n):
    from wids.sampler.chunks import _Permutation

    perm = _Permutation(n, 12345)
    got = list(perm)
    assert sorted(got) == list(range(n)) and got == list(_Permutation(n, 12345))
    if n > 100:
        assert got != list(range(n)) and got != list(_Permutation(n, 54321))
        assert perm.block(17, 40) == got[17:40]


def test_a_shard_larger_than_the_shuffle_threshold_is_still_a_permutation():
    """ShardedSampler over one shard of 2**20 + 5000 samples: the lazy path, still a shuffle."""
    n = (1 << 20) + 5000
    s = ShardedSampler(lengths=[n], seed=3)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert sorted(first) == list(range(n)) and first != list(range(n)) and first != second
    again = ShardedSampler(lengths=[n], seed=3)
    assert list(itertools.islice(again, 1000)) == first[:1000]


# -- epochs of more than 2**20 indices --------------------------------------------------------


@dataclass
class _Part:
    name: str
    start: int
    stop: int
    weight: float | None


class _Mixed:
    def __init__(self, lengths: list[int], cut: int, weights: tuple) -> None:
        n = sum(lengths)
        self.lengths = lengths
        self.components = [_Part("a", 0, cut, weights[0]), _Part("b", cut, n, weights[1])]


def test_big_epochs_let_each_rank_enter_at_its_slice(monkeypatch):
    """Past _BIG indices, global and mix partitions key each chunk's shuffle by its position, so
    a rank skips to its slice: the ranks' slices still tile one sequence (wrapped for padding),
    the same one a single replica generates, and without mixing it is a permutation."""
    import wids.sampler.chunked as chunked

    monkeypatch.setattr(chunked, "_BIG", 0)  # every epoch counts as big
    for trial in range(150):
        r = random.Random(trial)
        lengths = [r.randrange(0, 30) for _ in range(r.randrange(1, 8))]
        n = sum(lengths)
        if n == 0:
            continue
        ds = _Mixed(lengths, r.randrange(0, n + 1), (r.choice([1.0, None]), r.choice([0.5, 2.0])))
        replicas, mix, drop = r.randrange(1, 6), r.random() < 0.4, r.random() < 0.5
        kw = dict(chunksize=r.randrange(1, 9), seed=trial, partition="global", mix=mix)
        kw.update(shufflefirst=r.random() < 0.5, shuffle=r.random() < 0.8)
        length = n // replicas if drop else -(-n // replicas)
        for epoch in (0, 1):
            one = DistributedChunkedSampler(ds, num_replicas=1, rank=0, **kw)
            one.set_epoch(epoch)
            whole = list(one)
            got = []
            for rank in range(replicas):
                s = DistributedChunkedSampler(
                    ds, num_replicas=replicas, rank=rank, drop_last=drop, **kw
                )
                s.set_epoch(epoch)
                got += list(s)
            assert got == [whole[p % n] for p in range(replicas * length)], (trial, kw)
            if not mix:
                assert sorted(whole) == list(range(n))


class _Billion:
    """10**9 samples in 10**5 shards, with three weighted parts: what the samplers read."""

    def __init__(self) -> None:
        self.lengths = [10_000 + (i % 7) - 3 for i in range(100_000)]
        total, third = sum(self.lengths), sum(self.lengths[:33_333])
        self.components = [
            _Part("a", 0, third, 3.0),
            _Part("b", third, 2 * third, 1.0),
            _Part("c", 2 * third, total, 0.5),
        ]


@pytest.mark.parametrize(
    "make",
    [
        lambda ds: ChunkedSampler(ds),
        lambda ds: ChunkedSampler(ds, mix=True),
        lambda ds: ChunkedSampler(ds, num_workers=4, batch_size=32),
        lambda ds: DistributedChunkedSampler(ds, num_replicas=8, rank=3),
        lambda ds: DistributedChunkedSampler(ds, num_replicas=8, rank=7, partition="global"),
        lambda ds: DistributedChunkedSampler(ds, num_replicas=8, rank=7, mix=True),
        lambda ds: ShardedSampler(ds, shufflefirst=True),
        lambda ds: ShardedSampler(ds, lengths=[10**9]),  # one shard of 10**9
    ],
    ids=["chunked", "mix", "workers", "block", "global", "dist-mix", "sharded", "one-shard"],
)
def test_memory_to_the_first_index_is_per_shard_not_per_sample(make):
    """Python-allocated peak (tracemalloc, numpy included) from the dataset to the first index,
    over 10**9 samples in 10**5 shards: a few MB, where one list of the epoch would be 8 GB
    (before: 22 MB for ChunkedSampler, 69 MB with mix=True; the last rank of a global
    partition generated 7/8 of the epoch first)."""
    import tracemalloc

    ds = _Billion()
    tracemalloc.start()
    try:
        sampler = make(ds)
        first = next(iter(sampler))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0 <= first < 10**9 + 10**5
    assert peak < 12e6, f"{peak / 1e6:.1f} MB"


def test_dslength_per_replica_is_what_len_says_as_in_the_reference() -> None:
    """The reference's keyword runs unchanged: ``len()`` says it, an epoch yields the range;
    a length that differs from the range warns (a DataLoader's len and batches differ)."""
    same = ChunkedSampler(
        list(range(29)), num_samples=(4, 17), chunksize=5, dslength_per_replica=13
    )
    assert len(same) == 13 and sorted(same) == list(range(4, 17))
    with pytest.warns(UserWarning, match="dslength_per_replica=4 but an epoch yields 2"):
        said = ChunkedSampler(list(range(10)), num_samples=(8, 10), dslength_per_replica=4)
    assert len(said) == 4 and sorted(said) == [8, 9]
    assert len(ChunkedSampler(list(range(10)), dslength_per_replica=-1)) == 10
