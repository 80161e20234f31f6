"""Offline index snapshots: a remote index's shard list kept in the cache directory.

:func:`save_snapshot` / :func:`open_snapshot` keep a copy of a remote index's shard list
(absolute URLs without credentials, sizes, etags, components; no member tables) in the cache
directory (``indexes/``, see :mod:`wids.cache.layout`), so that ``offline=True`` works with the
remote index's URL: shards come from the shard cache and their member tables from scanning the
cached copies.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..errors import OfflineError
from ..index import IndexReader, JsonIndex, JsonIndexWriter
from ..storage import Store, redact_url, url_name
from .layout import cache_subdir

__all__ = ["open_snapshot", "save_snapshot", "snapshot_path"]

logger = logging.getLogger(__name__)

_SNAPSHOT = "wids-index-snapshot"
_SNAPSHOT_VERSION = 2  # 2: no credentials in any URL


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
) -> str | None:
    """Keep a copy of the open index ``reader`` (read from ``url``) for offline use.

    The copy holds no secrets: its URLs (the index's and every shard's) are stored without
    ``user:password@`` and without signature or token query parameters (see
    :func:`wids.storage.redact.redact_url`). Offline, a shard is found in the shard cache under the
    same credential-free URL (:func:`wids.storage.url_name` ignores credentials).

    Rewritten only when the remote index changed (its size/etag/mtime, one stat). Failures
    are logged, not raised: the snapshot is a convenience for later offline runs.

    Returns:
        The snapshot's path, or ``None`` if it could not be written.
    """
    path = snapshot_path(cache_dir, url)
    try:
        cache_subdir(cache_dir, "indexes")  # a marked cache directory, no links inside
        stat = Store.of(storage_options).source(url).info()
        ident = {
            "kind": _SNAPSHOT,
            "version": _SNAPSHOT_VERSION,
            "url": redact_url(url),
            "size": stat.size,
            "etag": stat.etag,
            "mtime": stat.mtime,
        }
        if os.path.exists(path) and _snapshot_ident(path) == ident:
            return path
        shards = list(reader.shards)
        with JsonIndexWriter(path, name=reader.name or None) as writer:
            for num, comp in enumerate(reader.components):
                if num > 0:
                    writer.start_component(comp.name or f"component{num}", comp.weight)
                for info in shards[comp.first_shard : comp.stop_shard]:
                    writer.add(dataclasses.replace(info, url=redact_url(info.url)), None)
            writer.set_report(ident)
        return path
    except (OSError, ValueError) as e:
        logger.warning("could not save an offline copy of index %s: %s", redact_url(url), e)
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
    path = snapshot_path(cache_dir, url)
    if not os.path.exists(path):
        raise OfflineError(
            f"offline, and no copy of this index in {os.fspath(cache_dir)} (open it online "
            f"once with this cache_dir, or use `wids subset`)",
            shard=redact_url(url),
        )
    return JsonIndex(path)
