"""One verified download of a cache entry: into ``tmp/``, checked, recorded, then published.

The caller holds the entry's lock exclusively (:class:`~wids.cache.shards.ShardCache`); room
in the budget is made here (:mod:`wids.cache.budget`). A copy whose size, etag or MD5 differ
from what the index says is never published; the temporary file is removed on any failure.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..atomic import TempFile
from ..errors import CorruptReadError, IndexMismatchError, ShortReadError
from ..index import Fingerprint
from ..storage import redact_url
from . import budget
from . import layout as cachedir
from .budget import check_fits
from .entries import ENTRY_SUBDIRS, EntryFiles, new_record, published, version_mismatch

if TYPE_CHECKING:
    from ..storage import FileStat, IOStats, Source

__all__ = ["download_entry", "fetch_checked", "md5_file"]

log = logging.getLogger(__name__)


def download_entry(
    files: EntryFiles,
    key: str,
    url: str,
    download: Callable[[str], Any],
    expected: Fingerprint,
    max_bytes: int | None,
    *,
    keep: bool = False,
    lock_timeout: float = 600.0,
) -> tuple[int, int]:
    """Download ``url`` with ``download(dest)``, verify it, record it and publish it as ``key``.

    With a budget, room is made and the download announced before it starts, and the copy is
    published under the budget's lock (:mod:`wids.cache.budget`).

    Args:
        files: The cache's entries.
        key: The entry's name (:func:`wids.storage.url_name` of the URL).
        url: The shard.
        download: Writes the whole shard to the path it is given; may return a ``FileStat``
            (its ``etag`` is compared with the expected one and recorded, its ``mtime`` is
            recorded: the version's ``Last-Modified``).
        expected: What the index says the shard is (size, etag and MD5 where known).
        max_bytes: The cache's budget, if any: a larger copy is refused.
        keep: Never evict (a full budget raises).
        lock_timeout: Seconds to wait for the budget's lock.

    Returns:
        A read-only descriptor of the published file (opened before it was published) and
        its size.

    Raises:
        IndexMismatchError: The copy's size, etag or MD5 differ from what is expected.
        CacheBudgetError: The copy is larger than the whole budget (or, with ``keep``, does
            not fit).
    """
    log.info("cache: fetching %s", redact_url(url))
    announced = False
    try:
        if max_bytes is not None and expected.size is not None:
            with budget.room_locked(files, lock_timeout):
                budget.remove_stale_downloads(files)
                budget.make_room(files, expected.size, url, max_bytes, keep, own=key)
                budget.announce(files, key, expected.size)
                announced = True
        with TempFile(os.path.join(files.cache_dir, "tmp"), key) as tmp:
            result = download(tmp.path)
            got = os.stat(tmp.path).st_size
            got_etag = getattr(result, "etag", None)
            mtime = getattr(result, "mtime", None)
            _check(url, expected, Fingerprint(got, got_etag, mtime))
            check_fits(url, got, max_bytes)
            if expected.md5 is not None:
                _check(url, expected, Fingerprint(md5=md5_file(tmp.path)))
            if tmp.fd is None:  # an invariant, kept under python -O
                raise RuntimeError("internal error: tmp.fd is not set")
            os.fsync(tmp.fd)
            # The record goes first (a rename keeps the inode, size and mtime it names), so
            # every data file wids publishes is recorded: clean and eviction delete only
            # recorded entries. Neither the record nor the rename is fsynced (two fsyncs per
            # download doubled the cost of small entries): after a crash, losing either only
            # makes the entry invalid, refetched and replaced on its next open.
            # Only the etag the answer gave is recorded: an answer without one (a proxy that
            # drops it, a server ignoring If-Match) is the indexed version only if its
            # Last-Modified or MD5 says so.
            rec = new_record(url, os.fstat(tmp.fd), got_etag, expected.md5, mtime)
            problem = version_mismatch(rec, expected)
            if problem is not None:
                raise IndexMismatchError(
                    f"the download is not known to be the indexed shard: {problem}",
                    shard=redact_url(url),
                )
            fd = os.open(tmp.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if max_bytes is None:
                    _publish(files, key, tmp, rec)
                else:
                    with budget.room_locked(files, lock_timeout):
                        budget.make_room(files, got, url, max_bytes, keep, own=key)
                        _publish(files, key, tmp, rec)
            except BaseException:
                os.close(fd)
                raise
            return fd, got
    finally:
        if announced:
            budget.announce(files, key, None)


def fetch_checked(
    source: Source,
    dest: str,
    stats: IOStats | None,
    size: int | None,
    verify: Callable[[str], None] | None,
) -> FileStat:
    """``source.download(dest)``, then ``verify(dest)``; a copy that fails is fetched again.

    A wrong answer on the way (``CorruptReadError``, ``ShortReadError``) is retried within
    the store's retry policy, as a range read that fails its check is read again.
    """
    attempts = source.attempts(
        "could not download a copy that passes its checks", stats, count_requests=False
    )
    while True:
        attempts.begin()
        try:
            stat = source.download(dest, stats=stats, expected_size=size)
            if verify is not None:
                verify(dest)
            return stat
        except (CorruptReadError, ShortReadError) as e:
            time.sleep(attempts.failed(e))


def _publish(files: EntryFiles, key: str, tmp: TempFile, rec: dict[str, Any]) -> None:
    files.write_record(key, rec, fsync=False)
    cachedir.check_layout(files.cache_dir, ENTRY_SUBDIRS)  # never publish through a link
    tmp.publish(files.data(key), fsync=False)
    # the rename moved the file's ctime: recorded now, it catches any later write or touch
    files.write_record(key, published(rec, os.stat(files.data(key))), fsync=False)


def _check(url: str, expected: Fingerprint, got: Fingerprint) -> None:
    problem = expected.mismatch(got)
    if problem is not None:
        raise IndexMismatchError(
            f"the download is not the indexed shard: {problem}", shard=redact_url(url)
        )


def md5_file(path: str) -> str:
    """The hex MD5 of a local file."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
