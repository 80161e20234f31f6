"""What one process's copy of a dataset has done so far: :class:`DatasetStats`."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DatasetStats"]


@dataclass(frozen=True, slots=True)
class DatasetStats:
    """What this process's copy of a dataset has done so far.

    Attributes:
        samples: Samples returned.
        accesses: Shard look-ups, one per sample (the reference's ``get_stats()[0]``).
        misses: Look-ups that had to open a shard reader (the reference's ``get_stats()[1]``).
        requests: Storage requests (stats, range reads, retries included).
        bytes_read: Bytes received from storage or the local cache.
        cache_hits: Samples served from the local shard cache.
        retries: Requests repeated after transient failures.
        errors: Operations that failed for good.
    """

    samples: int
    accesses: int
    misses: int
    requests: int
    bytes_read: int
    cache_hits: int
    retries: int
    errors: int

    def __add__(self, other: DatasetStats) -> DatasetStats:
        """Field by field: the counters of two processes together."""
        if not isinstance(other, DatasetStats):
            return NotImplemented
        return DatasetStats(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(stats: DatasetStats) -> tuple[int, ...]:
    return tuple(getattr(stats, f.name) for f in fields(stats))
