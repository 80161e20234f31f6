"""The torchrun job behind tests/test_sampler_bucket.py's distributed tests (gloo, CPU).

Usage: torchrun --nproc_per_node=R tests/bucket_job.py INDEX KEYS.json OUTDIR PHASE WORKERS

PHASE ``run``: a full epoch with :class:`wids.BucketBatchSampler` (world size and rank from the
process group), then a partial epoch whose state (rank 0's, at the step the loop reached) is
saved, then a loader prepared by HF Accelerate; ``resume`` (on any world size): a fresh process
loads that state and reads the rest of the epoch, then the next epoch. Rank 0 writes what every
rank read (``all_gather_object``) to OUTDIR/PHASE.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from dist_sampler_job import gather, settle_threads
from torch.utils.data import DataLoader

from wids import BucketBatchSampler, ShardListDataset

BATCH = 4
PARTIAL_STEPS = 3


def _collate(batch):
    """Each sample's index and the aspect ratio its ``.json`` bytes carry."""
    out = []
    for s in batch:
        meta = json.loads(s[".json"])
        out.append((s["__index__"], meta["width"] / meta["height"]))
    return out


def read(ds, sampler, workers, steps=None):
    settle_threads()
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=workers, collate_fn=_collate)
    out = []
    it = iter(loader)
    for batch in it:
        out.append(batch)
        if steps is not None and len(out) == steps:
            break
    del it, loader
    settle_threads()
    return out


def accelerate(ds, keys):
    """accelerator.prepare(loader) would keep every R-th batch of the rank's share: refused."""
    from accelerate import Accelerator

    from wids import SamplerWrappedError

    accelerator = Accelerator(cpu=True)
    sampler = BucketBatchSampler(ds, keys, batch_size=BATCH, num_buckets=4, seed=5)
    loader = accelerator.prepare(DataLoader(ds, batch_sampler=sampler, collate_fn=_collate))
    try:
        return ["read", len(list(loader))]
    except SamplerWrappedError as e:
        return [type(e).__name__, str(e)]


def main() -> None:
    index, keys_json, outdir, phase, workers = sys.argv[1:6]
    workers = int(workers)
    dist.init_process_group("gloo")
    with open(keys_json) as f:
        keys = json.load(f)
    ds = ShardListDataset(index, transformations=[])
    sampler = BucketBatchSampler(ds, keys, batch_size=BATCH, num_buckets=4, seed=5)
    result = {"len": gather(len(sampler)), "replicas": gather(sampler.num_replicas)}
    state_path = os.path.join(outdir, "state.json")
    if phase == "run":
        sampler.set_epoch(1)
        result["epoch1"] = gather(read(ds, sampler, workers))
        sampler.set_epoch(2)
        result["partial"] = gather(read(ds, sampler, workers, steps=PARTIAL_STEPS))
        if dist.get_rank() == 0:
            with open(state_path, "w") as f:
                json.dump(sampler.state_dict(position=PARTIAL_STEPS), f)
        result["accelerate"] = gather(accelerate(ds, keys))
    else:
        with open(state_path) as f:
            sampler.load_state_dict(json.load(f))
        sampler.set_epoch(2)  # a training loop's usual call: the saved epoch keeps its position
        result["rest"] = gather(read(ds, sampler, workers))
        result["next"] = gather(read(ds, sampler, workers))
    if dist.get_rank() == 0:
        with open(os.path.join(outdir, f"{phase}.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
