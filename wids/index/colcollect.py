"""Collecting a shard's metadata columns (:mod:`wids.index.columns`) from its bytes.

Two ways in, with the same values:

- :func:`shard_columns`: from a shard's member table and its source (``wids index create
  --column``, :func:`add_columns`): sizes come from the table; ``.json`` members are read in
  a few range reads (members close together in one block, at most :data:`BLOCK` bytes);
- :class:`RowCollector`: from each sample's encoded members as a writer writes them
  (``ShardWriter(columns=...)``).

:func:`add_columns_locked` adds columns to an existing local index (the caller holds its
writer lock: a build, or :func:`wids.index.coladd.add_columns`): it rewrites the index with
each shard's columns in its extra keys (shards, member tables, components and report as they
were). :func:`warn_if_dropped` warns before a rewrite without columns drops the
ones an index has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ColumnError
from .columns import (
    EXTRA_KEY,
    MAX_JSON_BYTES,
    ColumnSpec,
    ShardColumn,
    encode_columns,
    json_value,
    parse_specs,
    values_column,
)
from .members import ShardMembers

__all__ = ["BLOCK", "RowCollector", "add_columns_locked", "shard_columns", "warn_if_dropped"]

BLOCK = 8 << 20
"""The most bytes one read of ``.json`` members takes."""
_GAP = 64 << 10  # members closer than this are read in one block


def _rows_of(members: ShardMembers, field: str) -> tuple[np.ndarray, np.ndarray]:
    """``(samples, rows)``: the member rows of ``field`` and the sample each belongs to."""
    try:
        f = members.fields.index(field)
    except ValueError:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rows = np.flatnonzero(np.asarray(members.member_field) == f)
    samples = np.searchsorted(np.asarray(members.sample_start), rows, side="right") - 1
    return samples.astype(np.int64), rows


def _blocks(offsets: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int, int, int]]:
    """``(start, end, first, stop)``: reads covering members ``first:stop`` (sorted offsets)."""
    out = []
    i, n = 0, len(offsets)
    while i < n:
        start = int(offsets[i])
        end = start + int(sizes[i])
        j = i + 1
        while j < n:
            nxt = int(offsets[j])
            stop = nxt + int(sizes[j])
            if nxt - end > _GAP or stop - start > BLOCK:
                break
            end = max(end, stop)
            j += 1
        out.append((start, end, i, j))
        i = j
    return out


def shard_columns(
    specs: Sequence[ColumnSpec], members: ShardMembers, source: Any, shard: str
) -> dict[str, ShardColumn]:
    """A shard's columns from its member table and its bytes.

    Args:
        specs: The columns to collect.
        members: The shard's member table.
        source: Its :class:`~wids.storage.Source` (``read_range``), read only for ``json:``.
        shard: Its URL (credentials removed), for errors.

    Raises:
        ColumnError: A ``.json`` member is over :data:`MAX_JSON_BYTES` or not JSON, or a
            value is unusable (naming the shard and the sample's key).
    """
    n = len(members)
    out: dict[str, ShardColumn] = {}
    sizes = np.asarray(members.member_size)
    docs: list[bytes | None] | None = None
    for spec in specs:
        if spec.source in ("size", "has"):
            samples, rows = _rows_of(members, spec.arg)
            present = np.zeros(n, dtype=bool)
            present[samples] = True
            if spec.source == "has":
                out[spec.name] = ShardColumn("bool", present, None)
                continue
            values = np.zeros(n, dtype=np.int64)
            values[samples] = sizes[rows]
            missing = ~present
            out[spec.name] = ShardColumn("int64", values, missing if missing.any() else None)
            continue
        if docs is None:
            docs = _json_members(members, source, shard)
        keys = members.keys()
        picked = [
            None if d is None else json_value(d, spec.arg, f"{shard}: sample {keys[i]!r}")
            for i, d in enumerate(docs)
        ]
        out[spec.name] = values_column(picked, f"{shard}: ", keys)
    return out


def _json_members(members: ShardMembers, source: Any, shard: str) -> list[bytes | None]:
    """Each sample's ``.json`` member's bytes (``None`` where it has none)."""
    samples, rows = _rows_of(members, ".json")
    offsets = np.asarray(members.member_offset)[rows]
    sizes = np.asarray(members.member_size)[rows]
    docs: list[bytes | None] = [None] * len(members)
    if len(sizes) and int(sizes.max()) > MAX_JSON_BYTES:
        k = int(np.argmax(sizes))
        raise ColumnError(
            f"{shard}: sample {members.key(int(samples[k]))!r}: .json member of "
            f"{int(sizes[k])} bytes, over {MAX_JSON_BYTES}"
        )
    read = _tar_read(members, source, shard) if len(sizes) else None
    for start, end, first, stop in _blocks(offsets, sizes):
        block = read(start, end)  # type: ignore[misc]
        for k in range(first, stop):
            a = int(offsets[k]) - start
            docs[int(samples[k])] = block[a : a + int(sizes[k])]
    return docs


def _tar_read(members: ShardMembers, source: Any, shard: str) -> Any:
    """``read(start, end)`` of the shard's tar: its bytes, or decoded from its seek points."""
    if members.seek is None:
        return source.read_range
    from ..compress import tar_reader

    read = tar_reader(members.seek, source.read_range)
    if read is None:
        raise ColumnError(
            f"{shard}: a compressed shard without seek points: json: columns need its .json "
            "members, which only decompressing the whole shard reaches (size: and has: work)"
        )
    return read


class RowCollector:
    """Columns collected sample by sample from encoded members (a writer's samples).

    Args:
        specs: The columns (texts or specs).

    Raises:
        ColumnError: A malformed spec.
    """

    def __init__(self, specs: Sequence[str | ColumnSpec]) -> None:
        self.specs = parse_specs(specs)
        self._rows: list[list[Any]] = [[] for _ in self.specs]
        self._keys: list[str] = []

    def row(self, key: str, fields: Mapping[str, Any], where: str) -> list[Any]:
        """One sample's values from its members (field with its dot -> bytes), not yet kept.

        Raises:
            ColumnError: The sample's ``.json`` member is unusable for a ``json:`` column.
        """
        doc = fields.get(".json")
        out: list[Any] = []
        for spec in self.specs:
            if spec.source == "has":
                out.append(spec.arg in fields)
            elif spec.source == "size":
                data = fields.get(spec.arg)
                out.append(None if data is None else len(data))
            else:
                out.append(
                    None if doc is None else json_value(doc, spec.arg, f"{where}: sample {key!r}")
                )
        return out

    def append(self, key: str, row: Sequence[Any]) -> None:
        """Keep one sample's values (once it is written)."""
        for values, v in zip(self._rows, row, strict=True):
            values.append(v)
        self._keys.append(key)

    def take(self, where: str) -> dict[str, Any] | None:
        """The extra keys of the shard written since the last call (and start a new one)."""
        if not self.specs:
            return None
        cols = {
            s.name: values_column(r, f"{where}: ", self._keys)
            for s, r in zip(self.specs, self._rows, strict=True)
        }
        n = len(self._keys)
        self._rows = [[] for _ in self.specs]
        self._keys = []
        return {EXTRA_KEY: encode_columns(cols, n)}


def add_columns_locked(path: str, specs: Sequence[ColumnSpec], store: Any) -> int:
    """:func:`wids.index.coladd.add_columns` for a caller holding the index's writer lock."""
    from ..storage import output_dir, stored_url
    from .access import count_shards, iter_shards
    from .registry import create_index_writer, open_index

    reader = open_index(path, store)
    try:
        writer = create_index_writer(path, name=reader.name or None)
        try:
            _rewrite(reader, writer, specs, store, output_dir(path), stored_url, iter_shards)
        except BaseException:
            writer.abort()
            raise
        writer.close()
        return count_shards(reader)
    finally:
        reader.close()


def _rewrite(
    reader: Any,
    writer: Any,
    specs: Sequence[ColumnSpec],
    store: Any,
    out_dir: str,
    stored_url: Any,
    iter_shards: Any,
) -> None:
    """Copy ``reader`` into ``writer`` with each shard's columns collected (a few at once)."""
    import collections
    import concurrent.futures as cf

    comps = reader.components
    firsts = {c.first_shard: c for c in comps}
    window: collections.deque[tuple[int, Any, ShardMembers, cf.Future[Any]]] = collections.deque()
    with cf.ThreadPoolExecutor(_THREADS, thread_name_prefix="wids-columns") as pool:
        try:
            for i, info in enumerate(iter_shards(reader)):
                members = reader.members(i)
                if members is None:
                    raise ColumnError(
                        f"{_where(info)}: no member table in the index (rebuild it with wids)"
                    )
                window.append(
                    (i, info, members, pool.submit(_collect, specs, members, info, store))
                )
                if len(window) >= 2 * _THREADS:
                    _put(reader, writer, firsts, out_dir, stored_url, *window.popleft())
            while window:
                _put(reader, writer, firsts, out_dir, stored_url, *window.popleft())
        finally:
            for *_, fut in window:
                fut.cancel()
    writer.set_report(reader.report)


_THREADS = 8  # shards whose .json members are read at once (remote shards: latency-bound)


def _where(info: Any) -> str:
    from ..storage import redact_url

    return str(redact_url(info.url))


def _collect(
    specs: Sequence[ColumnSpec], members: ShardMembers, info: Any, store: Any
) -> dict[str, ShardColumn]:
    src = store.source(info.url, size=info.size, etag=info.etag)
    try:
        return shard_columns(specs, members, src, _where(info))
    finally:
        src.close()


def _put(
    reader: Any,
    writer: Any,
    firsts: Mapping[int, Any],
    out_dir: str,
    stored_url: Any,
    i: int,
    info: Any,
    members: ShardMembers,
    fut: Any,
) -> None:
    from .columns import decode_columns
    from .model import ShardInfo

    comp = firsts.get(i)
    if comp is not None and not (
        i == 0 and comp.name == (reader.name or "") and comp.weight is None
    ):
        writer.start_component(comp.name, comp.weight)
    cols = fut.result()
    extra = dict(reader.shard_extra(i))
    if extra.get(EXTRA_KEY) is not None:  # columns of other names are kept
        kept = decode_columns(extra, len(members), _where(info))
        cols = {**{k: v for k, v in kept.items() if k not in cols}, **cols}
    extra[EXTRA_KEY] = encode_columns(cols, len(members))
    stored = ShardInfo(
        stored_url(info.url, out_dir),
        info.nsamples,
        info.size,
        info.etag,
        info.mtime,
        info.md5sum,
    )
    writer.add(stored, members, extra)


def warn_if_dropped(index: str, why: str, stacklevel: int = 2) -> None:
    """Warn when the local ``index`` has metadata columns that rewriting it without drops.

    The index keeps each column's values, not where they came from, so a build (or a writer
    extending it) without ``columns`` cannot collect them for new or changed shards: it
    writes none.

    Args:
        index: The index about to be rewritten (a remote or missing one is not looked at).
        why: What drops them, for the message.
        stacklevel: For :func:`warnings.warn`, counted from the caller.
    """
    import os
    import warnings

    from ..errors import WidsError
    from ..storage import is_remote
    from .access import count_shards
    from .registry import open_index

    if is_remote(index) or not os.path.isfile(index):
        return
    try:
        reader = open_index(index, None)
    except (WidsError, OSError):
        return  # the rewrite says what is wrong with it
    try:
        entry = reader.shard_extra(0).get(EXTRA_KEY) if count_shards(reader) else None
    except (WidsError, OSError):
        entry = None
    finally:
        reader.close()
    names = entry.get("columns") if isinstance(entry, dict) else None
    if isinstance(names, dict) and names:
        listed = ", ".join(sorted(str(n) for n in names)[:8])
        warnings.warn(
            f"{index} has metadata columns ({listed}); {why}, so the new index has none: "
            "pass columns=[...] (wids index create --column SPEC) to keep them",
            UserWarning,
            stacklevel=stacklevel + 1,
        )
