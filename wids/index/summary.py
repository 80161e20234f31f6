"""What ``wids index info`` reports: totals from the counts, detail for a few shards.

Totals (shards, samples, bytes, shards without member tables) come from the reader's columns
(:mod:`wids.index.access`); member tables, which are per shard, are read for every shard only
of a small index or on request, and otherwise for the first and last few shards, so the
summary of a 10^6-shard index takes about as long as opening it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .access import (
    count_shards,
    count_without_members,
    shard_bytes,
    shard_getter,
    shard_sample_counts,
)
from .model import IndexReader

__all__ = ["FIELDS_FROM_ALL_UP_TO", "SAMPLED_SHARDS", "index_summary"]

FIELDS_FROM_ALL_UP_TO = 1000
"""Indexes of up to this many shards have the fields of every member table counted."""
SAMPLED_SHARDS = 5
"""Otherwise the fields of this many shards at each end are counted."""


def _ends(n: int, k: int) -> list[int]:
    return sorted(set(range(min(k, n))) | set(range(max(0, n - k), n)))


def index_summary(
    reader: IndexReader, *, all_shards: bool = False, detail: Iterable[int] = ()
) -> dict[str, Any]:
    """Totals of an opened index, the fields of its member tables, a few shards' records.

    Args:
        reader: The opened index.
        all_shards: Count the fields of every shard's member table, however many there are
            (reads every table: minutes at 10^6 shards).
        detail: Shard numbers whose records are listed (``shard_detail``); the first and
            last of the index are always listed.

    Returns:
        ``name``, ``shards``, ``samples``, ``bytes``, ``fields`` (member counts per field),
        ``fields_from`` (how many shards' tables were counted), ``shards_without_offsets``
        (of the whole index; ``None`` when only some tables were read and the reader cannot
        tell without reading them all),
        ``components`` and ``shard_detail`` (one dict per listed shard).

    Raises:
        IndexError: A shard number in ``detail`` is out of range.
    """
    n = count_shards(reader)
    full = all_shards or n <= FIELDS_FROM_ALL_UP_TO
    counted = range(n) if full else _ends(n, SAMPLED_SHARDS)
    fields: dict[str, int] = {}
    missing = 0
    for k in counted:
        members = reader.members(k)
        if members is None:
            missing += 1
            continue
        hits = np.bincount(members.member_field, minlength=len(members.fields))
        for fname, c in zip(members.fields, hits.tolist(), strict=True):
            fields[fname] = fields.get(fname, 0) + c
    without = count_without_members(reader)
    get = shard_getter(reader)
    listed = sorted(set(_ends(n, 1)) | {_checked(k, n) for k in detail})
    return {
        "name": reader.name,
        "shards": n,
        "samples": int(shard_sample_counts(reader).sum(dtype=np.int64)),
        "bytes": shard_bytes(reader),
        "fields": dict(sorted(fields.items())),
        "fields_from": len(counted),
        "shards_without_offsets": without if without is not None else missing if full else None,
        "components": [c.name for c in reader.components],
        "shard_detail": [_detail(k, get(k)) for k in listed],
    }


def _checked(k: int, n: int) -> int:
    j = k + n if k < 0 else k
    if not 0 <= j < n:
        raise IndexError(f"shard {k} out of range for {n} shards")
    return j


def _detail(k: int, info: Any) -> dict[str, Any]:
    return {
        "shard": k,
        "url": info.url,
        "nsamples": info.nsamples,
        "size": info.size,
        "etag": info.etag,
        "mtime": info.mtime,
        "md5sum": info.md5sum,
    }
