"""Shard entries of the cache directory: their names, records and files.

An entry is ``data/<key>`` (the verified copy), ``meta/<key>.json`` (its record) and
``locks/<key>.lock`` (its flock), ``<key>`` being :func:`wids.storage.url_name` of the shard
URL; :mod:`wids.cache.layout` documents the whole directory. :class:`EntryFiles` reads,
checks, lists and removes entries; it takes no decisions about budgets
(:mod:`wids.cache.budget`), opening (:mod:`wids.cache.handle`) or fetching
(:mod:`wids.cache.shards`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Any

from ..atomic import atomic_write
from ..index import Fingerprint
from ..lock import FileLock
from ..storage import comparable_etag, file_identity, redact_url
from . import layout as cachedir

__all__ = [
    "ENTRY_SUBDIRS",
    "CacheEntry",
    "EntryFiles",
    "listdir",
    "new_record",
    "published",
    "regular_size",
    "version_mismatch",
]

log = logging.getLogger(__name__)

_FORMAT = "wids-cache-entry"
_VERSION = 1
ENTRY_SUBDIRS = ("data", "meta", "locks", "tmp")  # the entries' part of the cachedir layout


def _url_hash(url: str) -> str:
    """The full SHA-256 of ``url`` without credentials: the record's proof of identity."""
    return hashlib.sha256(file_identity(url).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached shard as its record describes it.

    Attributes:
        key: The entry's file name under ``data/``.
        url: The shard URL, credentials removed.
        path: The cached file.
        size: Size in bytes.
        etag: The storage's etag when it was fetched, if it reported one.
        mtime: The storage's modification time (``Last-Modified``) when it was fetched, if
            known: what ties a copy to its version where the storage gives no etag.
        md5sum: The verified MD5, if the index gave one.
        created: When it was fetched (POSIX time).
        last_access: When it was last opened or read (POSIX time, about a second's precision:
            readers touch the record's mtime, see :class:`~wids.cache.handle.CachedShard`).
    """

    key: str
    url: str
    path: str
    size: int
    etag: str | None
    mtime: float | None
    md5sum: str | None
    created: float
    last_access: float


class EntryFiles:
    """The entries of one cache directory: paths, records, validity, listing, removal.

    Args:
        cache_dir: The cache directory (absolute; checked and marked by the caller).
    """

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        self._readable: dict[str, tuple[int, int, int]] = {}  # key -> its record file's stat

    # -- paths ------------------------------------------------------------------------------

    def data(self, key: str) -> str:
        """The entry's data file, ``data/<key>``."""
        return os.path.join(self.cache_dir, "data", key)

    def meta(self, key: str) -> str:
        """The entry's record, ``meta/<key>.json``."""
        return os.path.join(self.cache_dir, "meta", key + ".json")

    def lockfile(self, key: str) -> str:
        """The entry's lock file, ``locks/<key>.lock``."""
        return os.path.join(self.cache_dir, "locks", key + ".lock")

    # -- records ----------------------------------------------------------------------------

    def read_record(self, key: str) -> dict[str, Any] | None:
        """The entry's record, or ``None`` if missing, unreadable or of another format."""
        try:
            with open(self.meta(key), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or rec.get("format") != _FORMAT:
            return None
        if rec.get("version") != _VERSION:
            return None
        return rec

    def write_record(self, key: str, rec: dict[str, Any], *, fsync: bool = True) -> None:
        """Write the entry's record atomically."""
        with atomic_write(self.meta(key), "w", fsync=fsync) as f:
            json.dump(rec, f, sort_keys=True)

    def check(
        self,
        key: str,
        url: str,
        st: os.stat_result,
        expected: Fingerprint,
    ) -> dict[str, Any] | None:
        """The record if the data file ``st`` is the intact copy of ``url`` that is ``expected``.

        Intact: the file's size, inode, mtime and ctime are the ones recorded when it was
        published (a write, or a ``touch`` that restores the mtime afterwards, moves the
        ctime, which no user can set back). The version: when ``expected`` names one (an etag,
        or a modification time where the storage gives no etag), the copy must positively be
        that version, by the etag or the ``Last-Modified`` recorded at its download; a copy
        that cannot be compared is not served.
        """
        rec = self.read_record(key)
        if rec is None or rec.get("url_sha256") != _url_hash(url):
            return None
        if (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) != (
            rec.get("size"),
            rec.get("file_ino"),
            rec.get("file_mtime_ns"),
            rec.get("file_ctime_ns"),
        ):
            log.info("cache entry %s changed behind the cache's back; refetching", key)
            return None
        problem = version_mismatch(rec, expected)
        if problem is not None:
            log.info("cache entry %s is not the indexed version (%s); refetching", key, problem)
            return None
        return rec

    def is_valid(self, key: str, url: str, expected: Fingerprint) -> bool:
        """Whether the entry is the intact copy of ``url`` that is ``expected`` (no lock taken)."""
        try:
            st = os.stat(self.data(key))
        except FileNotFoundError:
            return False
        return self.check(key, url, st, expected) is not None

    # -- listing ----------------------------------------------------------------------------

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        """``(key, record)`` of every readable record in ``meta/``, with or without data."""
        out = []
        for name in listdir(os.path.join(self.cache_dir, "meta")):
            if name.endswith(".json"):
                rec = self.read_record(name[: -len(".json")])
                if rec is not None:
                    out.append((name[: -len(".json")], rec))
        return out

    def entries(self) -> list[CacheEntry]:
        """The recorded entries that have their data, in the order eviction takes them.

        Least recently used first, then the copies fetched ahead of their reads (their last
        use is set in the future), the latest fetched first: its reads come last.

        Raises:
            CacheDirError: A subdirectory of the cache is a symbolic link.
        """
        cachedir.check_layout(self.cache_dir, ENTRY_SUBDIRS)
        out = []
        for key, rec in self.records():
            if regular_size(self.data(key)) is None:
                continue
            out.append(
                CacheEntry(
                    key=key,
                    url=str(rec.get("url")),
                    path=self.data(key),
                    size=int(rec["size"]),
                    etag=rec.get("etag"),
                    mtime=_float_or_none(rec.get("mtime")),
                    md5sum=rec.get("md5sum"),
                    created=float(rec.get("created", 0)),
                    last_access=max(float(rec.get("last_access", 0)), self._touched(key)),
                )
            )
        # a last use in the future is a copy fetched ahead of its reads (ShardCache): after
        # the entries used, and the one fetched last (its reads come last) first among them
        now = time.time()
        out.sort(
            key=lambda e: (
                (0, e.last_access, e.key) if e.last_access <= now else (1, -e.last_access, e.key)
            )
        )
        return out

    def _touched(self, key: str) -> float:
        try:
            return os.stat(self.meta(key)).st_mtime
        except OSError:
            return 0.0

    def sizes(self) -> dict[str, int]:
        """Sizes of the entries eviction can remove: what the budget limits.

        An entry is a data file with a readable record of this format; other files in
        ``data/`` (a damaged record, files wids did not write) are neither counted nor removed.
        """
        recorded = {n[: -len(".json")] for n in listdir(os.path.join(self.cache_dir, "meta"))}
        sizes = {}
        readable = {}
        for key in listdir(os.path.join(self.cache_dir, "data")):
            if key not in recorded:
                continue
            sig = self._record_readable(key)
            size = regular_size(self.data(key)) if sig is not None else None
            if sig is not None and size is not None:
                sizes[key] = size
                readable[key] = sig
        self._readable = readable
        return sizes

    def _record_readable(self, key: str) -> tuple[int, int, int] | None:
        """The record file's (inode, size, mtime) if it is readable, read again only if changed."""
        try:
            st = os.stat(self.meta(key))
        except OSError:
            return None
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._readable.get(key) == sig or self.read_record(key) is not None:
            return sig
        return None

    # -- removal ----------------------------------------------------------------------------

    def remove_files(self, key: str) -> None:
        """Remove an entry's data, record and abandoned downloads (exclusive lock held).

        The data goes before the record, so a data file is never left without one.
        """
        cachedir.unlink_in(self.cache_dir, "data", key)
        cachedir.unlink_in(self.cache_dir, "meta", key + ".json")
        for name in listdir(os.path.join(self.cache_dir, "tmp"), hidden=True):
            if cachedir.is_own_temp(name, (key,)):
                log.info("cache: removing abandoned download %s", name)
                cachedir.unlink_in(self.cache_dir, "tmp", name)

    def remove_if_free(self, key: str) -> bool:
        """Remove a recorded entry and its lock file if no open or fetch is under way.

        Returns:
            ``False`` if its lock is held or it is not recorded.
        """
        lock = FileLock(self.lockfile(key))
        if not lock.acquire(blocking=False):
            return False  # being opened (shared) or fetched (exclusive) somewhere
        try:
            if self.read_record(key) is None:  # not (or no longer) an entry wids recorded
                if regular_size(self.data(key)) is None:
                    lock.unlink()  # only the lock file this call may have created
                return False
            self.remove_files(key)
            lock.unlink()
            return True
        finally:
            lock.release()

    def unlink_entry(self, key: str) -> bool:
        """Evict a recorded entry even if it is open (``.evict.lock`` held; no entry lock).

        Readers keep reading their open descriptor (the data lives until they close it); an
        opener that meets the missing file or record fetches again. A download in flight is
        not touched (it is in ``tmp/`` until it publishes, under ``.evict.lock``).

        Returns:
            Whether the entry was recorded and is gone now.
        """
        if self.read_record(key) is None:
            return False
        cachedir.unlink_in(self.cache_dir, "data", key)
        cachedir.unlink_in(self.cache_dir, "meta", key + ".json")
        return True


def new_record(
    url: str,
    st: os.stat_result,
    etag: str | None,
    md5sum: str | None,
    mtime: float | None = None,
) -> dict[str, Any]:
    """The record of a download of ``url`` whose file has stat ``st``.

    ``mtime`` is the storage's modification time of the version downloaded (``Last-Modified``),
    if known. The file's ctime is recorded once the file is published (:func:`published`).
    """
    now = time.time()
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "url": redact_url(url),
        "url_sha256": _url_hash(url),
        "size": st.st_size,
        "etag": comparable_etag(etag),
        "mtime": mtime,
        "md5sum": md5sum.lower() if md5sum is not None else None,
        "file_ino": st.st_ino,
        "file_mtime_ns": st.st_mtime_ns,
        "file_ctime_ns": None,
        "created": now,
        "last_access": now,
    }


def published(rec: dict[str, Any], st: os.stat_result) -> dict[str, Any]:
    """The record once its file is published as ``st`` (the rename moved its ctime)."""
    return {**rec, "file_ctime_ns": st.st_ctime_ns}


def version_mismatch(rec: dict[str, Any], expected: Fingerprint) -> str | None:
    """What says a recorded copy is not the ``expected`` version, or ``None``."""
    have = Fingerprint(
        rec.get("size"), rec.get("etag"), _float_or_none(rec.get("mtime")), rec.get("md5sum")
    )
    if expected.md5 is not None and have.md5 is None:
        return "never checked against the index's md5"
    if expected.etag is not None and have.etag is None:
        by_md5 = expected.md5 is not None and have.md5 is not None
        by_date = expected.mtime is not None and have.mtime is not None
        if not (by_md5 or by_date):  # the answer gave no etag: its date or MD5 must tell
            return "the copy records no etag, date or MD5 to compare with the index's etag"
    if expected.etag is None and expected.mtime is not None and have.etag is None:
        if have.mtime is None:  # a server without etags: the date is the version
            return "the copy records no modification time to compare with the index's"
    return expected.mismatch(have)


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def regular_size(path: str) -> int | None:
    """The size of ``path`` if it is a regular file (links are not followed), else ``None``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def listdir(path: str, *, hidden: bool = False) -> list[str]:
    """Names in ``path`` (without dot files unless ``hidden``); none if it is missing."""
    try:
        return [n for n in os.listdir(path) if hidden or not n.startswith(".")]
    except FileNotFoundError:
        return []
