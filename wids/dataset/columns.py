"""A dataset's metadata columns as whole arrays, and filters over them.

:func:`raw_column` reads one column of every shard from the index (each shard's extra keys,
decoded and checked by :mod:`wids.index.columns`) into one array over all samples, in dataset
order; :func:`dataset_column` is that array seen through the dataset's exclusions with the
missing-value policy applied (``ds.column``); :func:`where_excluded` evaluates a filter
expression (:mod:`wids.dataset.where`) into the sample numbers it leaves out (``ds.where``).

Nothing is read until a column is asked for: an index with columns opens as fast as one
without (the JSON description carries each shard's columns as a few base64 strings, which
parse without a Python object per value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ColumnError, IndexFormatError
from ..index.columns import (
    ShardColumn,
    decode_columns,
    merge_type,
    shard_extras,
)
from ..index.jsonreader import remote_sidecars

__all__ = ["Column", "dataset_column", "raw_column", "where_excluded", "where_in_index"]


class Column:
    """One column over all samples of a dataset (before exclusions).

    Attributes:
        name: The column's name.
        type: ``int64``, ``float64``, ``bool``, ``str`` or ``null`` (every value missing).
        values: One value per sample (int64, float64, bool or object array); missing ones
            hold 0, NaN, False or ``None``.
        missing: Where values are missing (bool array).
    """

    def __init__(self, name: str, kind: str, values: np.ndarray, missing: np.ndarray) -> None:
        self.name = name
        self.type = kind
        self.values = values
        self.missing = missing

    def filled(self, missing: Any = None) -> np.ndarray:
        """The values with the missing-value policy of ``ds.column`` (see there)."""
        values, gaps = self.values, self.missing
        if missing is not None:
            if self.type == "str":
                out = values.copy()
                out[gaps] = missing
                return out
            out = values.copy()
            if gaps.any():
                try:
                    out[gaps] = missing
                except (TypeError, ValueError):
                    raise ColumnError(
                        f"column {self.name!r}: missing={missing!r} does not fit its {self.type} "
                        "values"
                    ) from None
            return out
        if self.type in ("int64", "bool") and gaps.any():
            out = values.astype(np.float64)
            out[gaps] = np.nan
            return out
        return values


def raw_column(loaded: Any, name: str) -> Column:
    """Column ``name`` of every shard of a loaded description (all samples, dataset order).

    A shard without that column has all its values missing.

    Raises:
        ColumnError: The dataset has no index (a shard pattern or list), no shard has the
            column (the error lists the columns the first shard has), shards hold values of
            types that do not go together, or the columns were written by a newer wids.
        IndexFormatError: A shard's stored column is malformed (naming the shard).
    """
    from ..index.columns import check_name
    from ..storage import redact_url

    check_name(name)
    extra = getattr(loaded, "extra", None)
    if extra is None:
        raise ColumnError("the dataset has no index, so no columns (open it from an index)")
    lengths = np.asarray(loaded.lengths, dtype=np.int64)
    parts: list[ShardColumn | None] = []
    kind = "null"
    seen: set[str] = set()
    for k, (n, entry) in enumerate(zip(lengths.tolist(), _extras(loaded, extra), strict=True)):
        try:
            got = decode_columns(entry, n, None, names=None if k == 0 else [name])
        except IndexFormatError as e:
            raise IndexFormatError(e.message, shard=redact_url(loaded.infos[k].url)) from None
        except ColumnError as e:  # columns of a newer wids: say which shard holds them
            raise ColumnError(f"{redact_url(loaded.infos[k].url)}: {e}") from None
        if k == 0:
            seen = set(got)
        col = got.get(name)
        if col is not None:
            where = f"{redact_url(loaded.infos[k].url)}: column {name!r}: "
            kind = merge_type(kind, col.type, where)
        parts.append(col)
    if all(p is None for p in parts):
        have = ", ".join(sorted(seen)) or "none"
        raise ColumnError(f"no column named {name!r} in the index (its first shard has: {have})")
    return _concat(name, kind, parts, lengths)


_THREADS = 16  # a remote JSON index's sidecars read at once


def _extras(loaded: Any, extra: Any) -> Any:
    """Every shard's extra keys in order (a remote JSON index's sidecars read concurrently)."""
    remote = getattr(loaded, "extra_remote", False)
    return shard_extras(extra, len(loaded.lengths), remote, _THREADS)


def _concat(
    name: str, kind: str, parts: Sequence[ShardColumn | None], lengths: np.ndarray
) -> Column:
    total = int(lengths.sum())
    dtype: Any = {"int64": np.int64, "float64": np.float64, "bool": np.bool_, "str": object}.get(
        kind, np.float64
    )
    values = np.zeros(total, dtype=dtype) if dtype is not object else np.full(total, None)
    if kind in ("float64", "null"):
        values[:] = np.nan
    missing = np.zeros(total, dtype=bool)
    at = 0
    for part, n in zip(parts, lengths.tolist(), strict=True):
        if part is None or part.type == "null":
            missing[at : at + n] = True
        else:
            values[at : at + n] = part.values
            if part.missing is not None:
                missing[at : at + n] = part.missing
        at += n
    if kind == "float64":  # an int shard's gaps hold 0 in its values
        values[missing] = np.nan
        missing |= np.isnan(values)
    return Column(name, kind, values, missing)


def dataset_column(loaded: Any, excluded: np.ndarray | None, name: str, missing: Any) -> np.ndarray:
    """``ds.column(name, missing=...)``: the column over the dataset's kept samples.

    Args:
        loaded: The dataset's description.
        excluded: Sorted raw sample numbers excluded, or ``None``.
        name: The column.
        missing: What missing values become (see ``ShardListDataset.column``).
    """
    col = raw_column(loaded, name)
    values = col.filled(missing)
    if excluded is not None and len(excluded):
        values = np.delete(values, excluded)
    return values


def where_excluded(loaded: Any, excluded: np.ndarray | None, expr: str) -> np.ndarray:
    """The raw sample numbers left out by ``expr`` (plus those ``excluded`` already).

    Raises:
        ColumnError: The expression is malformed or names a column the index does not have.
    """
    from .where import compile_where

    where = compile_where(expr)
    columns = {n: raw_column(loaded, n) for n in sorted(where.names)}
    total = int(np.asarray(loaded.lengths, dtype=np.int64).sum())
    keep = where.evaluate(columns, total)
    out = np.flatnonzero(~keep).astype(np.int64)
    if excluded is not None and len(excluded):
        out = np.union1d(out, excluded).astype(np.int64)
    return out


class _Shards:
    """Some shards of an opened index, as :func:`raw_column` reads a description."""

    def __init__(self, reader: Any, shards: Sequence[int], counts: np.ndarray) -> None:
        from ..index import shard_getter

        get = shard_getter(reader)
        self.lengths = np.asarray([int(counts[k]) for k in shards], dtype=np.int64)
        self.infos = [get(k) for k in shards]
        self.extra = lambda j: reader.shard_extra(shards[j])
        self.extra_remote = remote_sidecars(reader)  # a remote JSON index: sidecars at once


def where_in_index(reader: Any, shards: Sequence[int], expr: str) -> np.ndarray:
    """The global sample numbers of ``shards`` (of an opened index) that ``expr`` leaves out.

    Raises:
        ColumnError: The expression is malformed, or names a column the index lacks.
    """
    from ..index import shard_sample_counts

    counts = np.asarray(shard_sample_counts(reader), dtype=np.int64)
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    part = _Shards(reader, shards, counts)
    local = where_excluded(part, None, expr)
    if not len(shards):
        return local
    # numbers within the concatenation of ``shards`` -> the index's global numbers
    bounds = np.cumsum(part.lengths)
    j = np.searchsorted(bounds, local, side="right")
    first = bounds - part.lengths
    chosen = np.asarray(shards, dtype=np.int64)
    return np.sort(starts[chosen[j]] + (local - first[j])).astype(np.int64)
