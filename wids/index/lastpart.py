"""Which shards a URL's last part can name, found from the stored URLs without a record each.

An exclusion's ``shard/key`` pair names its shard by the URL's last part (the basename) or a
longer trailing part of it (:mod:`wids.dataset.exclusions` owns that rule). A shard whose
resolved URL ends in ``/NAME`` has, as its resolved URL's last part, ``NAME``'s last part; and
resolving (:func:`~wids.index.urls.resolve_url`, then a ``url_map``) keeps a stored URL's last
part except in the few shapes :data:`UNSURE_SQL` and :func:`blob_candidates` keep as
candidates: a ``pipe:`` command, a ``~`` path, a URL ending in ``/`` or ``.`` (``normpath``
drops or folds those), and every shard when a ``url_map`` prefix does not end in ``/`` (it may
rewrite a last part). So the shards whose *stored* URL ends in ``/NAME``'s last part (or is
it), plus those, are a superset of the shards a name can match: the caller makes only their
records and applies its rule to them.

A shard table (``*.widx``) answers from its URL column (offsets and one byte blob) with a few
vectorised passes per distinct length of the names, in bounded chunks; an SQLite index with
one scan of its shards inside SQLite (:func:`sql_candidates`). Neither makes a Python object
per shard.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from itertools import groupby
from typing import Any

import numpy as np

from .urls import UrlMap

__all__ = ["UNSURE_SQL", "blob_candidates", "renames", "sql_candidates"]

_CHUNK = 1 << 16  # shards per vectorised pass: bounded temporary arrays (a few MB)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: mixes 8-byte words into one comparison key

UNSURE_SQL = (
    "typeof(url) != 'text' OR url LIKE 'pipe:%' OR url LIKE '~%' OR url LIKE '%/' OR url LIKE '%.'"
)
"""Rows of ``shards`` whose stored URL may resolve to another last part (kept as candidates)."""


def renames(url_map: UrlMap) -> bool:
    """Whether ``url_map`` may change a URL's last part (a prefix not ending in ``/``)."""
    return any(not old.endswith("/") for old, _ in url_map)


def _key(rows: np.ndarray) -> np.ndarray:
    """One uint64 per row of a uint8 matrix (rows equal -> keys equal)."""
    width = rows.shape[1]
    words = -(-width // 8)
    padded = np.zeros((rows.shape[0], 8 * words), dtype=np.uint8)
    padded[:, 8 * words - width :] = rows
    cols = padded.view("<u8")
    key: np.ndarray = cols[:, 0].copy()
    for j in range(1, words):
        key *= _MIX
        key ^= cols[:, j]
    return key


def _unsure(blob: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Stored URLs ``blob[a:b]`` whose last part resolving may change (or that are malformed)."""
    bad = (a < 0) | (b < a) | (b > len(blob))
    ok = ~bad
    last = np.full(len(a), -1, dtype=np.int64)
    has = ok & (b > a)
    last[has] = blob[b[has] - 1]
    first = np.full(len(a), -1, dtype=np.int64)
    first[has] = blob[a[has]]
    unsure: np.ndarray = bad | ~has | (last == ord("/")) | (last == ord(".")) | (first == ord("~"))
    piped = ok & (b - a >= 5) & (first == ord("p"))
    if piped.any():
        rows = np.flatnonzero(piped)
        heads = blob[a[rows, None] + np.arange(5)]
        unsure[rows[(heads == np.frombuffer(b"pipe:", dtype=np.uint8)).all(axis=1)]] = True
    return unsure


def blob_candidates(blob: np.ndarray, offsets: np.ndarray, names: Collection[str]) -> np.ndarray:
    """Shards whose stored URL (``blob[offsets[k]:offsets[k + 1]]``) may end in one of ``names``.

    Args:
        blob: The stored URLs, concatenated (uint8).
        offsets: ``N + 1`` offsets into ``blob`` (as stored: malformed ones are candidates, so
            reading their record raises).
        names: Last parts (no ``/``), as an exclusion's ``pair_parts`` gives them.

    Returns:
        Sorted shard numbers (int64): every shard whose URL ends in ``/NAME`` or is ``NAME``,
        every shard :func:`_unsure` keeps, and rarely another (a key collision).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    by_length: dict[int, list[bytes]] = {}
    for name in names:
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no decoded URL holds: it ends no URL
            continue
        by_length.setdefault(len(raw), []).append(b"/" + raw)
    found: list[np.ndarray] = []
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        a, b = offsets[lo:hi], offsets[lo + 1 : hi + 1]
        unsure = _unsure(blob, a, b)
        hit = unsure.copy()
        for length, wanted in by_length.items():
            hit |= _ending(blob, a, b, ~unsure, length, wanted)
        found.append(np.flatnonzero(hit) + lo)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _ending(
    blob: np.ndarray, a: np.ndarray, b: np.ndarray, ok: np.ndarray, length: int, wanted: list[bytes]
) -> np.ndarray:
    """Which URLs ``blob[a:b]`` end in one of ``wanted`` (``/`` + a last part of ``length``).

    A URL of exactly ``length`` bytes is compared as if a ``/`` came before it (a relative URL
    that is the name itself).
    """
    rows = np.flatnonzero(ok & (b - a >= length))
    out = np.zeros(len(a), dtype=bool)
    if not len(rows) or not length or len(blob) < length:
        return out
    ends = b[rows]
    window = np.lib.stride_tricks.sliding_window_view(blob, length)[ends - length]
    before = np.full(len(rows), ord("/"), dtype=np.uint8)
    longer = ends - length > a[rows]
    before[longer] = blob[ends[longer] - length - 1]
    keys = _key(np.concatenate([before[:, None], window], axis=1))
    table = np.frombuffer(b"".join(wanted), dtype=np.uint8).reshape(len(wanted), length + 1)
    targets = np.sort(_key(table))
    at = np.minimum(np.searchsorted(targets, keys), len(targets) - 1)
    out[rows[targets[at] == keys]] = True
    return out


def sql_candidates(
    query: Callable[[str, tuple[Any, ...]], list[Any]], names: Collection[str]
) -> np.ndarray:
    """Rows of an SQLite index's ``shards`` whose stored URL may end in one of ``names``.

    One scan of ``shards`` inside SQLite: the URL's last bytes (``substr`` of it as a blob:
    SQLite's text functions count characters and stop at a NUL) against ``/NAME``, or a row
    of :data:`UNSURE_SQL`. The names are written into the statement as hex blob literals
    (made here from their bytes: no parameter limit, nothing of them is SQL).

    Args:
        query: Runs one SQL statement with its parameters, returning the rows.
        names: Last parts (no ``/``), as an exclusion's ``pair_parts`` gives them.

    Returns:
        Sorted ids (int64).
    """
    wanted: list[bytes] = []
    for name in names:
        try:
            wanted.append(b"/" + name.encode("utf-8"))
        except UnicodeEncodeError:  # SQLite's text is UTF-8: no URL there ends in it
            continue
    clauses = [UNSURE_SQL]
    for length, group in groupby(sorted(wanted, key=len), key=len):
        blobs = ", ".join(f"X'{raw.hex()}'" for raw in group)
        clauses.append(f"substr(CAST('/' || url AS BLOB), {-length}) IN ({blobs})")
    rows = query(f"SELECT id FROM shards WHERE {' OR '.join(clauses)} ORDER BY id", ())
    return np.asarray([r[0] for r in rows], dtype=np.int64)
