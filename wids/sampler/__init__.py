"""Index orders for map-style shard datasets: chunked, shard-local, distributed, resumable.

Every sampler here turns a dataset's shard lengths into one order of sample indices per epoch:

- the index range (all samples, or ``num_samples``) is cut into *chunks* that never cross a
  shard boundary and hold at most ``chunksize`` samples (``chunking="fixed"`` restores the
  reference's fixed-size chunks that ignore shards);
- each epoch draws from ``random.Random(seed + 1289738273 * epoch)``: first the chunk order is
  shuffled (only when ``shuffle`` and either ``shufflefirst`` or ``epoch > 0``), then the
  indices inside each chunk, chunk by chunk, when ``shuffle``;
- a complete pass advances the epoch by one (the reference's behaviour), also after a
  ``set_epoch`` call, which sets the epoch of the next pass (``auto_epoch=False``: never
  advance); every rank makes the same passes, so every rank has the same epoch;
- ``len(sampler)`` is exact and the same on every rank; ``state_dict()`` /
  ``load_state_dict()`` resume in the middle of an epoch, also on another number of ranks.

``DistributedChunkedSampler`` partitions the range over ranks: by default each rank keeps the
same contiguous block every epoch (``partition="block"``, good for shard caches), or the
shuffled chunk sequence of the whole range is cut into one slice per rank anew every epoch
(``partition="global"``). ``drop_last=False`` pads the last rank(s) by wrapping around to the
start of the range, as ``torch.utils.data.DistributedSampler`` does; ``drop_last=True`` drops
the tail. ``mix=True`` draws from the dataset's weighted sub-datasets (``dataset.components``)
in proportion to their weights. ``num_workers`` / ``batch_size`` arrange the order so that each
DataLoader worker reads its own chunks.

Mixing (``mix=True``): an epoch still has ``n`` samples (the size of the range). Component
``i`` (its weight, 1.0 when ``None``) gets ``round(n * w_i / sum(w))`` of them (largest
remainder, so they add up to ``n``), drawn *without replacement by passes*: whole passes over
the component, then randomly chosen chunks of it for the remainder (the last one cut short), so
within an epoch the counts of a component's samples differ by at most one. The selected chunks
are shuffled together every epoch (also epoch 0) and partitioned with ``partition="global"``.

Cost: an epoch's order is generated lazily, one chunk at a time; resuming at position ``p``
replays the shuffles up to ``p``. Memory is proportional to shards (int64 arrays: 16 bytes a
shard), never to samples. Epochs of up to 2**20 indices get exactly the reference's orders
(``random.shuffle`` of the chunk order and of each chunk, one random stream). Larger epochs
shuffle chunk orders, and chunks of more than 2**16 indices, with a lazy keyed permutation;
with ``partition="global"`` or ``mix`` each chunk's shuffle is also keyed by its position, so a
rank reaches its slice by adding chunk sizes instead of generating every index before it
(:mod:`.skip`); ``mix`` picks its remainder chunks the same way (one pass over the picked
chunks' sizes, in numpy blocks).
Worker-aware ordering holds only the chunks handed to workers and not yet consumed.
``DistributedChunkedSampler`` subclasses ``torch.utils.data.DistributedSampler`` when torch is
installed, so PyTorch Lightning passes it through instead of wrapping it in its own distributed
sampler; its module (and so torch) is imported on first use of the name, and ``ChunkedSampler``
/ ``ShardedSampler`` never import torch. A wrapper that re-splits its batches across ranks
(HF Accelerate's ``accelerator.prepare(loader)``) is detected on first iteration and refused
with :class:`~wids.errors.SamplerWrappedError` (:mod:`.resplit`).

The package's modules: :mod:`.chunks` (chunk sequences as int64 arrays, shuffles with a lazy
permutation, wrapped slices, mixing quotas), :mod:`.picks` (mixing's remainder chunks),
:mod:`.skip` (entering a long epoch at a rank's slice), :mod:`.workers` (the order that gives
each DataLoader worker its own chunks), :mod:`.elastic` (the rest of an epoch resumed on another
world size: what the old ranks consumed, what each new rank reads), :mod:`.chunked`
(:class:`ChunkedSampler`, its epochs and resumable state), :mod:`.distributed`
(:class:`DistributedChunkedSampler`, the world from ``torch.distributed``), :mod:`.resplit`
(frameworks that would split a rank's share again), :mod:`.sharded` (:class:`ShardedSampler`)
and :mod:`.bucket` (:class:`BucketBatchSampler`: batches of one bucket of a per-sample key, from
the same shard-local chunks, with exact per-rank lengths).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .bucket import BucketBatchSampler
from .chunked import ChunkedSampler
from .sharded import ShardedSampler

if TYPE_CHECKING:
    from .distributed import DistributedChunkedSampler

__all__ = ["BucketBatchSampler", "ChunkedSampler", "DistributedChunkedSampler", "ShardedSampler"]


def __getattr__(name: str) -> Any:
    """``DistributedChunkedSampler`` on first use: its module imports torch if installed."""
    if name != "DistributedChunkedSampler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .distributed import DistributedChunkedSampler

    return DistributedChunkedSampler
