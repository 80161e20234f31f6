"""A dataset's description, loaded once: its shards, lengths and (sub-)datasets.

:class:`Description` is what the catalog (:mod:`wids.dataset.catalog`) loads from the
dataset's ``shards`` argument: the shard infos, cumulative lengths for the index lookup, the
(sub-)datasets as :class:`DatasetComponent` ranges of global indices, and where member tables
come from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..index import ShardInfo, ShardMembers

__all__ = ["DatasetComponent", "Description"]


@dataclass(frozen=True, slots=True)
class DatasetComponent:
    """One (sub-)dataset as a range of global sample indices ``[start, stop)``."""

    name: str
    weight: float | None
    start: int
    stop: int


class Description:
    """The dataset's description, loaded once: shard infos, components, where members are."""

    def __init__(
        self,
        shards: list[ShardInfo],
        components: list[Any],
        name: str,
        indexed: Callable[[int], ShardMembers | None] | None,
    ) -> None:
        self.infos = shards
        self.name = name
        self.lengths = [int(s.nsamples) for s in shards]
        self.cum = np.cumsum(np.asarray(self.lengths, dtype=np.int64))
        self.cum_list: list[int] = self.cum.tolist()
        self.total = self.cum_list[-1] if self.cum_list else 0
        starts = np.concatenate([[0], self.cum]).astype(np.int64)
        self.components = [
            DatasetComponent(
                c.name or name, c.weight, int(starts[c.first_shard]), int(starts[c.stop_shard])
            )
            for c in components
        ]
        self.dataset_of = [""] * len(shards)
        for c in components:
            for i in range(c.first_shard, c.stop_shard):
                self.dataset_of[i] = c.name or name or ""
        self.indexed = indexed
        self._shard_dicts: list[dict[str, Any]] | None = None

    def shard_dicts(self) -> list[dict[str, Any]]:
        """The shards as the reference lists them: dicts with ``url``, ``nsamples`` ..."""
        if self._shard_dicts is None:
            out = []
            for info, ds in zip(self.infos, self.dataset_of, strict=True):
                d: dict[str, Any] = {"url": info.url, "nsamples": info.nsamples}
                for k, v in (("filesize", info.size), ("md5sum", info.md5sum), ("etag", info.etag)):
                    if v is not None:
                        d[k] = v
                d["dataset"] = ds
                out.append(d)
            self._shard_dicts = out
        return self._shard_dicts
