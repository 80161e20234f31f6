"""The torchrun job behind tests/test_distributed.py (gloo, CPU, 2 DataLoader workers per rank).

Usage: torchrun --nproc_per_node=2 tests/dist_sampler_job.py SHARDS.json OUTDIR PHASE

PHASE ``run``: full epochs for several sampler settings, a partial epoch whose state is saved,
and torch's own DistributedSampler; ``resume``: a fresh process loads the saved state and
reads the rest of that epoch. Rank 0 writes what every rank saw (``all_gather_object``) to
OUTDIR/PHASE.json; the test asserts on it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from wids import DistributedChunkedSampler, ShardListDataset

BATCH = 4
WORKERS = 2
PARTIAL_STEPS = 5
SETTINGS = {
    "block-drop": dict(drop_last=True),
    "block-pad": dict(drop_last=False),
    "global-drop": dict(drop_last=True, partition="global"),
    "global-pad": dict(drop_last=False, partition="global"),
    "workers": dict(drop_last=False, num_workers=WORKERS, batch_size=BATCH),
}


def sampler(ds: ShardListDataset, setting: str) -> DistributedChunkedSampler:
    # num_replicas and rank come from the process group
    return DistributedChunkedSampler(ds, chunksize=8, seed=11, **SETTINGS[setting])


def settle_threads() -> None:
    """Wait for the previous DataLoader's queue feeder threads to end before forking again.

    On CPython 3.11 a fork while another thread is tearing down its thread state can leave
    the child stuck in ``PyOS_AfterFork_Child`` (fixed in 3.12); torch's DataLoader closes
    its index queues without joining their feeder threads, so back-to-back loaders race.
    """
    gc.collect()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and thread.name == "QueueFeederThread":
            thread.join(timeout=10)


def read(ds, sampler, steps=None):
    """Run a DataLoader; return the indices read per step (from the samples' keys)."""
    settle_threads()
    loader = DataLoader(ds, sampler=sampler, batch_size=BATCH, num_workers=WORKERS)
    out = []
    it = iter(loader)
    for batch in it:
        keys = batch["__key__"]
        indices = batch["__index__"].tolist()
        assert [int(k.split("-")[1]) for k in keys] == indices, (keys, indices)
        out.append(indices)
        if steps is not None and len(out) == steps:
            break
    del it, loader
    settle_threads()
    return out


def gather(value):
    result = [None] * dist.get_world_size()
    dist.all_gather_object(result, value)
    return result


def main() -> None:
    shards_json, outdir, phase = sys.argv[1:4]
    dist.init_process_group("gloo")
    with open(shards_json) as f:
        ds = ShardListDataset(json.load(f), transformations=[])
    result = {}
    if phase == "run":
        for setting in SETTINGS:
            s = sampler(ds, setting)
            s.set_epoch(1)
            result[setting] = {"len": len(s), "steps": gather(read(ds, s))}
        # a partial epoch: the loop reached PARTIAL_STEPS steps; the loader had prefetched more
        s = sampler(ds, "block-pad")
        s.set_epoch(2)
        full = read(ds, s)
        s.set_epoch(2)
        partial = read(ds, s, steps=PARTIAL_STEPS)
        state = s.state_dict(position=PARTIAL_STEPS * BATCH)
        with open(os.path.join(outdir, f"state-{dist.get_rank()}.json"), "w") as f:
            json.dump(state, f)
        result["epoch2"] = {"full": gather(full), "partial": gather(partial)}
        torch_sampler = DistributedSampler(ds, shuffle=True, seed=3)
        torch_sampler.set_epoch(1)
        result["torch"] = {"len": len(torch_sampler), "steps": gather(read(ds, torch_sampler))}
    else:
        s = sampler(ds, "block-pad")
        with open(os.path.join(outdir, f"state-{dist.get_rank()}.json")) as f:
            s.load_state_dict(json.load(f))
        s.set_epoch(2)  # a training loop's usual call: the saved epoch keeps its position
        rest = read(ds, s)
        s.set_epoch(3)
        result["epoch2"] = {"rest": gather(rest), "next": gather(read(ds, s))}
    if dist.get_rank() == 0:
        with open(os.path.join(outdir, f"{phase}.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
