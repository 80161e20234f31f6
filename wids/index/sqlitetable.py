"""Rows of the SQLite index checked and turned into records: shard, component, member table.

Used by :mod:`wids.index.sqlitereader`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from .members import ShardMembers
from .model import MAX_SHARD_SIZE, Component, ShardInfo, max_samples
from .urls import resolve_url

__all__ = ["component_from_row", "shard_from_row", "table_from_rows"]

_Error = Callable[[str], IndexFormatError]


def shard_from_row(
    k: int, row: tuple[Any, ...], root: str, error: _Error, compressed: bool = False
) -> ShardInfo:
    """Row ``k`` of ``shards``, every value checked (the rules of a JSON description).

    A ``compressed`` shard's sample count is bounded by its tar's size, which its seek points
    hold (checked with its member table), not by the compressed file's.
    """
    sid, url, n, size, etag, mtime, md5, has = row
    sized = type(size) is int and 0 <= size < MAX_SHARD_SIZE  # else refused below
    bound = max_samples(size if sized and not compressed else None)
    if not (
        sid == k
        and type(sid) is int
        and type(url) is str
        and url
        and "\x00" not in url
        and type(n) is int
        and (size is None or (type(size) is int and 0 <= size < MAX_SHARD_SIZE))
        and 0 <= n <= bound
        and (etag is None or type(etag) is str)
        and (md5 is None or type(md5) is str)
        and (mtime is None or (type(mtime) in (int, float) and abs(mtime) < MAX_SHARD_SIZE))
        and has in (0, 1)
    ):
        shown = ", ".join(repr(v)[:80] for v in row)
        raise error(
            f"shards row {k} ({shown}): expected id {k}, a url (no NUL), 0 <= nsamples <= "
            f"{bound if type(size) is int else 'the most its size allows'}, "
            "size in [0, 2**62) or NULL, text etag/md5sum, a finite mtime, has_members 0/1"
        )
    mtime = None if mtime is None else float(mtime)
    return ShardInfo(resolve_url(url, root), n, size, etag, mtime, md5)


def component_from_row(k: int, row: tuple[Any, ...], nshards: int, error: _Error) -> Component:
    """Row ``k`` of ``components``, checked against ``nshards``."""
    cid, name, weight, first, stop = row
    if not (
        cid == k
        and (name is None or type(name) is str)
        and (weight is None or (type(weight) in (int, float) and 0 <= weight < 2**62))
        and type(first) is int
        and type(stop) is int
        and 0 <= first <= stop <= nshards
    ):
        shown = ", ".join(repr(v)[:80] for v in row)
        raise error(
            f"components row {k} ({shown}): expected id {k}, a name, a weight >= 0 or NULL "
            f"and 0 <= first_shard <= stop_shard <= {nshards}"
        )
    return Component(name or "", None if weight is None else float(weight), first, stop)


def table_from_rows(
    keys: list[tuple[Any, Any]], rows: list[tuple[Any, ...]], nsamples: int, names: list[str]
) -> ShardMembers:
    """Build a :class:`ShardMembers` from ``(idx, key)`` and ``(sample, field, offset, size)`` rows.

    Every value is checked (ids in range, integers only) before it sizes an array.
    """
    if len(keys) != nsamples:
        raise IndexFormatError(f"{len(keys)} sample rows for {nsamples} samples")
    if any(idx != i or type(k) not in (str, bytes) for i, (idx, k) in enumerate(keys)):
        raise IndexFormatError(f"sample rows must be numbered 0..{nsamples - 1} with text keys")
    if not rows:
        if nsamples:
            raise IndexFormatError(f"no member rows for {nsamples} samples")
        zero = np.zeros(1, dtype=np.int64)
        return ShardMembers([], b"", zero, zero, np.zeros(0), np.zeros(0), np.zeros(0))
    try:
        cols = np.array(rows)
    except (ValueError, TypeError, OverflowError):  # blobs, ragged rows, huge integers
        cols = np.zeros((0, 0))
    if cols.ndim != 2 or cols.shape[1] != 4 or cols.dtype.kind != "i":
        raise IndexFormatError("member rows must hold integers only (no NULL, text or real)")
    cols = cols.astype(np.int64, copy=False)
    sidx, gfield = cols[:, 0], cols[:, 1]
    # sorted by the query, unless the b-tree that answered it (an index) is corrupt
    if len(sidx) > 1 and bool((sidx[1:] < sidx[:-1]).any()):
        raise IndexFormatError("member rows are not in sample order")
    if int(sidx[0]) < 0 or int(sidx[-1]) >= nsamples:
        raise IndexFormatError(f"member rows name samples outside 0..{nsamples - 1}")
    if int(gfield.min()) < 0 or int(gfield.max()) >= len(names):
        raise IndexFormatError(f"member rows name field ids outside 0..{len(names) - 1}")
    counts = np.bincount(sidx, minlength=nsamples)
    if not counts.all():
        raise IndexFormatError(f"member rows do not cover samples 0..{nsamples - 1}")
    sample_start = np.zeros(nsamples + 1, dtype=np.int64)
    np.cumsum(counts, out=sample_start[1:])
    blobs = [k if isinstance(k, bytes) else k.encode("utf-8", "surrogateescape") for _, k in keys]
    key_offsets = np.zeros(nsamples + 1, dtype=np.int64)
    np.cumsum([len(k) for k in blobs], out=key_offsets[1:])
    # Field ids are global to the file; a table numbers its own fields by first appearance.
    uniq, first = np.unique(gfield, return_index=True)
    order = np.argsort(first)
    lut = np.zeros(int(uniq.max()) + 1, dtype=np.int64)
    lut[uniq[order]] = np.arange(len(uniq), dtype=np.int64)
    return ShardMembers(
        fields=[names[int(g)] for g in uniq[order]],
        key_blob=b"".join(blobs),
        key_offsets=key_offsets,
        sample_start=sample_start,
        member_field=lut[gfield],
        member_offset=np.ascontiguousarray(cols[:, 2]),
        member_size=np.ascontiguousarray(cols[:, 3]),
    )
