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
from ..storage import comparable_etag, redact_url
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
    size: int | None,
    etag: str | None,
    md5sum: str | None,
    max_bytes: int | None,
) -> None:
    """Download ``url`` with ``download(dest)``, verify it, record it and publish it as ``key``.

    Args:
        files: The cache's entries.
        key: The entry's name (:func:`~wids.cache.entries.entry_key`).
        url: The shard.
        download: Writes the whole shard to the path it is given; may return an object with an
            ``etag`` attribute (a ``FileStat``), compared with ``etag`` and recorded.
        size: Expected size, if known.
        etag: Expected etag, if known.
        md5sum: Expected hex MD5, if known.
        max_bytes: The cache's budget, if any: a larger copy is refused.

    Raises:
        IndexMismatchError: The copy's size, etag or MD5 differ from what is expected.
        CacheBudgetError: The copy is larger than the whole budget.
    """
    log.info("cache: fetching %s", redact_url(url))
    with TempFile(os.path.join(files.cache_dir, "tmp"), key) as tmp:
        result = download(tmp.path)
        got = os.stat(tmp.path).st_size
        if size is not None and got != size:
            raise IndexMismatchError(
                f"downloaded {got} bytes, the index says {size}", shard=redact_url(url)
            )
        check_fits(url, got, max_bytes)
        got_etag = getattr(result, "etag", None)
        if etag is not None and got_etag is not None:
            if comparable_etag(etag) != comparable_etag(got_etag):
                raise IndexMismatchError(
                    f"etag is {got_etag}, the index says {etag}: the shard changed",
                    shard=redact_url(url),
                )
        if md5sum is not None:
            actual = md5_file(tmp.path)
            if actual != md5sum.lower():
                raise IndexMismatchError(
                    f"md5 is {actual}, the index says {md5sum}", shard=redact_url(url)
                )
        if tmp.fd is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: tmp.fd is not set")
        os.fsync(tmp.fd)
        # The record goes first (a rename keeps the inode, size and mtime it names), so
        # every data file wids publishes is recorded: clean and eviction delete only
        # recorded entries. Neither the record nor the rename is fsynced (two fsyncs per
        # download doubled the cost of small entries): after a crash, losing either only
        # makes the entry invalid, refetched and replaced on its next open.
        rec = new_record(url, os.fstat(tmp.fd), etag if got_etag is None else got_etag, md5sum)
        files.write_record(key, rec, fsync=False)
        cachedir.check_layout(files.cache_dir, ENTRY_SUBDIRS)  # never publish through a link
        tmp.publish(files.data(key), fsync=False)


def md5_file(path: str) -> str:
    """The hex MD5 of a local file."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
