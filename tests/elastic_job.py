"""The torchrun job behind tests/test_sampler_elastic.py's real-process runs (gloo, CPU).

Usage: torchrun --nproc_per_node=R tests/elastic_job.py SHARDS.json OUTDIR NAME LOADER WORKERS
[STEPS]

Every rank reads epoch 1 through a DataLoader (``LOADER``: ``plain`` for torch's DataLoader,
``stateful`` for torchdata's StatefulDataLoader) with WORKERS workers. With STEPS the loop stops
after STEPS batches (a checkpoint) and rank 0 saves its state to OUTDIR/NAME-state.pt: the
sampler's ``state_dict(position=STEPS * BATCH)``, or the StatefulDataLoader's ``state_dict()``.
Without STEPS every rank first loads the state named by the environment variable
``ELASTIC_STATE`` (saved on another world size), reads the rest of the epoch, then epoch 2.
Rank 0 writes what every rank read (``all_gather_object``) to OUTDIR/NAME.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from dist_sampler_job import settle_threads  # this script's directory is on sys.path
from torch.utils.data import DataLoader

from wids import DistributedChunkedSampler, ShardListDataset

BATCH = 4


def indices(batch) -> list[int]:
    keys, got = batch["__key__"], batch["__index__"].tolist()
    assert [int(k.split("-")[1]) for k in keys] == got, (keys, got)  # the samples asked for
    return got


def gather(value):
    result = [None] * dist.get_world_size()
    dist.all_gather_object(result, value)
    return result


def main() -> None:
    shards_json, outdir, name, kind, workers = sys.argv[1:6]
    steps = int(sys.argv[6]) if len(sys.argv) > 6 else None
    dist.init_process_group("gloo")
    with open(shards_json) as f:
        ds = ShardListDataset(json.load(f), transformations=[])
    sampler = DistributedChunkedSampler(ds, seed=11, chunksize=8)  # world from the group
    sampler.set_epoch(1)
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(ds, sampler=sampler, batch_size=BATCH, num_workers=int(workers))
    else:
        loader = DataLoader(ds, sampler=sampler, batch_size=BATCH, num_workers=int(workers))
    if steps is None:  # every rank loads the one state rank 0 of the old job saved
        state = torch.load(os.environ["ELASTIC_STATE"], weights_only=False)
        (loader if kind == "stateful" else sampler).load_state_dict(state)
    read, result = [], {}
    for batch in loader:
        read.append(indices(batch))
        if len(read) == steps:
            break
    result["epoch1"] = gather(read)
    if steps is not None and dist.get_rank() == 0:
        saved = (
            sampler.state_dict(position=steps * BATCH) if kind == "plain" else loader.state_dict()
        )
        torch.save(saved, os.path.join(outdir, f"{name}-state.pt"))
    if steps is None:  # the epoch after the resumed one
        settle_threads()
        result["epoch2"] = gather([indices(b) for b in loader])
        result["epoch"] = sampler.epoch
    result["len"] = len(sampler)
    if dist.get_rank() == 0:
        with open(os.path.join(outdir, f"{name}.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
