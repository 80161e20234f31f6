"""The JSON index writer: sidecars as shards are added, the description published last.

The layout is described in :mod:`wids.index.jsonformat`.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .jsonformat import (
    COLUMNS_IN_SIDECAR,
    COLUMNS_KEY,
    FORMAT,
    MEMBERS_FORMAT,
    SEEK_VERSION,
    SHARD_KEYS,
    SIDECAR_NAME,
    VERSION,
    members_dir,
    sidecar_name,
)
from .members import ShardMembers
from .model import BaseIndexWriter, ShardInfo, check_entry
from .recognise import HEAD_BYTES, named_members_dir
from .spec import KIND

__all__ = ["JsonIndexWriter", "render_sidecar"]


def render_sidecar(info: ShardInfo, members: ShardMembers, columns: Any = None) -> bytes:
    """The bytes of a shard's member sidecar (the same wherever it is written).

    Args:
        info: The shard as the index records it (``url`` as stored).
        members: Its member table.
        columns: The shard's metadata columns (``wids_columns``, :mod:`wids.index.columns`),
            kept here rather than in the description, which then opens as fast without them.
    """
    seek = members.seek
    doc: dict[str, Any] = {
        "format": MEMBERS_FORMAT,
        "version": VERSION if seek is None else SEEK_VERSION,
        "url": info.url,
        "nsamples": info.nsamples,
        "size": info.size,
        "etag": info.etag,
        "mtime": info.mtime,
        **({} if info.md5sum is None else {"md5sum": info.md5sum}),
        **({} if seek is None else {"seek": base64.b64encode(seek.to_bytes()).decode("ascii")}),
        **({} if columns is None else {COLUMNS_KEY: columns}),
        "fields": list(members.fields),
        "keys": members.keys(),
    }
    # As json.dumps(doc | members.to_columns()) writes it, the integer columns by numpy.
    parts = [json.dumps(doc, separators=(",", ":"))[:-1]]
    for name, column in (
        ("sample_start", members.sample_start),
        ("member_field", members.member_field),
        ("member_offset", members.member_offset),
        ("member_size", members.member_size),
    ):
        parts.append(f',"{name}":')
        parts.append(_json_ints(column))
    parts.append("}")
    return "".join(parts).encode("ascii")


def _json_ints(values: np.ndarray) -> str:
    """A JSON array of integers, as ``json.dumps(values.tolist(), separators=(",", ":"))``.

    Non-negative values are rendered digit by digit in numpy (a few vectorised operations per
    decimal digit instead of a Python call per value).
    """
    n = len(values)
    if n == 0 or int(values.min()) < 0:
        return json.dumps(values.tolist(), separators=(",", ":"))
    v = values.astype(np.uint64)
    width = len(str(int(v.max())))
    text = np.empty((n, width + 1), dtype=np.uint8)
    text[:, width] = 44  # ","
    for k in range(width - 1, -1, -1):
        text[:, k] = v % 10 + 48
        v //= 10
    powers = 10 ** np.arange(1, width, dtype=np.uint64)
    ndigits = np.searchsorted(powers, values.astype(np.uint64), side="right") + 1
    keep = np.arange(width + 1) >= (width - ndigits)[:, None]
    return "[" + text[keep].tobytes()[:-1].decode("ascii") + "]"


def _owns(path: str, directory: str) -> bool:
    """Whether the members ``directory`` is wids's: none yet, or the index at ``path`` names it.

    Sidecars no longer referenced are removed only from such a directory; a directory of that
    name made by someone else (no index beside it, or one that does not name it) keeps every
    file, whatever its name.
    """
    if not os.path.lexists(directory):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return False
    return named_members_dir(head) == os.path.basename(directory)


def _render_list(entries: list[dict[str, Any]], indent: str) -> str:
    if not entries:
        return "[]"
    return "[" + ",".join(f"\n{indent}  {json.dumps(e)}" for e in entries) + f"\n{indent}]"


class JsonIndexWriter(BaseIndexWriter):
    """Writes a JSON index: sidecars as shards are added, the description on :meth:`close`.

    Shards added before any :meth:`start_component` call form the main ``shardlist``;
    each :meth:`start_component` opens an inline entry of ``datasets``. Use from one thread.

    Args:
        path: Local path of the description to write (conventionally ``*.json``).
        name: The dataset's name (top-level ``name``).

    Example:
        >>> with JsonIndexWriter("train.json", name="train") as w:  # doctest: +SKIP
        ...     w.add(ShardInfo("train-000000.tar", 100, size=123), members)
    """

    records_seek = True

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        super().__init__(path, name=name)
        self.members_dir = members_dir(self.path)
        self._owns_members_dir = _owns(self.path, self.members_dir)
        self._main: list[dict[str, Any]] = []
        self._datasets: list[dict[str, Any]] = []
        self._current = self._main
        self._written: set[str] = set()

    def _start_component(self, name: str, weight: float | None) -> None:
        entry: dict[str, Any] = {"name": name}
        if weight is not None:
            entry["weight"] = weight
        entry["shardlist"] = self._current = []
        self._datasets.append(entry)

    def _add(
        self, info: ShardInfo, members: ShardMembers | None, extra: Mapping[str, Any] | None
    ) -> None:
        entry: dict[str, Any] = {"url": info.url, "nsamples": info.nsamples}
        for key, value in (
            ("filesize", info.size),
            ("md5sum", info.md5sum),
            ("etag", info.etag),
            ("mtime", info.mtime),
        ):
            if value is not None:
                entry[key] = value
        if extra:
            clash = SHARD_KEYS.intersection(extra)
            if clash:
                raise ValueError(f"extra keys {sorted(clash)} are reserved by the index format")
            entry.update(extra)
        columns = None
        if members is not None and isinstance(entry.get(COLUMNS_KEY), dict):
            columns = entry[COLUMNS_KEY]  # in the sidecar, read only when asked for
            entry[COLUMNS_KEY] = COLUMNS_IN_SIDECAR
        if members is not None:
            entry["members"] = self._write_sidecar(info, members, columns)
            if members.seek is not None:  # nsamples is bounded by the tar's size, not the file's
                entry["tarsize"] = members.seek.uncompressed_size
        self._current.append(entry)

    def _write_sidecar(self, info: ShardInfo, members: ShardMembers, columns: Any = None) -> str:
        from ..atomic import atomic_write_bytes

        name = sidecar_name(info.url)
        os.makedirs(self.members_dir, exist_ok=True)
        # No fsync per sidecar (a 100k-shard index would take minutes): a sidecar lost in a
        # crash fails its checks on load instead of giving wrong offsets.
        data = render_sidecar(info, members, columns)
        atomic_write_bytes(os.path.join(self.members_dir, name), data, fsync=False)
        return self._record(name)

    def _record(self, name: str) -> str:
        self._written.add(name)
        return f"{os.path.basename(self.members_dir)}/{name}"

    def add_written(self, info: ShardInfo, tar_size: int | None = None) -> None:
        """Record one shard whose sidecar is already in place (written by a build's worker).

        The sidecar is ``members_dir/sidecar_name(info.url)`` beside the final description;
        it is not read or checked here (its writer rendered it with :func:`render_sidecar`).

        Args:
            info: The shard, as :meth:`add` takes it.
            tar_size: A compressed shard's decompressed tar size (its seek points'), else
                ``None``.
        """
        self._check_open()
        check_entry(info, None, tar_size=tar_size)
        self._add(info, None, None)
        entry = self._current[-1]
        entry["members"] = self._record(sidecar_name(info.url))
        if tar_size is not None:
            entry["tarsize"] = tar_size

    def flush(self, *, fsync: bool = True) -> None:
        """Publish the description of the shards added so far; the writer stays open.

        A writer that adds shards over a long time (:class:`~wids.ShardWriter`) calls this
        after each one, so the file on disk is always a loadable index of whole shards.

        Args:
            fsync: Flush it to disk before the rename (without, a crash of the process still
                leaves the old or the new description, a crash of the machine may leave
                neither).
        """
        self._check_open()
        from ..atomic import atomic_write

        with atomic_write(self.path, "w", encoding="ascii", fsync=fsync) as f:
            f.write(self._render())

    def close(self) -> None:
        """Publish the description atomically and remove sidecars no longer referenced."""
        if self._closed:
            return
        from ..atomic import atomic_write

        self._closed = True
        with atomic_write(self.path, "w", encoding="ascii") as f:
            f.write(self._render())
        self._remove_stale()

    def abort(self) -> None:
        """Give up: publish nothing more (sidecars already written stay until the next build)."""
        self._closed = True

    def _render(self) -> str:
        head: dict[str, Any] = {"__kind__": KIND, "wids_version": 1}
        if self.name is not None:
            head["name"] = self.name
        head["wids_index"] = {
            "format": FORMAT,
            "version": VERSION,
            "members_dir": os.path.basename(self.members_dir),
            "report": self._report,
        }
        # One shard per line: readable, diffable, and still one json.loads.
        parts = ["{"]
        parts += [f"{json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()]
        parts.append(f'"shardlist": {_render_list(self._main, "")}')
        if self._datasets:
            items = []
            for d in self._datasets:
                fields = [
                    f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in d.items() if k != "shardlist"
                ]
                items.append(
                    f'{{{"".join(fields)}"shardlist": {_render_list(d["shardlist"], "  ")}}}'
                )
            parts.append(',\n"datasets": [\n  ' + ",\n  ".join(items) + "\n]")
        parts.append("}\n")
        return "".join(parts)

    def _remove_stale(self) -> None:
        if not self._owns_members_dir:  # a directory someone else made: nothing is removed
            return
        try:
            names = os.listdir(self.members_dir)
        except FileNotFoundError:
            return
        for name in names:
            if SIDECAR_NAME.match(name) and name not in self._written:
                try:
                    os.unlink(os.path.join(self.members_dir, name))
                except FileNotFoundError:
                    pass
