"""One shard's indexing job, runnable on any executor (a process pool, a Dask cluster).

A job carries only picklable values (the shard's URL, a :class:`~wids.storage.Store`: storage
options and retry policy) and runs wherever its executor puts it. With a sidecar target it
writes the shard's member sidecar straight to its final place (a local path or any writable
fsspec URL) and hands back only the shard's entry; without one it hands back the member
table (the SQLite writer, and a build in one machine, collect tables in the client).

A sidecar already at its target that names the same file with a fingerprint (size, etag,
mtime) and a recorded member header still matching the shard is kept, not rewritten: a build
rerun after a crash or a killed worker scans only the shards whose sidecars are missing or
stale.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass

from ..errors import ShardNotFoundError, WidsError
from ..samples import DuplicatePolicy
from ..storage import IOStats, Source, Store, is_remote, local_path, put_file, redact_url
from .contents import file_md5
from .fingerprint import Fingerprint, unchanged
from .jsonformat import MEMBERS_FORMAT, VERSION
from .jsonwriter import render_sidecar
from .members import ShardMembers
from .model import ShardInfo
from .scan import scan_shard
from .scancompressed import DEFAULT_SPACING
from .spec import read_bytes

__all__ = ["JobResult", "ShardJob", "run_job"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShardJob:
    """What to do for one shard.

    Attributes:
        url: The shard, as given to the builder.
        stored: The shard's URL as the index records it.
        sidecar: Where its member sidecar goes (path or URL), or ``None`` to return the table.
        duplicates: Policy for repeated keys or fields.
        reuse: Keep a matching sidecar already at ``sidecar`` instead of rescanning.
        md5: Record the MD5 of a local shard's bytes (read whole for it; remote shards get
            the one their store gives, GCS's ``md5Hash``, if any).
        seek_spacing: Uncompressed bytes between a ``.tar.gz`` shard's seek points.
        build: Identifies the build: Dask names a task by its arguments and takes two
            submissions of one name for the same task, so a rerun (after a crash, or of a
            changed shard) must not look like the run before.
    """

    url: str
    stored: str
    sidecar: str | None = None
    duplicates: DuplicatePolicy = "error"
    reuse: bool = True
    build: str = ""
    md5: bool = True
    seek_spacing: int = DEFAULT_SPACING


@dataclass(frozen=True, slots=True)
class JobResult:
    """What a job found.

    Attributes:
        info: The shard's index entry (``url`` as stored).
        members: Its member table; ``None`` when the sidecar was written (or kept) at its place.
        scanned: Whether the shard was scanned (false: a matching sidecar was kept).
        skipped: Regular members that belong to no sample (0 when not scanned).
        bytes_read: Bytes read from remote storage.
        requests: Requests made to remote storage.
        tar_size: A compressed shard's decompressed tar size (its seek points'), else ``None``.
    """

    info: ShardInfo
    members: ShardMembers | None
    scanned: bool
    skipped: int = 0
    bytes_read: int = 0
    requests: int = 0
    tar_size: int | None = None


def run_job(job: ShardJob, store: Store) -> JobResult:
    """Index one shard: keep its sidecar if it still matches, else scan it (and write the sidecar).

    Raises:
        WidsError: The shard is unreadable, not a tar, or breaks the duplicates policy; or the
            sidecar cannot be written (the error names the shard).
    """
    stats = IOStats()
    src = store.source(job.url)
    try:
        if job.sidecar is not None and job.reuse:
            kept = _kept(job, job.sidecar, src, store, stats)
            if kept is not None:
                return kept
        stat, members, skipped = scan_shard(
            src, duplicates=job.duplicates, stats=stats, seek_spacing=job.seek_spacing
        )
        md5 = stat.md5
        if job.md5 and src.local_path is not None:
            md5 = file_md5(src.local_path, stat)  # copies then tell from rewrites (contents.py)
    finally:
        src.close()
    info = ShardInfo(job.stored, len(members), stat.size, stat.etag, stat.mtime, md5)
    if job.sidecar is None:
        return JobResult(info, members, True, skipped, stats.bytes_read, stats.requests)
    _put(job.sidecar, render_sidecar(info, members), store)
    tar_size = None if members.seek is None else members.seek.uncompressed_size
    return JobResult(info, None, True, skipped, stats.bytes_read, stats.requests, tar_size)


def _kept(
    job: ShardJob, target: str, src: Source, store: Store, stats: IOStats
) -> JobResult | None:
    """The result of a sidecar already at ``target`` that still describes the shard, if any."""
    try:
        cols = json.loads(read_bytes(target, store))
    except ShardNotFoundError:
        return None
    except (ValueError, RecursionError, WidsError, OSError) as e:
        logger.info("rescanning %s: its sidecar is unreadable (%s)", redact_url(job.url), e)
        return None
    if not (
        isinstance(cols, dict)
        and cols.get("format") == MEMBERS_FORMAT
        and cols.get("version") == VERSION
        and cols.get("url") == job.stored
    ):
        return None
    try:
        members = ShardMembers.from_columns(cols)
        md5 = cols.get("md5sum")
        info = ShardInfo(
            url=job.stored,
            nsamples=len(members),
            size=cols.get("size"),
            etag=cols.get("etag"),
            mtime=cols.get("mtime"),
            md5sum=md5 if isinstance(md5, str) else None,
        )
        if cols.get("nsamples") != len(members):
            return None
        if job.md5 and info.md5sum is None and src.local_path is not None:
            return None  # scanned again, for its md5
        recorded = Fingerprint(info.size, info.etag, info.mtime)
        if not unchanged(recorded, members, src.info(stats), src.read_range):
            return None
    except (ValueError, TypeError, WidsError) as e:
        logger.info("rescanning %s: its sidecar does not match (%s)", redact_url(job.url), e)
        return None
    # The entry repeats what the kept sidecar says: the reader compares the two exactly.
    return JobResult(info, None, False, 0, stats.bytes_read, stats.requests)


def _put(target: str, data: bytes, store: Store) -> None:
    """Publish one sidecar at its final place, atomically."""
    from ..atomic import atomic_write_bytes

    if not is_remote(target):
        path = local_path(target)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if _holds(path, data):
            # A rebuild that finds the same table: replacing a file by an equal one costs more
            # than the scan (ext4 flushes the new file's blocks on a rename over an old one).
            return
        # No fsync (as the writer): a sidecar lost in a crash fails its checks, then is rescanned.
        atomic_write_bytes(path, data, fsync=False)
        return
    with tempfile.TemporaryDirectory(prefix="wids-sidecar-") as tmp:
        path = os.path.join(tmp, "sidecar.json")
        with open(path, "wb") as f:
            f.write(data)
        put_file(path, target, store)


def _holds(path: str, data: bytes) -> bool:
    """Whether the local file at ``path`` holds exactly ``data``."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != len(data):
                return False
            return f.read() == data
    except OSError:
        return False
