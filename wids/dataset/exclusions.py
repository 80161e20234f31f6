"""Exclusions: samples a dataset leaves out when it opens, without touching a shard.

``ShardListDataset(index, exclude=...)`` takes sample keys, ``shard/key`` pairs or global
sample numbers (:func:`parse_exclude`: a file of keys, or an iterable), resolves them once
when the description loads (:func:`resolve`) to a sorted int64 array of excluded global
numbers, and then sees the dataset through :class:`Kept`: kept index ``i`` is raw sample
``i + (number of exclusions at or before the raw position)``, one ``searchsorted`` over an
array of the exclusions (``O(log E)``), so memory and open time grow with the exclusions
(plus one int64 per shard for the kept lengths), never with the samples.

What resolving costs, by form:

- sample numbers: a sort of the numbers; no member table is read;
- ``shard/key`` pairs: the shards whose URL may end in a name, as the index finds them
  without a record per shard (``shards_ending``: a ``.widx``'s URL column, an SQLite query;
  :func:`resolve_described`), else a pass over every shard's record (a JSON index holds them
  already); then the member tables of the shards named (only those);
- bare keys: every shard's member table (a key may be in any shard): the cost of reading the
  whole index once. Prefer pairs or numbers for large datasets.

Entries that name no sample (an unknown key, a shard not in the dataset, a number out of
range) are counted and reported by one warning, or refused (``ExclusionError``) with
``strict``.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ExclusionError
from ..index import ShardMembers
from .description import DatasetComponent, Description

__all__ = [
    "EXCLUDE_HEADER",
    "SIDECAR",
    "ExcludeSpec",
    "Kept",
    "index_exclusion",
    "pair_parts",
    "parse_exclude",
    "read_exclude_file",
    "resolve",
    "resolve_described",
]

SIDECAR = ".exclude"
"""An index at local path ``P`` opens with the exclusion in ``P + SIDECAR`` when that file
exists (``wids subset --exclude`` writes it)."""
EXCLUDE_HEADER = "# wids-exclude 1"
"""First line of the exclusion files wids writes (comments to a reader: any key file works)."""

_SMALL = 1 << 16
_PAIR = re.compile(r"^(.+?\.(?:tar|tgz|tar\.gz|tar\.zst))/(.+)$")


@dataclass(frozen=True)
class ExcludeSpec:
    """What to exclude, before it is resolved against a dataset.

    Attributes:
        samples: Global sample numbers (int64, sorted, unique).
        keys: Keys excluded in whichever shard holds them.
        pairs: Shard name (as the index records it, or its basename) -> keys in that shard.
        strict: Refuse entries that name no sample, rather than warn.
        beyond: Sample numbers given that no int64 holds (they name no sample).
    """

    samples: np.ndarray
    keys: frozenset[str] = frozenset()
    pairs: dict[str, frozenset[str]] = field(default_factory=dict)
    strict: bool = False
    beyond: int = 0

    def __len__(self) -> int:
        named = len(self.keys) + sum(len(v) for v in self.pairs.values())
        return len(self.samples) + named + self.beyond


def _sorted_unique(values: Any) -> np.ndarray:
    """Sorted distinct int64 values (a sort: ``numpy.unique`` hashes int64, ~10x slower here)."""
    a = np.sort(np.asarray(values, dtype=np.int64))
    if len(a) < 2:
        return a
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a if bool(keep.all()) else a[keep]


def _entry(text: str, where: str) -> tuple[str | None, str]:
    """``(shard or None, key)`` of one entry: ``KEY``, ``SHARD<TAB>KEY`` or ``SHARD.tar/KEY``."""
    if "\t" in text:
        shard, _, key = text.partition("\t")
    else:
        m = _PAIR.match(text)
        shard, key = (m.group(1), m.group(2)) if m else ("", text)
    if not key or "\t" in key:
        raise ExclusionError(f"{where}: not a key or shard/key: {text!r}")
    return shard or None, key


def read_exclude_file(path: str | os.PathLike[str]) -> list[str]:
    """The entries of an exclusion file: one per line, ``#`` comment lines and blank lines skipped.

    Lines are UTF-8; only the line ending is removed (a key may hold spaces).

    Raises:
        FileNotFoundError: No such file.
    """
    out = []
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            text = line.rstrip("\r\n")
            if text.strip() and not text.startswith("#"):
                out.append(text)
    return out


def parse_exclude(value: Any, *, strict: bool = False) -> ExcludeSpec | None:
    """The ``exclude=`` argument as an :class:`ExcludeSpec` (``None`` for no exclusion).

    Args:
        value: ``None``; a path of a file of entries (:func:`read_exclude_file`): ``KEY``,
            ``SHARD<TAB>KEY`` or ``SHARD/KEY`` where ``SHARD`` ends in ``.tar``, ``.tgz`` or
            ``.tar.gz``; or an iterable of those strings, of ``(shard, key)`` pairs and of
            ints (global sample numbers; a numpy integer array works).
        strict: Refuse entries naming no sample when resolved.

    Raises:
        ExclusionError: An entry is none of those forms.
        TypeError: ``value`` is not a path or an iterable.
    """
    if value is None:
        return None
    if isinstance(value, ExcludeSpec):
        return dataclasses.replace(value, strict=value.strict or strict)
    where = "exclude"
    if isinstance(value, (str, os.PathLike)):
        where = os.fspath(value)
        value = read_exclude_file(value)
    if isinstance(value, (list, tuple)) and all(type(x) is int for x in value):
        as_array = np.asarray(value)  # a list of sample numbers: one conversion
        if as_array.dtype.kind in "iu":
            value = as_array
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return ExcludeSpec(_sorted_unique(value.astype(np.int64, copy=False)), strict=strict)
    if not isinstance(value, Iterable):
        raise TypeError(f"exclude must be a file path or an iterable, not {type(value).__name__}")
    numbers: list[int] = []
    beyond = 0
    keys: set[str] = set()
    pairs: dict[str, set[str]] = {}
    for item in value:
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            number = int(item)
            if -(1 << 63) <= number < 1 << 63:
                numbers.append(number)
            else:
                beyond += 1
            continue
        if isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            shard, key = item
        elif isinstance(item, str):
            shard, key = _entry(item, where)
        else:
            raise ExclusionError(f"{where}: not a key, shard/key pair or sample number: {item!r}")
        if shard is None:
            keys.add(key)
        else:
            pairs.setdefault(shard, set()).add(key)
    return ExcludeSpec(
        _sorted_unique(np.asarray(numbers, dtype=np.int64)),
        frozenset(keys),
        {s: frozenset(k) for s, k in pairs.items()},
        strict,
        beyond,
    )


def _shards_named(
    names: Iterable[str], url: Callable[[int], str], among: Iterable[int]
) -> dict[str, list[int]]:
    """Each name's shards: the URL itself, or a URL ending in ``/NAME``.

    Args:
        names: Shard names as given (normalised here).
        url: Shard ``k``'s URL.
        among: The shards to look at, in order: all, or a superset of those whose URL has a
            name's last part as its own (:func:`pair_parts`, the index's ``shards_ending``).
    """
    wanted = {_name(n) for n in names}
    by_base: dict[str, list[str]] = {}
    for name in wanted:
        by_base.setdefault(name.rsplit("/", 1)[-1], []).append(name)
    found: dict[str, list[int]] = {name: [] for name in wanted}
    for k in among:
        u = url(k)
        for name in by_base.get(u.rsplit("/", 1)[-1], ()):
            if u == name or u.endswith("/" + name):
                found[name].append(k)
    return found


def pair_parts(spec: ExcludeSpec) -> set[str]:
    """The last parts of the shard names of ``spec``'s pairs (what an index looks up).

    A shard a pair names has the name's last part as its URL's last part. A name ending in
    ``/`` has none: only a URL ending in ``/`` can match it, and the index keeps those as
    candidates always.
    """
    parts = (_name(n).rsplit("/", 1)[-1] for n in spec.pairs)
    return {part for part in parts if part}


def _name(n: str) -> str:
    n = n.replace(os.sep, "/")
    while n.startswith("./"):
        n = n[2:]
    return n


def resolve(
    spec: ExcludeSpec,
    starts: np.ndarray,
    url: Callable[[int], str],
    table: Callable[[int], ShardMembers],
    *,
    shards: Sequence[int] | None = None,
    among: np.ndarray | Sequence[int] | None = None,
) -> tuple[np.ndarray, int]:
    """The excluded global sample numbers (sorted int64) and the count of unknown entries.

    Args:
        spec: What to exclude.
        starts: ``N + 1`` cumulative sample counts from 0.
        url: Shard ``k``'s URL (asked once per shard of ``among``, only for pairs).
        table: Shard ``k``'s member table (read for the shards keys must be looked up in).
        shards: Look bare keys up in these shards only (default: all).
        among: Sorted shards that may be the ones pairs name (the index's ``shards_ending``
            of :func:`pair_parts`); default: all, one URL each.

    Raises:
        ExclusionError: ``spec.strict`` and an entry names no sample, or a shard name matches
            several shards.
    """
    total = int(starts[-1])
    nums = spec.samples
    inside = (nums >= 0) & (nums < total)
    unknown = int(len(nums) - np.count_nonzero(inside)) + spec.beyond
    parts = [nums[inside]]
    nshards = len(starts) - 1
    looked = range(nshards) if among is None else np.asarray(among, dtype=np.int64).tolist()
    named = _shards_named(spec.pairs, url, looked) if spec.pairs else {}
    for shard, keys in spec.pairs.items():
        hits = named[_name(shard)]
        if len(hits) > 1:
            raise ExclusionError(
                f"exclude: shard {shard!r} names {len(hits)} shards; give its path"
            )
        if not hits:
            unknown += len(keys)
            continue
        k = hits[0]
        index = {key: j for j, key in enumerate(table(k).keys())}
        got = [index[key] for key in keys if key in index]
        unknown += len(keys) - len(got)
        parts.append(np.asarray(got, dtype=np.int64) + int(starts[k]))
    if spec.keys:
        seen: set[str] = set()
        for k in range(len(starts) - 1) if shards is None else shards:
            got = [j for j, key in enumerate(table(k).keys()) if key in spec.keys]
            seen.update(table(k).key(j) for j in got)
            parts.append(np.asarray(got, dtype=np.int64) + int(starts[k]))
        unknown += len(spec.keys) - len(seen)
    excluded = _sorted_unique(np.concatenate(parts))
    if unknown and spec.strict:
        raise ExclusionError(f"exclude: {unknown} of {len(spec)} entries name no sample")
    return excluded, unknown


def resolve_described(
    spec: ExcludeSpec, loaded: Description, table: Callable[[int], ShardMembers]
) -> tuple[np.ndarray, int]:
    """:func:`resolve` against a dataset's description.

    Pairs look only at the shards whose URL may end in their names, as the index finds them
    (``shards_ending``: a shard table's URL column or an SQLite query, no record per shard);
    with any other index, at every shard's record.
    """
    infos, find = loaded.infos, loaded.shards_ending
    among = find(pair_parts(spec)) if spec.pairs and find is not None else None
    return resolve(spec, loaded.starts, lambda k: infos[k].url, table, among=among)


def index_exclusion(index: Any, reader: Any) -> np.ndarray | None:
    """The samples a local index's exclusion file (``P.exclude``) leaves out, or ``None``.

    What opening ``ShardListDataset(P)`` leaves out without ``exclude=``: the file's entries
    resolved (strictly, as opening does) against ``reader``, the opened index ``P``.

    Args:
        index: The index's path or URL (only a local path has such a file).
        reader: The opened index.

    Raises:
        ExclusionError: An entry names no sample, or the index has no member tables.
    """
    from ..index import shard_getter, shard_sample_counts, shards_ending
    from ..storage import is_local

    if not isinstance(index, (str, os.PathLike)):
        return None
    path = os.fspath(index).removeprefix("file://")
    if not is_local(path) or not os.path.isfile(path + SIDECAR):
        return None
    beside = parse_exclude(path + SIDECAR, strict=True)
    if beside is None:
        return None
    counts = np.asarray(shard_sample_counts(reader), dtype=np.int64)
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    get = shard_getter(reader)

    def table(k: int) -> ShardMembers:
        got = reader.members(k)
        if got is None:
            raise ExclusionError(f"{path + SIDECAR}: the index records no member tables")
        return got  # type: ignore[no-any-return]

    among = shards_ending(reader, pair_parts(beside)) if beside.pairs else None
    excluded, _ = resolve(beside, starts, lambda k: str(get(k).url), table, among=among)
    return excluded


class Kept:
    """The dataset without its excluded samples: kept counts, and kept index -> raw index.

    Has the attributes the dataset reads from a :class:`~wids.dataset.description.Description`
    (``lengths``, ``cum``, ``total``, ``components``), in kept samples.

    Args:
        excluded: Excluded global sample numbers (sorted, unique, in range).
        lengths: Samples per shard, all of them.
        components: The (sub-)datasets as ranges of raw global indices.
    """

    def __init__(
        self, excluded: np.ndarray, lengths: np.ndarray, components: list[DatasetComponent]
    ) -> None:
        self.excluded = excluded
        # excluded[k] - k: how many kept samples lie before the k-th exclusion
        self._before = excluded - np.arange(len(excluded), dtype=np.int64)
        # bisect on a list beats numpy's searchsorted for one index, up to a size (as cum_list)
        self._before_list = self._before.tolist() if len(excluded) <= _SMALL else None
        raw_cum = np.cumsum(lengths, dtype=np.int64)
        shard_of = np.searchsorted(raw_cum, excluded, side="right")
        self.lengths = lengths - np.bincount(shard_of, minlength=len(lengths)).astype(np.int64)
        self.cum = np.cumsum(self.lengths, dtype=np.int64)
        self.total = int(self.cum[-1]) if len(self.cum) else 0
        self.components = [
            DatasetComponent(
                c.name, c.weight, self._kept_before(c.start), self._kept_before(c.stop)
            )
            for c in components
        ]

    def _kept_before(self, raw: int) -> int:
        return raw - int(np.searchsorted(self.excluded, raw, side="left"))

    def raw(self, i: int) -> int:
        """The raw global index of kept sample ``0 <= i < total``."""
        small = self._before_list
        if small is not None:
            return i + bisect.bisect_right(small, i)
        return i + int(self._before.searchsorted(i, side="right"))  # the method: no dispatch


def warn_unknown(unknown: int, spec: ExcludeSpec, stacklevel: int) -> None:
    """One warning counting the entries that named no sample."""
    if unknown:
        warnings.warn(
            f"exclude: {unknown} of {len(spec)} entries name no sample of this dataset "
            "(ignored; exclude_strict=True refuses them)",
            stacklevel=stacklevel,
        )
