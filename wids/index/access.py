"""Reading an index one shard at a time, whatever its backend: for tools over 10^6 shards.

The shard table and the SQLite reader answer counts from arrays and decode one shard record
when it is asked for (``nshards``, ``sample_counts()``, ``shard(i)``); a JSON index holds its
shard list already. These functions use the cheap path where the reader has it, so ``wids
index info``, ``wids index verify``, ``wids subset`` and the offline snapshot never build one
Python object per shard of a large index unless they need every shard's record.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np

from .model import IndexReader, ShardInfo

__all__ = [
    "count_shards",
    "count_without_members",
    "iter_shards",
    "shard_bytes",
    "shard_getter",
    "shard_sample_counts",
    "shards_ending",
]


def count_shards(reader: IndexReader) -> int:
    """How many shards ``reader`` has, without a record per shard where it can."""
    n = getattr(reader, "nshards", None)
    return int(n) if n is not None else len(reader.shards)


def shard_getter(reader: IndexReader) -> Callable[[int], ShardInfo]:
    """``get(i)``: shard ``i``'s record, decoded on the call where the reader can."""
    get = getattr(reader, "shard", None)
    return get if callable(get) else reader.shards.__getitem__


def iter_shards(
    reader: IndexReader, start: int = 0, stop: int | None = None
) -> Iterator[ShardInfo]:
    """The shard records ``start .. stop - 1``, one at a time (none kept here)."""
    get = shard_getter(reader)
    end = count_shards(reader) if stop is None else stop
    for k in range(start, end):
        yield get(k)


def shard_sample_counts(reader: IndexReader) -> np.ndarray:
    """Samples per shard (int64 array; from the reader's column where it has one)."""
    counts = getattr(reader, "sample_counts", None)
    if callable(counts):
        return np.asarray(counts(), dtype=np.int64)
    shards = reader.shards
    return np.fromiter((s.nsamples for s in shards), dtype=np.int64, count=len(shards))


def shard_bytes(reader: IndexReader) -> int:
    """Bytes of all shards whose size the index records (a column sum where it can)."""
    total: Any = getattr(reader, "total_bytes", None)
    if callable(total):
        return int(total())
    return sum(s.size or 0 for s in reader.shards)


def count_without_members(reader: IndexReader) -> int | None:
    """How many shards have no member table, if the reader knows without loading the tables."""
    count: Any = getattr(reader, "shards_without_members", None)
    return int(count()) if callable(count) else None


def shards_ending(reader: IndexReader, names: Collection[str]) -> np.ndarray | None:
    """The shards whose URL may have one of ``names`` (no ``/``) as its last part.

    Returns:
        Sorted shard numbers, a superset of those that do, found without a record per shard
        (a shard table's URL column, an SQLite query); ``None`` when the reader cannot tell
        without every shard's record (then look at every one).
    """
    find: Any = getattr(reader, "shards_ending", None)
    return find(names) if callable(find) else None
