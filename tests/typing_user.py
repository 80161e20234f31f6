"""Code a user writes against the public API, checked with ``mypy --strict`` by test_typing.py.

Not collected by pytest (no ``test_`` prefix). ``main(directory)`` also runs it, so every
line here is real usage, not only something mypy accepts: it writes shards, indexes them, and
reads them through a DataLoader with each sampler.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import torch.utils.data as tud
from typing_extensions import assert_type

import wids
from wids import (
    ChunkedSampler,
    DistributedChunkedSampler,
    ShardedSampler,
    ShardInfo,
    ShardListDataset,
    ShardMembers,
    ShardWriter,
    TarWriter,
)

Sample = dict[str, Any]


def write_shards(directory: str) -> list[str]:
    """Two shards written with ``ShardWriter``, one with ``TarWriter``."""
    pattern = os.path.join(directory, "train-%06d.tar")
    with ShardWriter(pattern, maxcount=4, index=os.path.join(directory, "train.json")) as sink:
        for i in range(8):
            sink.write({"__key__": f"{i:06d}", "txt": f"sample {i}", "cls": i % 3})
    extra = os.path.join(directory, "extra-000000.tar")
    with TarWriter(extra) as tw:
        tw.write({"__key__": "x000", "txt": "extra"})
    return [pattern % 0, pattern % 1, extra]


def open_dataset(index: str) -> ShardListDataset[Sample]:
    """An annotated dataset, as the reference's users annotate it."""
    ds: ShardListDataset[Sample] = ShardListDataset(index, transformations=[])
    return ds


def read(ds: ShardListDataset[Sample]) -> list[str]:
    """Samples by index, with their metadata keys."""
    sample = ds[0]
    assert_type(sample, Sample)
    keys: list[str] = [ds[i]["__key__"] for i in range(len(ds))]
    shard: str = sample["__shard__"]
    assert shard and sample["__index__"] == 0 and sample["__shardindex__"] == 0
    lengths: list[int] = ds.lengths
    assert sum(lengths) == ds.total_length
    return keys


def batches(ds: ShardListDataset[Sample]) -> Iterator[list[Sample]]:
    """A DataLoader over the dataset with each sampler."""
    samplers: list[ChunkedSampler] = [
        ChunkedSampler(ds, chunksize=3, seed=1),
        DistributedChunkedSampler(ds, num_replicas=2, rank=0, shuffle=False),
        ShardedSampler(ds),
    ]
    for sampler in samplers:
        sampler.set_epoch(1)
        loader: tud.DataLoader[Sample] = tud.DataLoader(
            ds, batch_size=2, sampler=sampler, collate_fn=list
        )
        yield from loader


def concatenated(a: ShardListDataset[Sample], b: ShardListDataset[Sample]) -> int:
    """``+`` as with any torch Dataset."""
    both: tud.ConcatDataset[Any] = a + b
    torch_ds: tud.Dataset[Sample] = a
    return len(both) + (1 if torch_ds is a else 0)


def own_index(directory: str, shard: str) -> str:
    """An index written with offsets already known (here: the one ``TarWriter`` recorded)."""
    with TarWriter(os.path.join(directory, "own-000000.tar")) as tw:
        tw.write({"__key__": "k0", "txt": "zero"})
        tw.write({"__key__": "k1", "txt": "one"})
        members: ShardMembers = tw.members()
    size = os.path.getsize(os.path.join(directory, "own-000000.tar"))
    out = os.path.join(directory, "own.sqlite")
    with wids.write_index(out, name="own") as writer:
        writer.add(ShardInfo("own-000000.tar", len(members), size=size), members)
    with wids.create_index_writer(os.path.join(directory, "own.json")) as low:
        low.add(ShardInfo("own-000000.tar", len(members), size=size), members)
    return out


def errors(ds: ShardListDataset[Sample]) -> str:
    """Typed errors, caught either as ``WidsError`` or as the builtin."""
    try:
        ds[len(ds)]
    except IndexError as e:
        return str(e)
    except wids.WidsError as e:
        shard: str | None = e.shard
        return shard or ""
    return ""


def main(directory: str) -> None:
    """Run all of the above; raises on any wrong answer."""
    shards = write_shards(directory)
    ds = open_dataset(os.path.join(directory, "train.json"))
    assert read(ds) == [f"{i:06d}" for i in range(8)]
    assert sum(len(b) for b in batches(ds)) == 8 + 4 + 8
    assert concatenated(ds, ds) == 17
    report: wids.BuildReport = wids.build_index(shards, os.path.join(directory, "all.json"))
    assert report.shards == 3
    own = open_dataset(own_index(directory, shards[0]))
    assert [s["__key__"] for s in (own[0], own[1])] == ["k0", "k1"]
    assert errors(ds)
    ds.close()
    version: str = wids.__version__
    assert version


if __name__ == "__main__":
    main(sys.argv[1])
