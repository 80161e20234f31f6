"""The sampler for one rank of a distributed job, and where its world comes from."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .chunked import ChunkedSampler, Chunking, Partition
from .resplit import refuse_resplit

if TYPE_CHECKING:
    from torch.utils.data import DistributedSampler as _Base
else:
    try:
        # Lightning (and anything else asking ``isinstance(sampler, DistributedSampler)``) then
        # knows the order is already per rank and leaves it alone instead of splitting it again.
        from torch.utils.data import DistributedSampler as _Base
    except ImportError:  # torch is optional: without it the sampler is a plain object
        _Base = object

__all__ = ["DistributedChunkedSampler"]


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Fill ``num_replicas`` / ``rank`` from ``torch.distributed`` where they are ``None``."""
    if num_replicas is None or rank is None:
        dist = _initialised_dist()
        if dist is not None:
            # attribute look-ups at call time, so patched get_rank/get_world_size are honoured
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        elif num_replicas is None and rank is None:
            num_replicas, rank = 1, 0
        else:
            raise ValueError(
                "torch.distributed is not initialised: give both num_replicas and rank, or neither"
            )
    replicas, index = operator.index(num_replicas), operator.index(rank)  # type: ignore[arg-type]
    if replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {replicas}")
    if not 0 <= index < replicas:
        raise ValueError(f"rank must be in [0, {replicas - 1}], got {index}")
    return replicas, index


def _initialised_dist() -> Any:
    """The ``torch.distributed`` module if torch is installed and a process group is up."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


class DistributedChunkedSampler(ChunkedSampler, _Base):
    """A :class:`ChunkedSampler` for one rank of a distributed job.

    When torch is installed this is a ``torch.utils.data.DistributedSampler`` (with its
    attributes ``num_replicas``, ``rank``, ``epoch``, ``seed``, ``shuffle``, ``drop_last``,
    ``num_samples`` = ``len(self)`` and ``total_size``, but not ``dataset``; the order is this
    class's), so PyTorch
    Lightning's ``Trainer`` (``use_distributed_sampler=True``, the default) uses it as it is and
    calls ``set_epoch`` every epoch. HF Accelerate's ``accelerator.prepare(loader)`` would keep
    only every ``R``-th batch of this rank's share: iterating under it raises
    :class:`~wids.errors.SamplerWrappedError` (found through Accelerate's public state, see
    :mod:`wids.sampler.resplit`).

    With ``partition="block"`` (the default) rank ``r`` owns positions
    ``[r * L, (r + 1) * L)`` of the range, ``L = len(sampler)``, every epoch, so its shard
    cache keeps serving it; its chunks are shuffled as in :class:`ChunkedSampler`. With
    ``partition="global"`` the whole range's chunk sequence is shuffled each epoch and rank
    ``r`` takes positions ``[r * L, (r + 1) * L)`` of it. ``drop_last=False``:
    ``L = ceil(n / R)`` and positions past the end wrap around to the start of the range (at
    most ``R - 1`` indices repeat per epoch); ``drop_last=True``: ``L = floor(n / R)`` and the
    last ``n mod R`` positions are dropped. Every rank must use the same seed.

    Args:
        dataset: As for :class:`ChunkedSampler`.
        num_replicas: Number of ranks; ``None``: ``torch.distributed.get_world_size()`` if a
            process group is initialised, else 1.
        rank: This rank; ``None``: ``torch.distributed.get_rank()`` if a process group is
            initialised, else 0. Explicit values always win.
        num_samples: As for :class:`ChunkedSampler`; partitioned over the ranks.
        shuffle: As for :class:`ChunkedSampler`.
        shufflefirst: As for :class:`ChunkedSampler`.
        seed: As for :class:`ChunkedSampler`.
        drop_last: ``True`` drops the tail so every rank has ``floor(n / R)`` indices;
            ``False`` or ``None`` pads to ``ceil(n / R)``.
        chunksize: As for :class:`ChunkedSampler`.
        chunking: As for :class:`ChunkedSampler`.
        partition: ``"block"`` or ``"global"``; ``None``: ``"global"`` with ``mix``, else
            ``"block"``.
        mix: As for :class:`ChunkedSampler` (needs ``partition="global"``).
        num_workers: As for :class:`ChunkedSampler`.
        batch_size: As for :class:`ChunkedSampler`.
        auto_epoch: As for :class:`ChunkedSampler`.

    Raises:
        ValueError: For a bad ``num_replicas`` or ``rank``, only one of them given without an
            initialised process group, or a bad option.
        SamplerWrappedError: On iteration, under a wrapper that splits the batches across ranks
            again.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        num_samples: int | tuple[int, int] | None = None,
        shuffle: bool = True,
        shufflefirst: bool = False,
        seed: int = 0,
        drop_last: bool | None = None,
        chunksize: int = 1000000,
        chunking: Chunking = "shard",
        partition: Partition | None = None,
        mix: bool = False,
        num_workers: int = 0,
        batch_size: int = 1,
        auto_epoch: bool | None = None,
    ) -> None:
        self.num_replicas, self.rank = _world(num_replicas, rank)
        self.drop_last, self.partition = bool(drop_last), partition
        super().__init__(
            dataset,
            num_samples=num_samples,
            chunksize=chunksize,
            seed=seed,
            shuffle=shuffle,
            shufflefirst=shufflefirst,
            chunking=chunking,
            mix=mix,
            num_workers=num_workers,
            batch_size=batch_size,
            auto_epoch=auto_epoch,
        )
        # what torch's DistributedSampler holds, for code that reads it (the values are ours;
        # no ``dataset``: the sampler reads it only when an iteration starts)
        self.num_samples = self._length
        self.total_size = self._length * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        refuse_resplit(self)
        return super().__iter__()
