"""``ds1 + ds2``: a torch ``ConcatDataset`` whose shards the samplers still see.

:class:`ShardConcatDataset` is what ``ShardListDataset.__add__`` returns. It is a
``torch.utils.data.ConcatDataset`` (indices run through each part in turn) with what the
samplers in :mod:`wids.sampler` read from a dataset:

- ``lengths``: the per-shard sample counts of all parts, in order (a part without ``lengths``,
  a plain torch dataset, counts as one shard), so chunks never cross a shard boundary and
  ``ShardedSampler`` serves one shard at a time across the parts;
- ``components``: each part's (sub-)datasets, shifted to the concatenation's indices (a part
  without components is one), for ``mix=True``;
- ``column(name)``: the parts' metadata columns in order (``BucketBatchSampler(keys=name)``).

A batch (``__getitems__``) is read part by part with each part's own batched read, so a
``ShardListDataset`` part still merges nearby samples into one request. This module imports
torch: it is imported only when ``+`` is used.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Any, TypeVar

from torch.utils.data import ConcatDataset, Dataset

from .description import DatasetComponent

__all__ = ["ShardConcatDataset"]

T_co = TypeVar("T_co", covariant=True)


class ShardConcatDataset(ConcatDataset[T_co]):
    """The concatenation of datasets, keeping their shards and sub-datasets visible.

    ``ds1 + ds2 + ds3`` gives one flat concatenation of the three (not a nested one). A
    sample's ``__index__`` and ``__shardindex__`` are those inside its own part.

    Args:
        datasets: The parts, in order.
    """

    def __init__(self, datasets: Iterable[Dataset[T_co]]) -> None:
        super().__init__(datasets)

    @property
    def lengths(self) -> list[int]:
        """Per-shard sample counts of all parts in order; a part without shards counts as one."""
        out: list[int] = []
        for part in self.datasets:
            lengths = getattr(part, "lengths", None)
            if lengths is None:
                out.append(len(part))  # type: ignore[arg-type]
            else:
                out.extend(int(n) for n in lengths)
        return out

    @property
    def components(self) -> list[DatasetComponent]:
        """Each part's (sub-)datasets as ranges of this dataset's indices."""
        out: list[DatasetComponent] = []
        start = 0
        for part in self.datasets:
            size = len(part)  # type: ignore[arg-type]
            parts = getattr(part, "components", None) or [DatasetComponent("", None, 0, size)]
            out.extend(
                DatasetComponent(c.name, c.weight, c.start + start, c.stop + start) for c in parts
            )
            start += size
        return out

    def column(self, name: str, *, missing: Any = None) -> Any:
        """Metadata column ``name`` of every part in order: ``out[i]`` is ``self[i]``'s.

        Each part's ``column(name, missing=missing)`` (``ShardListDataset.column``: after its
        exclusions), concatenated; numpy picks the common type (an ``int64`` part and a
        ``float64`` part give ``float64``). A filter over a concatenation is a filter per
        part: ``ds1.where(expr)`` and ``ds2.where(expr)``.

        Raises:
            ColumnError: A part has no such column, or no ``column`` at all (a plain torch
                dataset).
        """
        import numpy as np

        from ..errors import ColumnError

        out = []
        for k, part in enumerate(self.datasets):
            get = getattr(part, "column", None)
            if not callable(get):
                raise ColumnError(
                    f"part {k} of the concatenation ({type(part).__name__}) has no metadata columns"
                )
            values = np.asarray(get(name, missing=missing))
            if len(values) != len(part):  # type: ignore[arg-type]
                raise ColumnError(
                    f"part {k}: column {name!r} has {len(values)} values for {len(part)} samples"  # type: ignore[arg-type]
                )
            out.append(values)
        return np.concatenate(out) if out else np.zeros(0)

    def __add__(self, other: Dataset[Any]) -> ShardConcatDataset[Any]:
        """A flat concatenation of this one's parts and ``other`` (or its parts)."""
        more = other.datasets if isinstance(other, ShardConcatDataset) else [other]
        return ShardConcatDataset([*self.datasets, *more])

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """The samples at ``indices``, read part by part with each part's batched read."""
        size = len(self)
        groups: dict[int, list[tuple[int, int]]] = {}
        for pos, index in enumerate(indices):
            if not -size <= index < size:
                raise IndexError(f"index {index} out of range for {size} samples")
            index %= size
            part = bisect_right(self.cumulative_sizes, index)
            local = index - (self.cumulative_sizes[part - 1] if part else 0)
            groups.setdefault(part, []).append((pos, local))
        out: list[Any] = [None] * len(indices)
        for part, members in groups.items():
            dataset = self.datasets[part]
            local_indices = [local for _, local in members]
            if hasattr(dataset, "__getitems__"):
                samples = dataset.__getitems__(local_indices)
            else:
                samples = [dataset[i] for i in local_indices]
            for (pos, _), sample in zip(members, samples, strict=True):
                out[pos] = sample
        return out
