"""Offline index snapshots: a remote index's shard list kept in the cache directory.

:func:`save_snapshot` / :func:`open_snapshot` keep a copy of a remote index's shard list
(absolute URLs without credentials, sizes, etags, components; no member tables) in the cache
directory (``indexes/``, see :mod:`wids.cache.layout`), so that ``offline=True`` works with the
remote index's URL: shards come from the shard cache and their member tables from scanning the
cached copies.

A shard table (``*.widx``, the format of 10^5-10^6 shards) is self-contained: its snapshot is
a copy of the file, beside a small JSON file saying where it came from (the credential-free
directory its relative shard URLs resolve against, the mirror map, whether local shards were
allowed). Saving costs the file's bytes, not a record per shard; the copy keeps the member
tables. A table whose stored URLs could hold credentials (an ``@`` or a ``?`` in them) is
snapshotted as JSON instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..atomic import TempFile, atomic_write_bytes
from ..errors import OfflineError
from ..index import IndexReader, JsonIndex, JsonIndexWriter, TableIndex
from ..storage import FileStat, Store, redact_url, url_name
from .layout import cache_subdir

__all__ = ["open_snapshot", "save_snapshot", "snapshot_path"]

logger = logging.getLogger(__name__)

_SNAPSHOT = "wids-index-snapshot"
_SNAPSHOT_VERSION = 2  # 2: no credentials in any URL
_TABLE_SNAPSHOT = "wids-table-snapshot"


def snapshot_path(cache_dir: str | os.PathLike[str], url: str) -> str:
    """Where the snapshot of index ``url`` lives in ``cache_dir``.

    Named by the URL without credentials, so a re-signed URL of the same index finds it.
    """
    return os.path.join(os.fspath(cache_dir), "indexes", url_name(url, ".json"))


def save_snapshot(
    reader: IndexReader,
    url: str,
    cache_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | Store | None = None,
    stat: FileStat | None = None,
) -> str | None:
    """Keep a copy of the open index ``reader`` (read from ``url``) for offline use.

    The copy holds no secrets: its URLs (the index's and every shard's) are stored without
    ``user:password@`` and without signature or token query parameters (see
    :func:`wids.storage.redact.redact_url`). Offline, a shard is found in the shard cache under the
    same credential-free URL (:func:`wids.storage.url_name` ignores credentials).

    Rewritten only when the remote index changed (its size/etag/mtime, one stat; ``stat``
    gives one taken while the index was read, saving the request). Failures are logged, not
    raised: the snapshot is a convenience for later offline runs.

    Returns:
        The snapshot's path, or ``None`` if it could not be written.
    """
    path = snapshot_path(cache_dir, url)
    try:
        cache_subdir(cache_dir, "indexes")  # a marked cache directory, no links inside
        if stat is None:
            stat = Store.of(storage_options).source(url).info()
        ident = {
            "kind": _SNAPSHOT,
            "version": _SNAPSHOT_VERSION,
            "url": redact_url(url),
            "size": stat.size,
            "etag": stat.etag,
            "mtime": stat.mtime,
        }
        if isinstance(reader, TableIndex) and not _may_hold_credentials(reader):
            return _save_table(reader, url, cache_dir, Store.of(storage_options), ident)
        with contextlib.suppress(FileNotFoundError):  # a table of an earlier run: outdated
            os.unlink(_table_paths(cache_dir, url)[1])
        if os.path.exists(path) and _snapshot_ident(path) == ident:
            return path
        shards = list(reader.shards)
        writer = JsonIndexWriter(path, name=reader.name or None)
        try:
            for num, comp in enumerate(reader.components):
                if num > 0:
                    writer.start_component(comp.name or f"component{num}", comp.weight)
                for info in shards[comp.first_shard : comp.stop_shard]:
                    writer.add(
                        dataclasses.replace(info, url=redact_url(info.url, keep_user=True)), None
                    )
            writer.set_report(ident)
            # atomic, not flushed to disk: it is made while a dataset loads (before its first
            # batch; a flush cost tens of ms on a busy disk), and a machine crash at worst
            # loses this copy, which the next online run writes again
            writer.flush(fsync=False)
        finally:
            writer.abort()  # published above (or nothing, on an error)
        return path
    except (OSError, ValueError) as e:
        logger.warning("could not save an offline copy of index %s: %s", redact_url(url), e)
        return None


def _table_paths(cache_dir: str | os.PathLike[str], url: str) -> tuple[str, str]:
    """The copy of a remote shard table and the JSON file saying where it came from."""
    d = os.path.join(os.fspath(cache_dir), "indexes")
    return os.path.join(d, url_name(url, ".widx")), os.path.join(d, url_name(url, ".widx.json"))


def _may_hold_credentials(reader: TableIndex) -> bool:
    """Whether a stored shard URL has an ``@`` or a ``?`` (a password, a signature...)."""
    blob = reader.url_blob()
    return bool(np.any((blob == ord("@")) | (blob == ord("?"))))


def _save_table(
    reader: TableIndex,
    url: str,
    cache_dir: str | os.PathLike[str],
    store: Store,
    ident: dict[str, Any],
) -> str:
    """Copy the remote table whole (bounded work: its bytes) unless the copy is current."""
    table, about = _table_paths(cache_dir, url)
    root = reader.base if reader.base is not None else url.rpartition("/")[0]
    meta = {
        **ident,
        "kind": _TABLE_SNAPSHOT,
        "base": redact_url(root, keep_user=True),
        "url_map": [
            [redact_url(a, keep_user=True), redact_url(b, keep_user=True)]
            for a, b in reader.url_map
        ],
        "allow_local_shards": reader.allow_local_shards,
    }
    if os.path.exists(table) and _read_json(about) == meta:
        return table
    with TempFile(os.path.dirname(table), os.path.basename(table)) as tmp:
        stat = store.source(url).download(tmp.path, expected_size=ident["size"])
        if (stat.etag, stat.mtime) != (ident["etag"], ident["mtime"]):
            meta.update(etag=stat.etag, mtime=stat.mtime)  # changed since the stat: it is this
        TableIndex(tmp.path).nshards  # noqa: B018 - a copy that does not open is not kept
        tmp.publish(table)
    atomic_write_bytes(about, json.dumps(meta).encode())
    return table


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _snapshot_ident(path: str) -> dict[str, Any] | None:
    try:
        report = JsonIndex(path).report
    except (OSError, ValueError):
        return None
    return report if report.get("kind") == _SNAPSHOT else None


def open_snapshot(url: str, cache_dir: str | os.PathLike[str]) -> Any:
    """Open the offline copy of index ``url`` saved by :func:`save_snapshot`.

    Raises:
        OfflineError: There is none (the index was never opened online with this cache).
    """
    table, about = _table_paths(cache_dir, url)
    meta = _read_json(about) if os.path.exists(table) else None
    if isinstance(meta, dict) and meta.get("kind") == _TABLE_SNAPSHOT:
        return TableIndex(
            table,
            base=meta["base"],
            url_map=dict(meta["url_map"]),
            allow_local_shards=bool(meta["allow_local_shards"]),
            origin=meta["url"],
        )
    path = snapshot_path(cache_dir, url)
    if not os.path.exists(path):
        raise OfflineError(
            f"offline, and no copy of this index in {os.fspath(cache_dir)} (open it online "
            f"once with this cache_dir, or use `wids subset`)",
            shard=redact_url(url),
        )
    return JsonIndex(path)
