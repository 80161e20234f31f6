"""Index orders for map-style shard datasets: chunked, shard-local, distributed, resumable.

Every sampler here turns a dataset's shard lengths into one order of sample indices per epoch:

- the index range (all samples, or ``num_samples``) is cut into *chunks* that never cross a
  shard boundary and hold at most ``chunksize`` samples (``chunking="fixed"`` restores the
  reference's fixed-size chunks that ignore shards);
- each epoch draws from ``random.Random(seed + 1289738273 * epoch)``: first the chunk order is
  shuffled (only when ``shuffle`` and either ``shufflefirst`` or ``epoch > 0``), then the
  indices inside each chunk, chunk by chunk, when ``shuffle``;
- the epoch changes only through ``set_epoch`` (or ``auto_epoch=True``, the reference's bump
  after a complete pass), so every rank computes the same order;
- ``len(sampler)`` is exact and the same on every rank; ``state_dict()`` /
  ``load_state_dict()`` resume in the middle of an epoch.

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
replays the shuffles up to ``p``. ``partition="global"`` and ``mix`` make every rank generate
the sequence up to the end of its slice. Memory is proportional to shards (and, with ``mix``,
to the chunks drawn for a remainder), never to samples: chunks are computed on demand, and a
chunk order or a chunk of more than 2**20 elements is shuffled by a lazy keyed permutation
instead of ``random.shuffle`` (below that size orders are exactly the reference's).
Worker-aware ordering holds only the chunks handed to workers and not yet consumed.
``DistributedChunkedSampler`` subclasses ``torch.utils.data.DistributedSampler`` when torch is
installed, so PyTorch Lightning passes it through instead of wrapping it in its own distributed
sampler; its module (and so torch) is imported on first use of the name, and ``ChunkedSampler``
/ ``ShardedSampler`` never import torch. A wrapper that re-splits its batches across ranks
(HF Accelerate's ``accelerator.prepare(loader)``) is detected on first iteration and refused
with :class:`~wids.errors.SamplerWrappedError` (:mod:`.resplit`).

The package's modules: :mod:`.chunks` (chunk sequences, shuffles with a lazy permutation past
2**20 elements, wrapped slices, mixing quotas), :mod:`.workers` (the order that gives each
DataLoader worker its own chunks), :mod:`.chunked` (:class:`ChunkedSampler`, its epochs and
resumable state), :mod:`.distributed` (:class:`DistributedChunkedSampler`, the world from
``torch.distributed``), :mod:`.resplit` (frameworks that would split a rank's share again) and
:mod:`.sharded` (:class:`ShardedSampler`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .chunked import ChunkedSampler
from .sharded import ShardedSampler

if TYPE_CHECKING:
    from .distributed import DistributedChunkedSampler

__all__ = ["ChunkedSampler", "DistributedChunkedSampler", "ShardedSampler"]


def __getattr__(name: str) -> Any:
    """``DistributedChunkedSampler`` on first use: its module imports torch if installed."""
    if name != "DistributedChunkedSampler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .distributed import DistributedChunkedSampler

    return DistributedChunkedSampler
