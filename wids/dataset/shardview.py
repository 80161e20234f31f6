"""One shard of a dataset, as ``ShardListDataset.get_shard`` returns it."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from .catalog import Catalog

__all__ = ["ShardView"]


class ShardView:
    """One shard of a dataset: ``len()`` and raw ``[j]``.

    Args:
        catalog: The dataset's catalog (shard lengths and URLs).
        raw: Reads the raw sample at a global index of the dataset.
        shard: The shard's position in the dataset.
    """

    def __init__(self, catalog: Catalog, raw: Callable[[int], dict[str, Any]], shard: int) -> None:
        self.catalog = catalog
        self.raw = raw
        self.shard = shard
        self.url = catalog.load().infos[shard].url

    def __len__(self) -> int:
        return int(self.catalog.load().lengths[self.shard])

    def __getitem__(self, j: int) -> dict[str, Any]:
        n = len(self)
        j = operator.index(j)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"index {j} out of range for a shard of {n} samples")
        start = int(self.catalog.load().cum[self.shard - 1]) if self.shard else 0
        return self.raw(start + j)
