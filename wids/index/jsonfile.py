"""The JSON index: a ``wids-shard-index-v1`` description plus per-shard member sidecars.

Layout, for an index ``train.json``::

    train.json                      the description; the reference wids loads it unchanged
    train.members/                  one sidecar per shard, read only when that shard is needed
        3f2a9c0d1e4b5a67-train-000000.tar.json
        ...

``train.json`` is a reference description (``__kind__``, ``wids_version``, ``name``,
``shardlist`` of ``url``/``nsamples``/``filesize``[/``md5sum``], ``datasets`` for
sub-datasets) with extra keys the reference ignores:

- top level: ``"wids_index": {"format": "wids-index-json", "version": 1, "members_dir":
  "train.members", "report": {...}}`` (the builder's report);
- per shard: ``etag`` and ``mtime`` (what identified the shard's bytes when indexed) and
  ``members``, the sidecar's path relative to the description's directory.

A sidecar (``<16 hex of sha1(url)>-<basename>.json``) holds ``format``
(``wids-index-json-members``), ``version``, the shard's ``url``/``nsamples``/``size``/
``etag``/``mtime`` as in the description and the columns of :meth:`ShardMembers.to_columns`.
On load it must name the same file (the URL's last part) with the same size, etag and mtime
as the shard's entry, so a stale sidecar is an error, never wrong offsets, while an index
whose shard URLs were edited to a mirror of the same files keeps working.

Only the top-level file is read when an index is opened; a 100k-shard description loads in a
fraction of a second. Every file is published atomically (temporary file + ``os.replace``);
sidecars are written first and the description last, and sidecars no longer referenced are
removed when the writer closes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from ..errors import IndexFormatError, UntrustedLocationError
from .model import REPAIR_HINT, ShardInfo, ShardMembers
from .spec import (
    KIND,
    Component,
    Spec,
    UrlMap,
    check_remote_ref,
    check_url_map,
    load_spec,
    read_bytes,
    resolve_url,
    url_dir,
)

__all__ = ["FORMAT", "MEMBERS_FORMAT", "VERSION", "JsonIndex", "JsonIndexWriter"]

logger = logging.getLogger(__name__)

FORMAT = "wids-index-json"
"""``wids_index.format`` of a JSON index."""
MEMBERS_FORMAT = "wids-index-json-members"
"""``format`` of a sidecar member file."""
VERSION = 1
"""Version of both."""

# Keys of a shard entry with a meaning; the rest are extras kept for the caller.
_SHARD_KEYS = frozenset(("url", "nsamples", "filesize", "md5sum", "etag", "mtime", "members"))
_SIDECAR_NAME = re.compile(r"^[0-9a-f]{16}-.*\.json$")


def _members_dir(path: str) -> str:
    stem = path[: -len(".json")] if path.endswith(".json") else path
    return stem + ".members"


def _sidecar_name(url: str) -> str:
    digest = hashlib.sha1(url.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    base = url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)[:80]
    return f"{digest}-{safe}.json"


class JsonIndex:
    """An index or dataset description in JSON, ours or the reference's.

    The description is loaded on first use (``shards``, ``name``, ``components``, ...); member
    tables are read one shard at a time by :meth:`members`.

    Args:
        url: Path or URL of the JSON file; anything :func:`wids.index.spec.load_spec` accepts (an
            open stream, a list of shard dicts) works too.
        storage_options: fsspec options for remote files.
        base: Overrides the directory relative shard URLs resolve against.
        url_map: Prefix rewrites of shard URLs, for mirrors (see
            :func:`wids.index.spec.check_url_map`).
        allow_local_shards: Let an index read from a remote location name local files (refused
            by default; see :func:`wids.index.spec.check_remote_ref`).

    Raises:
        IndexFormatError: (on first use) The file is malformed or of an unknown version.
        ValueError: ``url_map`` is invalid.
    """

    def __init__(
        self,
        url: Any,
        storage_options: Mapping[str, Any] | None = None,
        *,
        base: str | None = None,
        url_map: Mapping[str, str] | UrlMap | None = None,
        allow_local_shards: bool = False,
    ) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.base = base
        self.url_map = check_url_map(url_map)
        self.allow_local_shards = bool(allow_local_shards)
        self._spec: Spec | None = None

    def __repr__(self) -> str:
        return f"JsonIndex({self.url!r})"

    def _load(self) -> Spec:
        if self._spec is None:
            spec = load_spec(
                self.url,
                storage_options=self.storage_options,
                base=self.base,
                url_map=self.url_map,
                allow_local_shards=self.allow_local_shards,
            )
            meta = spec.top.get("wids_index")
            if meta is not None and not (
                isinstance(meta, dict)
                and meta.get("format") == FORMAT
                and meta.get("version") == VERSION
            ):
                raise IndexFormatError(
                    f"unknown wids_index {meta!r}; expected format {FORMAT!r} version {VERSION}",
                    shard=self._where(),
                )
            self._spec = spec
        return self._spec

    def _where(self) -> str:
        from ..storage import redact_url

        return redact_url(self.url) if isinstance(self.url, str) else "<json>"

    @property
    def spec(self) -> Spec:
        """The loaded description."""
        return self._load()

    @property
    def name(self) -> str:
        """The description's ``name`` (``""`` when none)."""
        return self._load().name

    @property
    def shards(self) -> list[ShardInfo]:
        """All shards with resolved URLs."""
        return self._load().shards

    @property
    def components(self) -> list[Component]:
        """The main shard list and the sub-datasets."""
        return self._load().components

    @property
    def report(self) -> dict[str, Any]:
        """The builder's report stored in the index (empty for a reference description)."""
        meta = self._load().top.get("wids_index") or {}
        report = meta.get("report")
        return dict(report) if isinstance(report, dict) else {}

    @property
    def has_members(self) -> bool:
        """Whether any shard has a member table (false for a reference description)."""
        return any("members" in e for e in self._load().extras)

    def shard_extra(self, shard: int) -> dict[str, Any]:
        """Keys of a shard's entry that the index format does not define."""
        entry = self._load().extras[shard]
        return {k: v for k, v in entry.items() if k not in _SHARD_KEYS}

    def members(self, shard: int) -> ShardMembers | None:
        """Read the member table of one shard from its sidecar.

        Returns:
            The table, or ``None`` when the entry has no ``members`` pointer.

        Raises:
            IndexFormatError: The sidecar is malformed or does not match the shard entry.
            ShardNotFoundError: The sidecar is missing.
        """
        spec = self._load()
        entry = spec.extras[shard]
        pointer = entry.get("members")
        if pointer is None:
            return None
        if not isinstance(pointer, str) or not pointer:
            raise IndexFormatError(
                f"shardlist[{shard}]: 'members' must be a path, got {pointer!r}",
                shard=self._where(),
            )
        origin = spec.origins[shard]
        url = resolve_url(pointer, url_dir(origin) if origin else self.base)
        from ..storage import redact_url

        refused = check_remote_ref(url, origin, self.allow_local_shards)
        if refused:
            raise UntrustedLocationError(
                f"shardlist[{shard}]: members {refused}", shard=redact_url(origin or "")
            )

        where = redact_url(url)
        data = read_bytes(url, self.storage_options)
        try:
            cols = json.loads(data)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, over 4300 digits
            raise IndexFormatError(f"not valid JSON: {e}", shard=where) from None
        except RecursionError:
            raise IndexFormatError("not valid JSON: nested too deeply", shard=where) from None
        _check_sidecar(cols, entry, where)
        try:
            table = ShardMembers.from_columns(cols)
            table.check_extent(spec.shards[shard].size)
        except IndexFormatError as e:
            raise IndexFormatError(e.message, shard=where) from None
        if len(table) != spec.shards[shard].nsamples:
            raise IndexFormatError(
                f"{len(table)} samples in the member table, "
                f"{spec.shards[shard].nsamples} in the index",
                shard=where,
            )
        return table

    def close(self) -> None:
        """Nothing is held open; present for the reader protocol."""

    def __enter__(self) -> JsonIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _render_list(entries: list[dict[str, Any]], indent: str) -> str:
    if not entries:
        return "[]"
    return "[" + ",".join(f"\n{indent}  {json.dumps(e)}" for e in entries) + f"\n{indent}]"


def _check_sidecar(cols: Any, entry: Mapping[str, Any], where: str) -> None:
    if not isinstance(cols, dict):
        raise IndexFormatError("a member sidecar must be a JSON object", shard=where)
    if cols.get("format") != MEMBERS_FORMAT or cols.get("version") != VERSION:
        raise IndexFormatError(
            f"format {cols.get('format')!r} version {cols.get('version')!r}; "
            f"expected {MEMBERS_FORMAT!r} version {VERSION}",
            shard=where,
        )
    # Matched by the shard's file name and fingerprint, not its URL: an index whose shard
    # URLs were edited to a mirror holding the same files keeps its member tables.
    name, ename = _file_name(cols.get("url")), _file_name(entry.get("url"))
    if name != ename:
        raise IndexFormatError(
            f"stale member table: it is for shard {name!r}, the index entry is {ename!r}; "
            f"to repair, {REPAIR_HINT}",
            shard=where,
        )
    for key, ekey in (("size", "filesize"), ("etag", "etag"), ("mtime", "mtime")):
        if cols.get(key) != entry.get(ekey):
            raise IndexFormatError(
                f"stale member table: its shard's {key} is {cols.get(key)!r}, the index says "
                f"{entry.get(ekey)!r}; to repair, {REPAIR_HINT}",
                shard=where,
            )


def _file_name(url: Any) -> str | None:
    """A shard URL's file name (no directory, no query): what a mirror keeps."""
    if not isinstance(url, str):
        return None
    return url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


class JsonIndexWriter:
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

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.name = name
        self.members_dir = _members_dir(self.path)
        self._main: list[dict[str, Any]] = []
        self._datasets: list[dict[str, Any]] = []
        self._current = self._main
        self._report: dict[str, Any] = {}
        self._written: set[str] = set()
        self._closed = False

    def start_component(self, name: str, weight: float | None = None) -> None:
        """Start a sub-dataset; shards added from now on belong to it.

        Args:
            name: The component's name (``__dataset__`` in its samples).
            weight: Its mixing weight, if any.
        """
        self._check_open()
        entry: dict[str, Any] = {"name": name}
        if weight is not None:
            entry["weight"] = weight
        entry["shardlist"] = self._current = []
        self._datasets.append(entry)

    def add(
        self,
        info: ShardInfo,
        members: ShardMembers | None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one shard and write its member sidecar.

        Args:
            info: The shard; its ``url`` is stored as given (relative to the index's directory
                or absolute).
            members: Its member table, or ``None`` to record the shard without offsets.
            extra: More keys for the shard's entry (must not redefine the format's keys).

        Raises:
            ValueError: ``members`` disagrees with ``info.nsamples``, or ``extra`` redefines a
                key of the format.
        """
        self._check_open()
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
            clash = _SHARD_KEYS.intersection(extra)
            if clash:
                raise ValueError(f"extra keys {sorted(clash)} are reserved by the index format")
            entry.update(extra)
        if members is not None:
            if len(members) != info.nsamples:
                raise ValueError(
                    f"{info.url}: member table has {len(members)} samples, nsamples is "
                    f"{info.nsamples}"
                )
            entry["members"] = self._write_sidecar(info, members)
        self._current.append(entry)

    def _write_sidecar(self, info: ShardInfo, members: ShardMembers) -> str:
        from ..atomic import atomic_write_bytes

        name = _sidecar_name(info.url)
        doc: dict[str, Any] = {
            "format": MEMBERS_FORMAT,
            "version": VERSION,
            "url": info.url,
            "nsamples": info.nsamples,
            "size": info.size,
            "etag": info.etag,
            "mtime": info.mtime,
        }
        doc.update(members.to_columns())
        os.makedirs(self.members_dir, exist_ok=True)
        data = json.dumps(doc, separators=(",", ":")).encode("ascii")
        # No fsync per sidecar (a 100k-shard index would take minutes): a sidecar lost in a
        # crash fails its checks on load instead of giving wrong offsets.
        atomic_write_bytes(os.path.join(self.members_dir, name), data, fsync=False)
        self._written.add(name)
        return f"{os.path.basename(self.members_dir)}/{name}"

    def set_report(self, report: Mapping[str, Any]) -> None:
        """Store the builder's report (JSON-serialisable) in the index."""
        self._check_open()
        self._report = dict(report)

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
        try:
            names = os.listdir(self.members_dir)
        except FileNotFoundError:
            return
        for name in names:
            if _SIDECAR_NAME.match(name) and name not in self._written:
                try:
                    os.unlink(os.path.join(self.members_dir, name))
                except FileNotFoundError:
                    pass

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: writer is closed")

    def __enter__(self) -> JsonIndexWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
