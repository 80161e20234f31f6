"""The training scripts behind tests/test_frameworks.py: PyTorch Lightning and HF Accelerate.

Usage:
  python tests/frameworks_job.py lightning SHARDS.json OUTDIR
      (Lightning's ``strategy="ddp"`` starts the second rank by running this script again)
  torchrun --nproc_per_node=2 tests/frameworks_job.py accelerate SHARDS.json OUTDIR

Each rank writes OUTDIR/<mode>-rank<r>.json: for every run, the indices of every step of every
epoch, as the training step (Lightning) or loop (Accelerate) received them. The test asserts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from wids import ChunkedSampler, DistributedChunkedSampler, SamplerWrappedError, ShardListDataset

BATCH = 4
EPOCHS = 2


def dataset(shards: str) -> ShardListDataset:
    return ShardListDataset(json.loads(Path(shards).read_text()), transformations=[])


def dump(outdir: Path, mode: str, rank: int, result: dict) -> None:
    (outdir / f"{mode}-rank{rank}.json").write_text(json.dumps(result))


def lightning(shards: str, outdir: Path) -> None:
    import pytorch_lightning as L

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            # the code a user writes: the process group is up, the sampler reads the rank
            ds = dataset(shards)
            return DataLoader(ds, sampler=DistributedChunkedSampler(ds, seed=5), batch_size=BATCH)

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: dict[int, list[list[int]]] = {}

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            indices = batch["__index__"].tolist()
            self.seen.setdefault(self.current_epoch, []).append(indices)
            return (self.w * float(len(indices))).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    model = Model()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=EPOCHS,
        default_root_dir=str(outdir),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=Data())
    sampler = trainer.train_dataloader.sampler
    dump(
        outdir,
        "lightning",
        trainer.global_rank,
        {
            "natural": {str(e): steps for e, steps in model.seen.items()},
            "sampler": type(sampler).__name__,
        },
    )


def run_epochs(loader: DataLoader, set_epoch: object = None) -> dict[str, list[list[int]]]:
    seen: dict[str, list[list[int]]] = {}
    for epoch in range(EPOCHS):
        if set_epoch is not None:
            set_epoch(epoch)
        seen[str(epoch)] = [batch["__index__"].tolist() for batch in loader]
    return seen


def accelerate(shards: str, outdir: Path) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    ds = dataset(shards)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    result: dict = {}

    # 1. the natural code: the prepared loader would keep every 2nd batch of this rank's share
    sampler = DistributedChunkedSampler(ds, seed=5)
    loader = accelerator.prepare(DataLoader(ds, sampler=sampler, batch_size=BATCH))
    try:
        result["natural"] = run_epochs(loader)
    except SamplerWrappedError as e:
        result["natural_error"] = [type(e).__name__, str(e)]

    # 2. recipe: the loader stays out of prepare(); the sampler is per rank
    sampler = DistributedChunkedSampler(ds, seed=5)
    loader = DataLoader(ds, sampler=sampler, batch_size=BATCH, num_workers=2)
    result["unprepared"] = run_epochs(loader, sampler.set_epoch)

    # 3. recipe: one order for all ranks, batches handed out so each rank reads its own chunks
    sampler = ChunkedSampler(
        ds, chunksize=8, seed=5, num_workers=accelerator.num_processes, batch_size=BATCH
    )
    loader = accelerator.prepare(DataLoader(ds, sampler=sampler, batch_size=BATCH))
    result["prepared_chunked"] = run_epochs(loader)  # accelerate calls set_epoch itself
    dump(outdir, "accelerate", accelerator.process_index, result)


if __name__ == "__main__":
    mode, shards_arg, outdir_arg = sys.argv[1:4]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    {"lightning": lightning, "accelerate": accelerate}[mode](shards_arg, Path(outdir_arg))
