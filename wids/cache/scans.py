"""The scan-once member-table cache: shards whose index has no offsets, scanned once per machine.

The first process to ask scans the shard (``wids.index.scan_shard``) and saves its member table
under ``cache_dir/scans/`` (see :mod:`wids.cache.layout`); other processes and DataLoader workers
wait on a file lock and load it. A saved table is used only while the shard's size and
etag/mtime still match.
"""

from __future__ import annotations

import json
import logging
import os

from ..errors import IndexFormatError
from ..index import Fingerprint, ShardInfo, ShardMembers, scan_shard
from ..samples import DuplicatePolicy
from ..storage import FileStat, IOStats, Source, redact_url, url_name

__all__ = ["scan_cached"]

logger = logging.getLogger(__name__)


def _scan_path(cache_dir: str, url: str) -> str:
    return os.path.join(cache_dir, "scans", url_name(url, ".json"))


def scan_cached(
    source: Source,
    *,
    cache_dir: str,
    expected: ShardInfo | None = None,
    duplicates: DuplicatePolicy = "error",
    stats: IOStats | None = None,
    lock_timeout: float = 600.0,
) -> ShardMembers:
    """Member table of a shard whose index has no offsets, scanned once per machine.

    The first process to ask scans the shard and saves the table under
    ``cache_dir/scans/``; other processes and workers wait on a file lock and load it. A saved
    table is used only while the shard's size and etag/mtime still match.

    Args:
        source: The shard.
        cache_dir: Root of the local cache.
        expected: What the index says of the shard; its ``size`` (when known) must match.
        duplicates: Policy for repeated keys or fields.
        stats: I/O counters.
        lock_timeout: Seconds to wait for another process's scan.

    Returns:
        The shard's member table.

    Raises:
        IndexMismatchError: The shard's size differs from ``expected``.
        CacheDirError: ``cache_dir`` is not one wids may use (see :mod:`wids.cache.layout`).
    """
    from ..atomic import atomic_write_bytes
    from ..errors import IndexMismatchError
    from ..lock import FileLock
    from .layout import cache_subdir

    cache_subdir(cache_dir, "scans")  # a marked cache directory, no links inside
    path = _scan_path(cache_dir, source.url)
    stat = source.info(stats)
    problem = None if expected is None else expected.fingerprint.mismatch(stat)
    if problem is not None:
        raise IndexMismatchError(
            f"not the shard the index describes: {problem}", shard=redact_url(source.url)
        )
    cached = _load_scan(path, stat)
    if cached is not None:
        return cached
    with FileLock(path + ".lock", timeout=lock_timeout):
        cached = _load_scan(path, stat)
        if cached is not None:
            return cached
        stat, members, _ = scan_shard(source, duplicates=duplicates, stats=stats)
        record = {
            "format": "wids-scan",
            "version": 1,
            "url": redact_url(source.url),  # no credentials on disk
            "size": stat.size,
            "etag": stat.etag,
            "mtime": stat.mtime,
            "members": members.to_columns(),
        }
        atomic_write_bytes(path, json.dumps(record, separators=(",", ":")).encode())
    return members


def _load_scan(path: str, stat: FileStat) -> ShardMembers | None:
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("ignoring unreadable scan record %s: %s", path, e)
        return None
    if not (
        isinstance(record, dict)
        and record.get("format") == "wids-scan"
        and record.get("version") == 1
    ):
        return None
    try:
        scanned = Fingerprint(record["size"], record.get("etag"), record.get("mtime"))
        if scanned.mismatch(stat, strict=True) is not None:
            return None
        return ShardMembers.from_columns(record["members"])
    except (IndexFormatError, KeyError, TypeError, ValueError) as e:
        logger.warning("ignoring malformed scan record %s: %s", path, e)
        return None
