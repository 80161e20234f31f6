"""Resuming an epoch on another world size (wids/sampler/elastic.py), rank by rank in one process.

The real-process runs (torchrun, DataLoader workers, StatefulDataLoader) are in
tests/test_distributed.py and tests/test_frameworks_stateful.py.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from test_dataset_plan import remote  # noqa: F401 - the fixture: shards and index on nginx

from wids import ChunkedSampler, DistributedChunkedSampler, SamplerStateError

LENGTHS = [13, 20, 7, 25, 16, 22]  # 103 samples: uneven shards, odd total
SETTINGS = [
    {},
    {"partition": "global"},
    {"drop_last": True},
    {"partition": "global", "drop_last": True},
    {"num_workers": 2, "batch_size": 3},
    {"partition": "global", "num_workers": 2, "batch_size": 3},
]
# (ranks, indices each rank consumes), stage after stage; the last stage reads to the end
CHAINS = [
    [(2, 6), (3, None)],
    [(4, 5), (2, None)],
    [(2, 10), (3, 4), (1, 3), (5, None)],
    [(3, 0), (2, None)],
    [(2, 51), (3, None)],  # the old ranks had read all but one (the padding copy or not)
    [(4, 20), (3, 5), (2, None)],
    [(5, 15), (2, 10), (4, None)],
]


class Shards:
    """Shard lengths without samples: what the samplers read from ShardListDataset."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return sum(self.lengths)


def ranks(n: int, lengths=LENGTHS, **kw) -> list[DistributedChunkedSampler]:
    ds = Shards(lengths)
    kw = {"seed": 5, "chunksize": 4, **kw}
    return [DistributedChunkedSampler(ds, num_replicas=n, rank=r, **kw) for r in range(n)]


def run_chain(chain, lengths=LENGTHS, epoch=2, **kw):
    """Every stage's ranks read their share (lockstep), rank 0's state goes to the next stage.

    Returns each stage's per-rank indices and the last state saved.
    """
    state, stages = None, []
    for replicas, steps in chain:
        samplers = ranks(replicas, lengths, **kw)
        for s in samplers:
            s.set_epoch(epoch)
            if state is not None:
                s.load_state_dict(json.loads(json.dumps(state)))  # as saved to a file
        read = [list(itertools.islice(iter(s), steps)) for s in samplers]
        assert len({len(r) for r in read}) == 1  # lockstep: equal shares
        stages.append(read)
        if steps is not None:
            states = [s.state_dict() for s in samplers]
            assert all(st == states[0] for st in states)  # any rank's state will do
            state = states[0]
    return stages, state


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: "-".join(map(str, kw.values())) or "block")
@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: "-".join(str(r) for r, _ in c))
def test_every_sample_of_the_epoch_once_up_to_documented_padding(chain, kw):
    stages, _ = run_chain(chain, **kw)
    n = sum(LENGTHS)
    reads = [Counter(i for rank in stage for i in rank) for stage in stages]
    for k in range(1, len(stages)):  # what was read before a checkpoint is never read after it
        before, after = sum(reads[:k], Counter()), sum(reads[k:], Counter())
        assert not set(before) & set(after), k
    served = sum(reads, Counter())
    if kw.get("drop_last"):  # nothing twice; each stage drops at most R - 1 (its tail)
        assert max(served.values()) == 1
        assert n - sum(r - 1 for r, _ in chain) <= len(served) <= n
    else:  # nothing lost; each stage pads at most R - 1
        assert set(served) == set(range(n))
        extra = [(c - Counter(set(c))).total() for c in reads]
        assert all(e <= r - 1 for e, (r, _) in zip(extra, chain, strict=True)), extra


@pytest.mark.parametrize("kw", SETTINGS[:2] + SETTINGS[4:], ids=["block", "global", "w", "gw"])
def test_without_padding_exactly_once_and_the_rest_is_the_old_orders_in_rank_order(kw):
    lengths = [12] * 8  # 96 samples: 4 ranks of 24, then 3 ranks of 64 / 3 -> no padding
    full = [list(s) for s in ranks(4, lengths, **kw)]  # epoch 0, each old rank's whole order
    stages, _ = run_chain([(4, 8), (2, None)], lengths, epoch=0, **kw)
    assert stages[0] == [order[:8] for order in full]
    new = stages[1]
    assert [len(r) for r in new] == [32, 32]
    # shard-local order kept: the new ranks read the old ranks' unread parts, in rank order
    assert new[0] + new[1] == [i for order in full for i in order[8:]]
    assert sorted(i for stage in stages for r in stage for i in r) == list(range(96))


def test_later_epochs_are_the_new_world_sizes_normal_order():
    stages, state = run_chain([(2, 7)], epoch=3)
    resumed = ranks(3)
    fresh = ranks(3)
    for s, f in zip(resumed, fresh, strict=True):
        s.load_state_dict(state)
        s.set_epoch(3)  # the saved epoch: keeps the resume
        rest = list(s)
        assert len(s) == len(f) == 35 and len(rest) == -(-(103 - 14) // 3)
        assert s.epoch == 4
        f.set_epoch(4)
        assert list(s) == list(f)  # the next epoch is R=3's own
        assert s.state_dict()["version"] == 1  # and its states are plain ones again


def test_a_resumed_epoch_saved_and_resumed_on_the_same_world_size_continues():
    _, state = run_chain([(2, 9)])
    a, b = ranks(3), ranks(3)
    for s in a:
        s.load_state_dict(state)
    rest = [list(s) for s in a]
    for s in a:
        s.load_state_dict(state)
    heads = [list(itertools.islice(iter(s), 4)) for s in a]
    again = a[1].state_dict()
    assert again["version"] == 2 and again["position"] == 4
    assert [st["num_replicas"] for st in again["stages"]] == [2, 3]
    for s, head, whole in zip(b, heads, rest, strict=True):
        s.load_state_dict(again)
        assert head + list(s) == whole


def test_an_explicit_position_counts_from_the_resume():
    _, state = run_chain([(2, 9)])
    s = ranks(3)[0]
    s.load_state_dict(state)
    whole = list(s)
    s.load_state_dict(state)
    iter(s)  # a DataLoader prefetching: handed out more than the loop consumed
    t = ranks(3)[0]
    t.load_state_dict(s.state_dict(position=5))
    assert list(t) == whole[5:]
    with pytest.raises(ValueError, match="position"):
        s.state_dict(position=len(whole) + 1)


def test_a_one_replica_sampler_takes_a_distributed_state():
    stages, state = run_chain([(4, 3)])
    one = ChunkedSampler(Shards(LENGTHS), seed=5, chunksize=4)
    one.load_state_dict(state)
    rest = list(one)
    consumed = [i for rank in stages[0] for i in rank]
    assert len(set(rest)) == len(rest) and set(rest) | set(consumed) == set(range(103))
    assert len(rest) in (103 - 12, 103 - 12 + 1)  # + 1: the padding copy was read already


def test_a_state_of_other_data_or_settings_is_refused():
    _, state = run_chain([(2, 6)])
    with pytest.raises(SamplerStateError, match="chunks=.*other data"):
        ranks(3, [13, 20, 7, 25, 16, 21, 1])[0].load_state_dict(state)  # other shards
    with pytest.raises(SamplerStateError, match="span=.*other data"):
        ranks(3, [13, 20, 7, 25, 16, 23])[0].load_state_dict(state)
    for kw in [{"partition": "global"}, {"drop_last": True}, {"shuffle": False}, {"seed": 6}]:
        with pytest.raises(SamplerStateError, match="saved with"):
            ranks(3, **kw)[0].load_state_dict(state)
    s = ranks(3)[0]
    for bad in [{"epoch": 1}, {**state, "version": 3}, {**state, "position": 53}]:
        with pytest.raises(SamplerStateError):
            s.load_state_dict(bad)
    with pytest.raises(ValueError):  # a SamplerStateError is a ValueError
        s.load_state_dict({**state, "stages": [{"num_replicas": 2, "length": 52}]})
    s.load_state_dict(state)
    resumed = s.state_dict()
    forged = {
        **resumed,
        "stages": [*resumed["stages"][:-1], {**resumed["stages"][-1], "length": 9}],
    }
    with pytest.raises(SamplerStateError, match="cannot split"):
        ranks(3)[0].load_state_dict(forged)


def test_the_docs_example_runs_as_written(tmp_path, monkeypatch):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "elastic-resume.md").read_text()
    code = doc.split("<!-- example -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/elastic-resume.md", "exec"), scope)
    assert scope["served"] == Counter(range(scope["n"]))


def test_a_padding_copy_read_before_the_checkpoint_is_not_read_again():
    """Block mode: old rank 1's order holds a copy of index 0, shuffled in with its chunks; if
    the copy was read and rank 0's own index 0 was not, the rest leaves index 0 out."""
    for epoch in range(1, 40):
        old = ranks(2)  # 103 samples: 52 a rank, slot 103 is a copy of index 0
        for s in old:
            s.set_epoch(epoch)
        orders = [list(s) for s in old]
        copy_at, own_at = orders[1].index(0), orders[0].index(0)
        if copy_at < own_at:
            break
    else:
        pytest.fail("no epoch puts the copy first")
    stages, _ = run_chain([(2, copy_at + 1), (3, None)], epoch=epoch)
    assert 0 in stages[0][1] and 0 not in stages[0][0]
    rest = [i for rank in stages[1] for i in rank]
    assert 0 not in rest
    assert sorted(set(rest) | {i for rank in stages[0] for i in rank}) == list(range(103))


# -- real processes: torchrun ranks, DataLoader workers, tar shards ------------------------------

JOB = Path(__file__).with_name("elastic_job.py")
BATCH, STEPS, SEED, CHUNK = 4, 5, 11, 8


@pytest.fixture(scope="module")
def shards_json(tmp_path_factory):
    from wids.synth import write_shard

    root = tmp_path_factory.mktemp("elastic")
    shards, index = [], 0
    for s, n in enumerate(LENGTHS):
        members = []
        for _ in range(n):
            key = f"s{s}-{index:06d}"  # the key names the sample's index
            members += [(f"{key}.cls", str(s).encode()), (f"{key}.txt", key.encode())]
            index += 1
        write_shard(str(root / f"part-{s:02d}.tar"), members)
        shards.append({"url": str(root / f"part-{s:02d}.tar"), "nsamples": n})
    path = root / "shards.json"
    path.write_text(json.dumps(shards))
    return path


def torchrun(shards: Path, ranks: int, name: str, loader: str, workers: int, *steps, state=None):
    import os
    import sys

    from procgroup import run_group
    from test_distributed import free_port

    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
        "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(JOB), str(shards), str(shards.parent), name, loader, str(workers), *map(str, steps),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if state is not None:
        env["ELASTIC_STATE"] = str(state)
    proc = run_group(cmd, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((shards.parent / f"{name}.json").read_text())


def expected(old: int, new: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """In one process: what the old ranks read, what the new ranks read, the next epoch."""
    ds = Shards(LENGTHS)
    before, after, nxt = [], [], []
    state = None
    for r in range(old):
        s = DistributedChunkedSampler(ds, num_replicas=old, rank=r, seed=SEED, chunksize=CHUNK)
        s.set_epoch(1)
        before.append(list(itertools.islice(iter(s), STEPS * BATCH)))
        state = s.state_dict(position=STEPS * BATCH)
    for r in range(new):
        s = DistributedChunkedSampler(ds, num_replicas=new, rank=r, seed=SEED, chunksize=CHUNK)
        s.set_epoch(1)
        s.load_state_dict(state)
        after.append(list(s))
        nxt.append(list(s))
    return before, after, nxt


def flat(batches):
    return [i for batch in batches for i in batch]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "loader"),
    [((2, 2), (3, 1), "plain"), ((4, 1), (2, 2), "plain"), ((2, 2), (3, 2), "stateful")],
    ids=["2x2-3x1", "4x1-2x2", "stateful-2x2-3x2"],
)
def test_torchrun_checkpoint_resumes_on_another_world_size(shards_json, old, new, loader):
    pytest.importorskip("torch")
    if loader == "stateful":
        pytest.importorskip("torchdata.stateful_dataloader")
    name = f"{loader}-{old[0]}x{old[1]}-{new[0]}x{new[1]}"
    saved = torchrun(shards_json, *old[:1], f"{name}-save", loader, old[1], STEPS)
    state = shards_json.parent / f"{name}-save-state.pt"
    resumed = torchrun(shards_json, new[0], f"{name}-resume", loader, new[1], state=state)
    before = [flat(rank) for rank in saved["epoch1"]]
    after = [flat(rank) for rank in resumed["epoch1"]]
    # the ranks stopped at step STEPS; the new ranks read equal shares of the rest
    assert [len(b) for b in before] == [STEPS * BATCH] * old[0]
    assert len({len(a) for a in after}) == 1
    read_before = Counter(i for b in before for i in b)
    read_after = Counter(i for a in after for i in a)
    assert not set(read_before) & set(read_after)  # nothing read before is read again
    assert set(read_before) | set(read_after) == set(range(sum(LENGTHS)))  # nothing lost
    assert (read_after - Counter(set(read_after))).total() <= new[0] - 1  # padding only
    # exactly the order the samplers give in one process, whatever the workers
    want_before, want_after, want_next = expected(old[0], new[0])
    assert before == want_before and after == want_after
    # and then the next epoch is the normal one for the new world size
    assert resumed["epoch"] == 3 and [flat(r) for r in resumed["epoch2"]] == want_next


def test_a_position_given_after_the_loader_drew_the_last_indices_is_in_that_epoch():
    """A DataLoader prefetching the epoch's last batches completes the sampler's pass, which
    advances the epoch; the loop's checkpoint at step 5 still means the epoch it is in."""
    s = ranks(4)[0]
    s.set_epoch(1)
    it = iter(s)
    whole = list(it)  # the loader drew everything; the loop is at step 5 of 4 indices
    assert s.epoch == 2
    state = s.state_dict(position=20)
    assert (state["epoch"], state["position"]) == (1, 20)
    t = ranks(4)[0]
    t.load_state_dict(state)
    assert list(t) == whole[20:]
    assert s.state_dict()["epoch"] == 2  # handed-out count: the new epoch, at 0
    iter(s)  # a pass of epoch 2 began: positions are its own again
    assert s.state_dict(position=20)["epoch"] == 2


# -- the read plan: a resumed pass over remote shards still reads ahead ------------------------


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_the_resumed_rest_over_nginx_carries_the_read_plan(remote, ctx):  # noqa: F811
    from test_dataset_plan import _check, _hits, _loader

    from wids import ShardListDataset
    from wids.plan import PlannedIndex

    ds = ShardListDataset(remote["index"], access="range", transformations=[])
    old = [DistributedChunkedSampler(ds, num_replicas=2, rank=r, chunksize=40) for r in range(2)]
    read = [list(itertools.islice(iter(s), 16)) for s in old]
    state = old[0].state_dict(position=16)
    new, rests = [], []
    for r in range(3):
        s = DistributedChunkedSampler(ds, num_replicas=3, rank=r, chunksize=40)
        s.load_state_dict(state)
        rest = list(s)
        assert all(type(i) is PlannedIndex for i in rest)  # each index carries the plan
        rests.append([int(i) for i in rest])
        s.load_state_dict(state)
        new.append(s)
    every = [i for r in read + rests for i in r]  # 128 left on 3 ranks: one padding index
    assert set(every) == set(range(160)) and len(every) == 161
    for s, rest in zip(new, rests, strict=True):
        got = list(_loader(ds, s, ctx))
        _check(remote, got, rest)  # the samples asked for, checked against tarfile
        assert _hits(got) > 0  # and the workers read ahead from the plan


class Mixed(Shards):
    """Shard lengths and weighted sub-datasets (what ShardListDataset.components gives)."""

    def __init__(self, lengths: list[int], components: list[tuple[int, int, float]]) -> None:
        from types import SimpleNamespace

        super().__init__(lengths)
        self.components = [
            SimpleNamespace(name=f"c{k}", weight=w, start=a, stop=b)
            for k, (a, b, w) in enumerate(components)
        ]


@pytest.mark.parametrize("pad", [False, True])
def test_mixing_resumes_the_same_draws(pad):
    """With mix=True an epoch draws some samples several times: the rest is the unread draws
    (slots), so the whole epoch is the old world size's epoch, draw for draw."""
    lengths = [12] * 8 if not pad else LENGTHS  # 96: no padding on 4, then 3 ranks
    ds = Mixed(lengths, [(0, 40, 3.0), (40, sum(lengths), 1.0)])

    def world(n):
        return [
            DistributedChunkedSampler(ds, num_replicas=n, rank=r, seed=3, chunksize=8, mix=True)
            for r in range(n)
        ]

    full = [list(s) for s in world(4)]  # epoch 0 on 4 ranks, draw for draw
    before = [order[:6] for order in full]
    state = world(4)[0].state_dict(position=6)
    after = []
    for s in world(3):
        s.load_state_dict(state)
        after.append(list(s))
    assert len({len(a) for a in after}) == 1
    served = Counter(i for part in before + after for i in part)
    draws = Counter(i for order in full for i in order)
    assert max(draws.values()) > 1  # the heavy component is drawn more than once
    if not pad:
        assert served == draws
        assert [i for a in after for i in a] == [i for order in full for i in order[6:]]
    else:  # the old epoch's padding copy and the new stage's padding: at most 3 + 2 off
        assert (served - draws).total() + (draws - served).total() <= 5


def test_tiny_epochs_with_more_padding_than_samples():
    """1 sample on 4 ranks: 3 of the 4 slots are copies (slots past the end wrap more than
    once); the copies are not also counted as indices that have a copy."""
    for lengths, old, new in [([1], 4, 1), ([2], 7, 3), ([1, 0, 2], 6, 4)]:
        for steps in range(2):
            stages, _ = run_chain([(old, steps), (new, None)], lengths)
            read = [Counter(i for rank in stage for i in rank) for stage in stages]
            assert not set(read[0]) & set(read[1])
            assert set(read[0]) | set(read[1]) == set(range(sum(lengths)))


def test_random_chains_of_resumes():
    """Seeded random datasets, settings and chains of world sizes: nothing read before a
    checkpoint is read after it, nothing is lost (drop_last: nothing twice), and each stage
    pads at most R - 1."""
    rng = random.Random(23)
    settings = [*SETTINGS, {"partition": "global", "num_workers": 3, "batch_size": 1}]
    for _ in range(200):
        lengths = [rng.randint(0, 9) for _ in range(rng.randint(1, 6))]
        n, kw = sum(lengths), rng.choice(settings)
        worlds = [rng.randint(1, 7) for _ in range(rng.randint(2, 4))]
        worlds = [w for k, w in enumerate(worlds) if k == 0 or w != worlds[k - 1]]
        if not n or len(worlds) < 2:
            continue
        state, reads = None, []
        for k, world in enumerate(worlds):
            samplers = ranks(world, lengths, **kw)
            for s in samplers:
                if state is not None:
                    s.load_state_dict(state)
            share = len(samplers[0]) if state is None else samplers[0].state_dict()["stages"][-1]
            steps = None
            if k < len(worlds) - 1:
                length = share if isinstance(share, int) else share["length"]
                steps = rng.randint(0, max(0, length - 1))
            read = [list(itertools.islice(iter(s), steps)) for s in samplers]
            assert len({len(r) for r in read}) == 1
            reads.append(Counter(i for r in read for i in r))
            if steps is not None:
                state = samplers[0].state_dict()
        case = (lengths, kw, worlds)
        for k in range(1, len(reads)):
            assert not set(sum(reads[:k], Counter())) & set(sum(reads[k:], Counter())), case
        for read, world in zip(reads, worlds, strict=True):
            assert (read - Counter(set(read))).total() <= world - 1, case
        served = sum(reads, Counter())
        if kw.get("drop_last"):
            assert not served or max(served.values()) == 1, case
        else:
            assert set(served) == set(range(n)), case


def test_a_forged_state_is_refused_without_working_on_it():
    """Loading costs work per rank and per worker: absurd counts are refused at once."""
    import time

    _, state = run_chain([(2, 6)])
    s = ranks(3)[0]
    start = time.perf_counter()
    for forged in [
        {**state, "num_replicas": 10**12, "length": 1},
        {**state, "num_workers": 10**12},
        {**state, "version": 2, "stages": [{**state, "position": 0}] * 5000},
        {**state, "version": 2, "stages": "x"},
        # one stage, of this world size: was an IndexError deep in the resume
        {**state, "version": 2, "num_replicas": 3, "stages": [{**state, "num_replicas": 3}]},
    ]:
        with pytest.raises(SamplerStateError):
            s.load_state_dict(forged)
    assert time.perf_counter() - start < 1
    s.load_state_dict(state)  # and the sampler still takes a good one
    assert len(list(s)) == -(-(103 - 12) // 3)


@pytest.mark.parametrize(
    "n, replicas, kw",
    [
        (103, 1 << 20, {}),  # a million ranks of one index each: every rank replayed
        (103, 131072, {}),
        (20000, 40000, {"partition": "global", "num_workers": 2, "batch_size": 1}),
        (20000, 40000, {"partition": "global"}),
    ],
    ids=["block-2^20", "block-2^17", "global-workers", "global"],
)
def test_a_state_of_more_ranks_than_samples_is_bounded(n, replicas, kw):
    """More ranks than samples make most ranks hold padding copies, each replayed to see which
    were read: forged, such a state is refused or loaded at once (the old code replayed them
    all: ~40 s for 2^20 ranks, minutes for a global order of 20,000 on 40,000 ranks)."""
    import time

    ds = Shards([n])
    s = DistributedChunkedSampler(ds, num_replicas=3, rank=0, seed=1, chunksize=100, **kw)
    length = -(-n // replicas)
    forged = {**s.state_dict(), "num_replicas": replicas, "length": length, "position": length}
    forged.update({k: v for k, v in kw.items() if k != "partition"})
    start = time.perf_counter()
    try:
        s.load_state_dict(forged)
    except SamplerStateError as e:
        assert "ranks" in str(e)
    else:
        assert list(s) == []  # every index was consumed: nothing left for the new ranks
    assert time.perf_counter() - start < 3


def test_random_chains_with_repeated_world_sizes_and_a_loader_running_ahead():
    """As test_random_chains_of_resumes, but a world size may follow itself (a resumed stage
    resumed again on the same ranks), and each rank's iterator runs up to 3 indices ahead of
    what the loop consumed (a DataLoader's prefetch): the state is saved with the consumed
    ``position``, counted from the start of the stage. Nothing read before a resume on another
    world size is read after it, nothing is lost (drop_last: nothing twice), and a world size's
    stage repeats at most its padding (R - 1), however often it was resumed on itself."""
    rng = random.Random(2311)
    settings = [
        *SETTINGS,
        {"partition": "global", "num_workers": 3, "batch_size": 1},
        {"num_workers": 3, "batch_size": 2, "drop_last": True},
    ]
    for _ in range(150):
        lengths = [rng.randint(0, 12) for _ in range(rng.randint(1, 6))]
        n, kw, epoch = sum(lengths), rng.choice(settings), rng.randint(0, 3)
        worlds = [rng.randint(1, 6) for _ in range(rng.randint(2, 5))]
        if not n:
            continue
        state, reads = None, []  # per stage: consecutive runs of one world size
        for k, world in enumerate(worlds):
            samplers = ranks(world, lengths, **kw)
            for s in samplers:
                s.set_epoch(epoch)
                if state is not None:
                    s.load_state_dict(json.loads(json.dumps(state)))
            its = [iter(s) for s in samplers]
            if k == len(worlds) - 1:
                consumed = [list(i) for i in its]
            else:
                now = samplers[0].state_dict()
                stage = now.get("stages", [now])[-1]
                steps = rng.randint(0, stage["length"] - stage["position"])
                ahead = rng.randint(0, 3) if steps else 0  # position 0 past the end: see docs
                consumed = [list(itertools.islice(i, steps + ahead))[:steps] for i in its]
                state = samplers[0].state_dict(position=stage["position"] + steps)
            assert len({len(c) for c in consumed}) == 1
            if k == 0 or world != worlds[k - 1]:
                reads.append(Counter())
            reads[-1].update(i for c in consumed for i in c)
        case = (lengths, kw, worlds, epoch)
        stages = [w for k, w in enumerate(worlds) if k == 0 or w != worlds[k - 1]]
        for k in range(1, len(reads)):
            assert not set(sum(reads[:k], Counter())) & set(sum(reads[k:], Counter())), case
        for read, world in zip(reads, stages, strict=True):
            assert (read - Counter(set(read))).total() <= world - 1, case
        served = sum(reads, Counter())
        if kw.get("drop_last"):
            assert max(served.values(), default=1) == 1, case
        else:
            assert set(served) == set(range(n)), case


def test_a_state_of_absurdly_many_workers_is_refused():
    """The old orders are replayed with their worker-aware interleaving, a step per worker for
    each chunk: 65,536 forged workers read 4,000 samples 2,400x slower (3.9 s in one run)."""
    lengths = [1000] * 4
    old = ranks(2, lengths)[0]
    state = {**old.state_dict(position=len(old) // 2), "num_workers": 1 << 16}
    new = ranks(3, lengths)[0]
    with pytest.raises(SamplerStateError, match="workers"):
        new.load_state_dict(state)
    new.load_state_dict({**state, "num_workers": 1024})  # as many as a real job could have


def test_a_later_stage_of_many_ranks_is_loaded_at_once():
    """A forged later stage of 60,000 ranks over 35,000 unread indices, all read: its ~25,000
    read copies were looked up rank by rank (47 s in one run; 2^17 ranks: minutes)."""
    import time

    n, replicas = 35000, 60000
    s = DistributedChunkedSampler(Shards([n]), num_replicas=3, rank=0, seed=1, chunksize=1000)
    stages = [
        {"num_replicas": 2, "length": -(-n // 2), "position": 0},
        {"num_replicas": replicas, "length": 1, "position": 1},
    ]
    start = time.perf_counter()
    s.load_state_dict({**s.state_dict(), "version": 2, "stages": stages})
    assert time.perf_counter() - start < 2
    assert list(s) == []  # every index was read by the 60,000 ranks


def test_stages_of_many_ranks_are_chained_at_once():
    """12,000 ranks each leave a range of the rest, which 6,000 ranks each take part of: every
    part was found by a scan from the first range (6 s in one run, quadratic in the ranks)."""
    import time

    n = 24000
    s = DistributedChunkedSampler(Shards([n]), num_replicas=3, rank=0, seed=1, chunksize=1000)
    stages = [
        {"num_replicas": 2, "length": n // 2, "position": 0},
        {"num_replicas": n // 2, "length": 2, "position": 1},  # each read 1 of its 2
        {"num_replicas": n // 4, "length": 2, "position": 1},
    ]
    start = time.process_time()
    s.load_state_dict({**s.state_dict(), "version": 2, "stages": stages})
    assert time.process_time() - start < 1
    assert s.state_dict()["stages"][-1]["length"] == -(-n // 4 // 3)
    # reading it: the rest is 6,000 parts, 2,000 of them this rank's, all from old rank 0 or 1
    # (each part replayed that rank's order: 3,700x a fresh epoch's time per index in one run)
    fresh = DistributedChunkedSampler(Shards([n]), num_replicas=3, rank=0, seed=1, chunksize=1000)
    start = time.process_time()
    assert len(list(fresh)) == n // 3
    plain = (time.process_time() - start) / (n // 3)
    start = time.process_time()
    rest = list(s)
    resumed = (time.process_time() - start) / len(rest)
    assert len(rest) == len(set(rest)) == 2000
    assert resumed < 20 * plain + 2e-6, (resumed, plain)


def test_shrinking_a_global_order_to_few_ranks_reads_the_old_orders_in_one_pass():
    """A new rank whose slice spans many old ranks of a global order: each old rank's order
    alone is made from the epoch's start up to its slice, so they are cut from one pass (was
    one pass per old rank: 512 -> 1 ranks read ~100x slower than a fresh epoch)."""
    import time

    lengths, kw = [1000] * 20, {"partition": "global", "chunksize": 100}
    old = ranks(512, lengths, **kw)[0]
    state = old.state_dict(position=len(old) // 2)
    fresh = ranks(1, lengths, **kw)[0]
    start = time.process_time()
    assert len(list(fresh)) == 20000
    plain = time.process_time() - start
    new = ranks(1, lengths, **kw)[0]
    new.load_state_dict(state)
    start = time.process_time()
    rest = list(new)
    resumed = time.process_time() - start
    assert len(rest) == len(set(rest)) == 10000  # 20 of each old rank's 40 read, no copies
    assert resumed < 10 * plain + 0.05, (resumed, plain)
