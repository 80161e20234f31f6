"""Real distributed runs: torchrun, 2 ranks (gloo, CPU), 2 DataLoader workers per rank, tar shards
read through ShardListDataset. The job itself is tests/dist_sampler_job.py."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest
from procgroup import run_group

from wids.synth import write_shard

LENGTHS = [13, 20, 7, 25, 16, 22]  # 103 samples: uneven shards, odd total
N = sum(LENGTHS)
RANKS = 2
JOB = Path(__file__).with_name("dist_sampler_job.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(shards_json: Path, outdir: Path, phase: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={RANKS}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(JOB),
        str(shards_json),
        str(outdir),
        phase,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_group(cmd, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((outdir / f"{phase}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    shards, index = [], 0
    for s, n in enumerate(LENGTHS):
        path = root / f"part-{s:02d}.tar"
        members = []
        for _ in range(n):
            key = f"s{s}-{index:06d}"
            members += [(f"{key}.cls", str(s).encode()), (f"{key}.txt", key.encode())]
            index += 1
        write_shard(str(path), members)
        shards.append({"url": str(path), "nsamples": n})
    shards_json = root / "shards.json"
    shards_json.write_text(json.dumps(shards))
    run = torchrun(shards_json, root, "run")
    resume = torchrun(shards_json, root, "resume")
    return run, resume


def flat(steps):
    return [i for step in steps for i in step]


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["block-drop", "block-pad", "global-drop", "global-pad"])
def test_every_sample_once_up_to_documented_padding(runs, setting):
    result = runs[0][setting]
    per_rank = [flat(steps) for steps in result["steps"]]
    # both ranks take the same number of steps, and len() told the truth
    assert len({len(steps) for steps in result["steps"]}) == 1
    assert [len(p) for p in per_rank] == [result["len"]] * RANKS
    counts = Counter(i for p in per_rank for i in p)
    if setting.endswith("drop"):
        assert result["len"] == N // RANKS
        assert max(counts.values()) == 1 and len(counts) == RANKS * (N // RANKS)
    else:
        assert result["len"] == -(-N // RANKS)
        assert set(counts) == set(range(N))
        padding = counts - Counter(range(N))
        assert padding.total() == RANKS * result["len"] - N == 1
        if setting == "block-pad":  # the last rank wraps around to the start of the range
            assert padding == Counter([0])
        else:  # the rank slices of the shuffled global sequence wrap around to its start
            seq = per_rank[0] + per_rank[1]
            assert seq[N] == seq[0]


@pytest.mark.slow
def test_worker_aware_order_under_torchrun(runs):
    result = runs[0]["workers"]
    per_rank = [flat(steps) for steps in result["steps"]]
    assert [len(p) for p in per_rank] == [result["len"]] * RANKS
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(N))


@pytest.mark.slow
def test_resume_in_a_new_process_yields_the_rest_of_the_epoch(runs):
    run, resume = runs
    full = run["epoch2"]["full"]
    for rank in range(RANKS):
        done = flat(run["epoch2"]["partial"][rank])
        rest = flat(resume["epoch2"]["rest"][rank])
        assert len(done) == 5 * 4
        assert done + rest == flat(full[rank])
    # then training continues normally: the next epoch is a full, different epoch
    nxt = [flat(s) for s in resume["epoch2"]["next"]]
    assert [len(p) for p in nxt] == [len(flat(full[0]))] * RANKS
    assert set(nxt[0]) | set(nxt[1]) == set(range(N)) and nxt[0] != flat(full[0])


@pytest.mark.slow
def test_torch_distributed_sampler_reads_the_dataset(runs):
    result = runs[0]["torch"]
    per_rank = [flat(steps) for steps in result["steps"]]
    assert [len(p) for p in per_rank] == [result["len"]] * RANKS == [52, 52]
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(N))
