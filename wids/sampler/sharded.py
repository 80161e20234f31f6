"""One chunk per shard: the shard order shuffled, then the indices inside each shard."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from .chunked import ChunkedSampler, _Lengths
from .chunks import _Pairs

__all__ = ["ShardedSampler"]


class ShardedSampler(ChunkedSampler):
    """One chunk per shard: the shard order shuffled, then the indices inside each shard.

    The shard order is shuffled after epoch 0, or from the start with ``shufflefirst``. As in
    the reference, each complete pass advances the epoch until ``set_epoch`` is first called.

    Args:
        dataset: As for :class:`ChunkedSampler` (a dataset without ``.lengths`` is one
            shard); may be ``None`` when ``lengths`` is given.
        lengths: Per-shard sample counts, instead of the dataset's.
        seed: As for :class:`ChunkedSampler`.
        shufflefirst: Shuffle the shard order at epoch 0 too.
        auto_epoch: As for :class:`ChunkedSampler`.
    """

    def __init__(
        self,
        dataset: Any = None,
        *,
        lengths: Sequence[int] | None = None,
        seed: int = 0,
        shufflefirst: bool = False,
        auto_epoch: bool | None = None,
    ) -> None:
        super().__init__(
            dataset if lengths is None else _Lengths(lengths),
            chunksize=sys.maxsize,
            seed=seed,
            shufflefirst=shufflefirst,
            auto_epoch=auto_epoch,
        )
        # keep empty shards as (a, a) ranges: they take part in the shard shuffle, as before
        self.ranges = _Pairs(self._cuts)
