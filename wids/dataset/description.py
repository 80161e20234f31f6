"""A dataset's description, loaded once: its shards, lengths and (sub-)datasets.

:class:`Description` is what the catalog (:mod:`wids.dataset.catalog`) loads from the
dataset's ``shards`` argument: sample counts and cumulative counts as int64 arrays (the index
lookup), the shards' records on demand (:attr:`Description.infos` is a lazy sequence: a
shard-table index decodes one shard when it is first asked for, so opening 10^6 shards makes
no Python object per shard), the (sub-)datasets as :class:`DatasetComponent` ranges of global
indices, and where member tables come from.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from ..index import Component, ShardInfo, ShardMembers

__all__ = ["DatasetComponent", "Description", "SMALL"]

SMALL = 1 << 16
"""Up to this many shards the cumulative counts are also kept as a list (``bisect`` is faster
than ``numpy.searchsorted`` for one index); above, only the array."""
_CACHED = 1 << 16  # shard records kept once made (the shards a process touches)


@dataclass(frozen=True, slots=True)
class DatasetComponent:
    """One (sub-)dataset as a range of global sample indices ``[start, stop)``."""

    name: str
    weight: float | None
    start: int
    stop: int


class _Infos(Sequence[ShardInfo]):
    """The shards' records, made one at a time on first use and kept (up to a bound)."""

    def __init__(self, get: Callable[[int], ShardInfo], n: int) -> None:
        self._get = get
        self._n = n
        self._made: dict[int, ShardInfo] = {}

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> list[ShardInfo]: ...
    def __getitem__(self, i: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        k = operator.index(i)
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError(f"shard {i} out of range for {self._n} shards")
        info = self._made.get(k)
        if info is None:
            info = self._get(k)
            if len(self._made) >= _CACHED:
                self._made.clear()
            self._made[k] = info
        return info


class _DatasetOf(Sequence[str]):
    """Each shard's (sub-)dataset name, from the components' shard ranges."""

    def __init__(self, components: list[Component], name: str, n: int) -> None:
        self._stops = [c.stop_shard for c in components]
        self._names = [c.name or name or "" for c in components]
        self._weights = [c.weight for c in components]
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        k = operator.index(i)
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError(f"shard {i} out of range for {self._n} shards")
        c = bisect.bisect_right(self._stops, k)
        return self._names[c] if c < len(self._names) else ""

    def weight(self, k: int) -> float | None:
        """The weight of shard ``k``'s (sub-)dataset, if the description gives one."""
        c = bisect.bisect_right(self._stops, k)
        return self._weights[c] if c < len(self._weights) else None


class Description:
    """The dataset's description, loaded once: counts, shard records, components, members.

    Args:
        counts: Samples per shard (int64 array; kept as given, may be a read-only map).
        starts: ``N + 1`` cumulative counts from 0 (int64 array), or ``None`` to compute them.
        info: The record of shard ``i`` (called once per shard and process, on first use).
        components: The (sub-)datasets as shard ranges.
        name: The dataset's name.
        indexed: The member table of shard ``i`` from the index, or ``None`` (scan shards).
    """

    def __init__(
        self,
        counts: np.ndarray,
        starts: np.ndarray | None,
        info: Callable[[int], ShardInfo],
        components: list[Component],
        name: str,
        indexed: Callable[[int], ShardMembers | None] | None,
    ) -> None:
        if starts is None:
            starts = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=starts[1:])
        n = len(counts)
        self.name = name
        self.lengths = counts
        self.starts = starts
        self.cum = starts[1:]
        self.cum_list: list[int] | None = self.cum.tolist() if n <= SMALL else None
        self.per_shard = _per_shard(counts)
        self.last = n - 1
        self.total = int(starts[-1])
        self.infos: Sequence[ShardInfo] = _Infos(info, n)
        self.components = [
            DatasetComponent(
                c.name or name,
                c.weight,
                int(starts[c.first_shard]),
                int(starts[c.stop_shard]),
            )
            for c in components
        ]
        self.dataset_of = _DatasetOf(components, name, n)
        self.indexed = indexed
        self.extra: Callable[[int], dict[str, Any]] | None = None  # the index's shard_extra
        self.extra_remote = False  # each shard's extra is a request (a remote JSON index)
        # the index's shards_ending (a URL column or a query, no record per shard), if any
        self.shards_ending: Callable[[Collection[str]], np.ndarray | None] | None = None
        self._shard_dicts: list[dict[str, Any]] | None = None

    @classmethod
    def of_infos(
        cls,
        infos: list[ShardInfo],
        components: list[Component],
        name: str,
        indexed: Callable[[int], ShardMembers | None] | None,
    ) -> Description:
        """A description of shard records already made (a description file, a pattern)."""
        counts = np.fromiter((s.nsamples for s in infos), dtype=np.int64, count=len(infos))
        made = cls(counts, None, infos.__getitem__, components, name, indexed)
        made.infos = infos  # already objects: no second cache of them
        return made

    @classmethod
    def of_reader(cls, reader: Any, name: str) -> Description:
        """A description of an opened index: lazily per shard when the reader can.

        Readers with ``cumulative_counts()`` and ``shard(i)`` (the shard table) give arrays and
        one record at a time; any other reader's ``shards`` list is used as it is.
        """
        comps = list(reader.components)
        if hasattr(reader, "cumulative_counts") and hasattr(reader, "shard"):
            made = cls(
                reader.sample_counts(),
                reader.cumulative_counts(),
                reader.shard,
                comps,
                name,
                reader.members,
            )
        else:
            made = cls.of_infos(list(reader.shards), comps, name, reader.members)
        made.extra = reader.shard_extra  # read only by ds.column (wids.dataset.columns)
        find = getattr(reader, "shards_ending", None)
        made.shards_ending = find if callable(find) else None  # read by exclusions' pairs
        made.extra_remote = _remote_sidecars(reader)
        return made

    def locate(self, i: int) -> int:
        """The shard holding global index ``0 <= i < total``."""
        if self.per_shard:
            return min(i // self.per_shard, self.last)
        cum = self.cum_list
        if cum is not None:
            return bisect.bisect_right(cum, i)
        return int(np.searchsorted(self.cum, i, side="right"))

    def shard_dict(self, shard: int) -> dict[str, Any]:
        """One shard as the reference lists it: ``url``, ``nsamples``, ..., ``dataset``.

        Also the ``weight`` of the shard's (sub-)dataset when the description gives one.
        """
        info = self.infos[shard]
        d: dict[str, Any] = {"url": info.url, "nsamples": info.nsamples}
        for k, v in (("filesize", info.size), ("md5sum", info.md5sum), ("etag", info.etag)):
            if v is not None:
                d[k] = v
        d["dataset"] = self.dataset_of[shard]
        weight = self.dataset_of.weight(shard)
        if weight is not None:
            d["weight"] = weight
        return d

    def shard_dicts(self) -> list[dict[str, Any]]:
        """The shards as the reference lists them (one dict per shard: small datasets)."""
        if self._shard_dicts is None:
            self._shard_dicts = [self.shard_dict(k) for k in range(len(self.infos))]
        return self._shard_dicts


def _remote_sidecars(reader: Any) -> bool:
    """Whether ``shard_extra(i)`` may read a remote file per shard (a remote JSON index)."""
    from ..index.jsonreader import remote_sidecars  # (not index.columns: loading needs none)

    return remote_sidecars(reader)


def _per_shard(counts: np.ndarray) -> int:
    """The samples of each shard when all but the last hold the same number (> 0), else 0.

    That is how writers cut shards (``maxcount``): sample ``i`` is then in shard
    ``min(i // per_shard, last)``, without a search (a binary search of the cumulative counts
    of thousands of shards misses the cache at every step: ~1 us a ``ds[i]``).
    """
    if not len(counts) or int(counts[0]) <= 0:
        return 0
    if len(counts) > 2 and not bool(np.all(counts[1:-1] == counts[0])):
        return 0
    return int(counts[0])
