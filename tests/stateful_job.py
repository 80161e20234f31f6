"""The processes behind tests/test_frameworks_stateful.py: torchdata's StatefulDataLoader.

Usage: python tests/stateful_job.py SHARDS.json OUTDIR CONTEXT PHASE

CONTEXT is the workers' multiprocessing context (``fork`` or ``spawn``). PHASE ``save``: read
STEPS batches of epoch 1, save the loader's ``state_dict()`` to OUTDIR/state-CONTEXT.pt, then
read the rest of the epoch; ``resume``: a new process loads that state into a new loader and
reads what is left. Each phase writes the batches it read (and after what) as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from wids import ChunkedSampler, ShardListDataset

BATCH, WORKERS, STEPS, EPOCH = 4, 2, 5, 1


def loader(shards: str, context: str) -> StatefulDataLoader:
    ds = ShardListDataset(json.loads(Path(shards).read_text()), transformations=[])
    sampler = ChunkedSampler(ds, chunksize=8, seed=3)
    sampler.set_epoch(EPOCH)
    return StatefulDataLoader(
        ds, sampler=sampler, batch_size=BATCH, num_workers=WORKERS,
        multiprocessing_context=context,
    )  # fmt: skip


def main(shards: str, outdir: Path, context: str, phase: str) -> None:
    dl = loader(shards, context)
    state_file = outdir / f"state-{context}.pt"
    before: list[list[int]] = []
    if phase == "resume":
        dl.load_state_dict(torch.load(state_file, weights_only=False))
    it = iter(dl)
    if phase == "save":
        for _ in range(STEPS):
            before.append(next(it)["__index__"].tolist())
        torch.save(dl.state_dict(), state_file)
    after = [batch["__index__"].tolist() for batch in it]
    (outdir / f"{phase}-{context}.json").write_text(json.dumps({"before": before, "after": after}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4])
