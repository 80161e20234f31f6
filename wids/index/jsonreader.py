"""The JSON index reader: a description loaded on first use, member tables one shard at a time.

The layout is described in :mod:`wids.index.jsonformat`.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import IndexFormatError, UntrustedLocationError
from ..storage import Store, is_remote, redact_url
from .jsonformat import (
    COLUMNS_IN_SIDECAR,
    COLUMNS_KEY,
    FORMAT,
    MEMBERS_FORMAT,
    SEEK_VERSION,
    SHARD_KEYS,
    VERSION,
)
from .members import ShardMembers
from .model import REPAIR_HINT, Component, ShardInfo
from .sidecarparse import parse_sidecar
from .spec import Spec, load_spec, read_bytes
from .urls import UrlMap, check_remote_ref, check_url_map, resolve_url, url_dir

if TYPE_CHECKING:
    from ..compress import SeekPoints

__all__ = ["JsonIndex", "remote_sidecars"]

logger = logging.getLogger(__name__)


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
            :func:`wids.index.urls.check_url_map`).
        allow_local_shards: Let an index read from a remote location name local files (refused
            by default; see :func:`wids.index.urls.check_remote_ref`).
        data: The file's bytes, already read (:func:`wids.index.open_index` reads a remote
            ``*.json`` whole at once): loaded from them instead of read again.

    Raises:
        IndexFormatError: (on first use) The file is malformed or of an unknown version.
        ValueError: ``url_map`` is invalid.
    """

    def __init__(
        self,
        url: Any,
        storage_options: Mapping[str, Any] | Store | None = None,
        *,
        base: str | None = None,
        url_map: Mapping[str, str] | UrlMap | None = None,
        allow_local_shards: bool = False,
        data: bytes | None = None,
    ) -> None:
        self.url = url
        self._data = data  # dropped once loaded
        self.store = Store.of(storage_options)
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
                storage_options=self.store,
                base=self.base,
                url_map=self.url_map,
                allow_local_shards=self.allow_local_shards,
                data=self._data,
            )
            self._data = None
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
        """Keys of a shard's entry that the index format does not define.

        Metadata columns kept in the shard's sidecar (``wids_columns``) are read from there.

        Raises:
            IndexFormatError: Those columns' sidecar is malformed or stale.
        """
        entry = self._load().extras[shard]
        extra = {k: v for k, v in entry.items() if k not in SHARD_KEYS}
        if extra.get(COLUMNS_KEY) == COLUMNS_IN_SIDECAR:
            extra[COLUMNS_KEY] = self._sidecar_columns(shard)
        return extra

    def _sidecar_columns(self, shard: int) -> Any:
        """The ``wids_columns`` of a shard's sidecar (its head only is parsed, then checked)."""
        entry = self._load().extras[shard]
        url = self._sidecar_url(shard, entry)
        if url is None:
            raise IndexFormatError(
                f"shardlist[{shard}]: its columns are in a member table it has none of",
                shard=self._where(),
            )
        where = redact_url(url)
        data = read_bytes(url, self.store, "members")
        head = _sidecar_head(data)
        if head is None:
            try:
                head = json.loads(data)
            except ValueError as e:
                raise IndexFormatError(f"not valid JSON: {e}", shard=where) from None
            except RecursionError:
                raise IndexFormatError("not valid JSON: nested too deeply", shard=where) from None
        _check_sidecar(head, entry, where)
        if COLUMNS_KEY not in head:
            raise IndexFormatError(
                f"the index says the shard's columns are here, it has no {COLUMNS_KEY!r}; to "
                f"repair, {REPAIR_HINT}",
                shard=where,
            )
        return head[COLUMNS_KEY]

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
        url = self._sidecar_url(shard, entry)
        if url is None:
            return None
        where = redact_url(url)
        data = read_bytes(url, self.store, "members")
        fast = parse_sidecar(data)  # the writer's form, straight into arrays
        if fast is None:
            try:
                cols = json.loads(data)
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, over 4300 digits
                raise IndexFormatError(f"not valid JSON: {e}", shard=where) from None
            except RecursionError:
                raise IndexFormatError("not valid JSON: nested too deeply", shard=where) from None
            _check_sidecar(cols, entry, where)
        else:
            _check_sidecar(fast[0], entry, where)
        try:
            if fast is None:
                table = ShardMembers.from_columns(cols)
                seek = _seek_points(cols)
            else:
                head, key_blob, key_offsets, columns = fast
                starts, fids, offs, sizes = columns
                table = ShardMembers(
                    head["fields"], key_blob, key_offsets, starts, fids, offs, sizes
                )
                seek = _seek_points(head)
            if seek is not None:
                table = table.with_seek(seek)
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

    def _sidecar_url(self, shard: int, entry: Mapping[str, Any]) -> str | None:
        """Where shard ``shard``'s sidecar is (checked), or ``None`` when it has none."""
        pointer = entry.get("members")
        if pointer is None:
            return None
        if not isinstance(pointer, str) or not pointer or "\x00" in pointer:
            raise IndexFormatError(
                f"shardlist[{shard}]: 'members' must be a path, got {pointer!r}",
                shard=self._where(),
            )
        origin = self._load().origins[shard]
        url = resolve_url(pointer, url_dir(origin) if origin else self.base)
        refused = check_remote_ref(url, origin, self.allow_local_shards)
        if refused:
            raise UntrustedLocationError(
                f"shardlist[{shard}]: members {refused}", shard=redact_url(origin or "")
            )
        return url

    def close(self) -> None:
        """Nothing is held open; present for the reader protocol."""

    def __enter__(self) -> JsonIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seek_points(cols: Mapping[str, Any]) -> SeekPoints | None:
    """The seek points of a version-2 sidecar (checked by :func:`_check_sidecar`)."""
    text = cols.get("seek")
    if text is None:
        return None
    from ..compress import SeekPoints

    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise IndexFormatError("'seek' is not base64") from None
    return SeekPoints.from_bytes(data)


def _check_sidecar(cols: Any, entry: Mapping[str, Any], where: str) -> None:
    if not isinstance(cols, dict):
        raise IndexFormatError("a member sidecar must be a JSON object", shard=where)
    version = cols.get("version")
    if cols.get("format") != MEMBERS_FORMAT or version not in (VERSION, SEEK_VERSION):
        raise IndexFormatError(
            f"format {cols.get('format')!r} version {version!r}; "
            f"expected {MEMBERS_FORMAT!r} version {VERSION} or {SEEK_VERSION}",
            shard=where,
        )
    if (version == SEEK_VERSION) != isinstance(cols.get("seek"), str):
        raise IndexFormatError(
            f"a version {version} sidecar "
            + ("must have" if version == SEEK_VERSION else "cannot have")
            + " 'seek' (a string)",
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


def _sidecar_head(data: bytes) -> dict[str, Any] | None:
    """The keys before ``keys`` of a sidecar in the writer's form, or ``None``."""
    k = data.find(b',"keys":[')
    if k < 0:
        return None
    try:
        head = json.loads(data[:k].decode("utf-8") + "}")
    except (ValueError, RecursionError):
        return None
    return head if isinstance(head, dict) and "keys" not in head else None


def _file_name(url: Any) -> str | None:
    """A shard URL's file name (no directory, no query): what a mirror keeps."""
    if not isinstance(url, str):
        return None
    return url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def remote_sidecars(reader: Any) -> bool:
    """Whether ``reader.shard_extra(i)`` may read a remote file per shard (a remote JSON index)."""
    return isinstance(reader, JsonIndex) and isinstance(reader.url, str) and is_remote(reader.url)
