"""What ``wids index info --columns`` reports of each metadata column of an index.

For each column (in the order first seen): its type, how many values it has and how many
are missing, and for numbers the minimum, maximum and a histogram of :data:`BINS` equal bins;
for bools the count of each value; for strings the number of distinct values and the most
common ones. Every shard's entry is read once (the columns are decoded and checked as
``ds.column`` does).
"""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np

from ..errors import ColumnError, IndexFormatError
from .columns import ShardColumn, decode_columns, merge_type, shard_extras
from .jsonreader import remote_sidecars

__all__ = ["BINS", "column_summaries"]

BINS = 10
"""Bins of a numeric column's histogram."""
_TOP = 5  # most common strings shown


def column_summaries(reader: Any, excluded: np.ndarray | None = None) -> list[dict[str, Any]]:
    """One summary per column of an opened index (none when it has no columns).

    Args:
        reader: The opened index.
        excluded: Sorted global sample numbers left out of the summaries (the exclusion
            opening the index applies), or ``None``.

    Raises:
        IndexFormatError: A shard's stored columns are malformed (naming the shard).
        ColumnError: Shards hold values of types that do not go together, or columns of a
            newer wids.
    """
    from ..storage import redact_url
    from .access import count_shards, shard_getter, shard_sample_counts

    n = count_shards(reader)
    counts = shard_sample_counts(reader)
    get = shard_getter(reader)
    parts: dict[str, list[ShardColumn]] = {}
    types: dict[str, str] = {}
    absent: collections.Counter[str] = collections.Counter()  # samples of shards without it
    total = 0
    extras = shard_extras(reader.shard_extra, n, remote_sidecars(reader))
    start = 0
    for k, extra in enumerate(extras):
        stored = int(counts[k])
        keep = _kept(excluded, start, stored)
        start += stored
        nsamples = stored if keep is None else int(np.count_nonzero(keep))
        total += nsamples
        try:
            cols = decode_columns(extra, stored, None)
        except IndexFormatError as e:
            raise IndexFormatError(e.message, shard=redact_url(get(k).url)) from None
        except ColumnError as e:  # columns of a newer wids: say which shard holds them
            raise ColumnError(f"{redact_url(get(k).url)}: {e}") from None
        if keep is not None:
            cols = {name: _take(col, keep) for name, col in cols.items()}
        for name, col in cols.items():
            if name not in parts:
                parts[name] = []
                types[name] = "null"
                absent[name] = total - nsamples
            where = f"{redact_url(get(k).url)}: column {name!r}: "
            types[name] = merge_type(types[name], col.type, where)
            parts[name].append(col)
        for name in parts:
            if name not in cols:
                absent[name] += nsamples
    return [_summary(name, types[name], parts[name], absent[name]) for name in parts]


def _kept(excluded: np.ndarray | None, start: int, n: int) -> np.ndarray | None:
    """Which of a shard's ``n`` samples from global ``start`` are kept (``None``: all)."""
    if excluded is None:
        return None
    lo, hi = np.searchsorted(excluded, [start, start + n])
    if lo == hi:
        return None
    keep = np.ones(n, dtype=bool)
    keep[excluded[lo:hi] - start] = False
    return keep


def _take(col: ShardColumn, keep: np.ndarray) -> ShardColumn:
    missing = None if col.missing is None else col.missing[keep]
    return ShardColumn(col.type, col.values[keep], missing)


def _summary(name: str, kind: str, parts: list[ShardColumn], absent: int) -> dict[str, Any]:
    present = [p.values[~p.missing] if p.missing is not None else p.values for p in parts]
    missing = absent + sum(int(p.missing.sum()) for p in parts if p.missing is not None)
    values = np.concatenate(present) if present else np.zeros(0)
    out: dict[str, Any] = {"name": name, "type": kind, "count": int(len(values))}
    out["missing"] = missing
    if not len(values) or kind == "null":
        return out
    if kind == "str":
        common = collections.Counter(values.tolist())
        out["distinct"] = len(common)
        out["top"] = [[v, c] for v, c in common.most_common(_TOP)]
        return out
    if kind == "bool":
        out["true"] = int(np.count_nonzero(values))
        out["false"] = int(len(values) - out["true"])
        return out
    nums = values.astype(np.float64) if kind == "float64" else values.astype(np.int64)
    finite = nums[np.isfinite(nums)] if kind == "float64" else nums
    out["min"] = _plain(nums.min())
    out["max"] = _plain(nums.max())
    wide = finite.astype(np.float64)
    # numpy cannot cut a span wider than a float holds (-1e308 .. 1e308) into finite bins
    if len(wide) and math.isfinite(float(wide.max()) - float(wide.min())):
        hist, edges = np.histogram(wide, bins=BINS)
        out["histogram"] = {"edges": [float(e) for e in edges], "counts": hist.tolist()}
    return out


def _plain(v: Any) -> int | float:
    return int(v) if isinstance(v, (np.integer, int)) else float(v)


def render(summaries: list[dict[str, Any]], width: int = 30) -> list[str]:
    """Lines of text for the summaries (the CLI prints them)."""
    lines = []
    for s in summaries:
        head = (
            f"  column   {s['name']:<16} {s['type']:<8} {s['count']} values, {s['missing']} missing"
        )
        if "min" in s:
            head += f", min {s['min']}, max {s['max']}"
        if "true" in s:
            head += f", {s['true']} true, {s['false']} false"
        if "distinct" in s:
            top = ", ".join(f"{v!r} x{c}" for v, c in s["top"])
            head += f", {s['distinct']} distinct: {top}"
        lines.append(head)
        hist = s.get("histogram")
        if hist:
            peak = max(hist["counts"]) or 1
            edges = hist["edges"]
            for k, c in enumerate(hist["counts"]):
                bar = "#" * round(width * c / peak)
                lines.append(
                    f"           [{edges[k]:>12.6g}, {edges[k + 1]:>12.6g}) {c:>10}  {bar}"
                )
    return lines
