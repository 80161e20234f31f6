"""One verified download of a cache entry: into ``tmp/``, checked, recorded, then published.

The caller holds the entry's lock exclusively (:class:`~wids.cache.shards.ShardCache`) and has
made room in the budget. A copy whose size, etag or MD5 differ from what the index says is
never published; the temporary file is removed on any failure.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from typing import Any

from ..atomic import TempFile
from ..errors import IndexMismatchError
from ..index import Fingerprint
from ..storage import redact_url
from . import layout as cachedir
from .budget import check_fits
from .entries import ENTRY_SUBDIRS, EntryFiles, new_record

__all__ = ["download_entry", "md5_file"]

log = logging.getLogger(__name__)


def download_entry(
    files: EntryFiles,
    key: str,
    url: str,
    download: Callable[[str], Any],
    expected: Fingerprint,
    max_bytes: int | None,
) -> None:
    """Download ``url`` with ``download(dest)``, verify it, record it and publish it as ``key``.

    Args:
        files: The cache's entries.
        key: The entry's name (:func:`wids.storage.url_name` of the URL).
        url: The shard.
        download: Writes the whole shard to the path it is given; may return an object with an
            ``etag`` attribute (a ``FileStat``), compared with the expected etag and recorded.
        expected: What the index says the shard is (size, etag and MD5 where known).
        max_bytes: The cache's budget, if any: a larger copy is refused.

    Raises:
        IndexMismatchError: The copy's size, etag or MD5 differ from what is expected.
        CacheBudgetError: The copy is larger than the whole budget.
    """
    log.info("cache: fetching %s", redact_url(url))
    with TempFile(os.path.join(files.cache_dir, "tmp"), key) as tmp:
        result = download(tmp.path)
        got = os.stat(tmp.path).st_size
        got_etag = getattr(result, "etag", None)
        _check(url, expected, Fingerprint(got, got_etag))
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
        etag = expected.etag if got_etag is None else got_etag
        rec = new_record(url, os.fstat(tmp.fd), etag, expected.md5)
        files.write_record(key, rec, fsync=False)
        cachedir.check_layout(files.cache_dir, ENTRY_SUBDIRS)  # never publish through a link
        tmp.publish(files.data(key), fsync=False)


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
