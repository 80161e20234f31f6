"""The local shard cache: collision-free names, fetch-once across processes, byte-budget LRU.

API (what ``ShardListDataset`` and the ``wids cache`` command use)::

    cache = ShardCache(cache_dir, max_bytes=None, keep=False, lock_timeout=600.0, offline=False)
    with cache.open(source, size=..., etag=..., md5sum=..., stats=...) as shard:
        shard.path, shard.size, shard.read_range(start, end)     # os.pread on the cached file
    cache.open_with(url, download, size=..., etag=..., md5sum=...)  # core: download(dest) -> any
    cache.open_cached(url, ...) -> CachedShard | None             # only if cached now
    cache.prefetch(source, ...) -> Future                         # background fetch
    Promoter(cache, share).requested(source, nbytes, ...); .open_if_ready(url)  # wids.cache.promote
    cache.contains(url); cache.entries(); cache.total_bytes()
    cache.evict_to(max_bytes); cache.clean(older_than=None, max_bytes=None); cache.remove(url)

Layout of ``cache_dir`` (created and marked on first use, see :mod:`wids.cache.layout`)::

    wids-cache.json                  the mark: this directory is a wids cache, layout version 1
    CACHEDIR.TAG                     backup tools skip the directory
    data/<key>                       a complete, verified shard
    meta/<key>.json                  its record: url (redacted), size, etag, md5, last access
    locks/<key>.lock                 the entry's flock (shared: open; exclusive: writing)
    tmp/.<key>.<random>.tmp          downloads in progress (or left by a killed process)
    .evict.lock                      serialises eviction
    indexes/<key>.json               offline copies of remote indexes (``wids.cache.snapshots``)
    scans/                           member tables of scanned shards (``wids.cache.scans``)

``<key>`` is 24 hex digits of the SHA-256 of the full URL plus the URL's basename reduced to
``[A-Za-z0-9._-]``: two ``train-000000.tar`` from different buckets never alias, and no URL
can name a path outside ``cache_dir``. The record also keeps the full hash, so the key alone
never decides identity.

Ownership: wids refuses a non-empty directory it did not mark and layout subdirectories that
are symbolic links (:mod:`wids.cache.layout`). Clean and eviction delete only entries that have a
record in ``meta/``, and a download's record is written before its data is published, so every
data file wids makes is recorded; files of anyone else in ``data/`` are neither counted against
the budget nor deleted, and only temporary files of wids' own naming are removed.

Protocol: an open takes the entry's lock shared and checks the entry (record present, data
file's size, inode and mtime as recorded, and the caller's size/etag/md5 when given). If the
check fails it upgrades to exclusive (waiting a quarter second at a time, then checking again:
a copy another process fetched meanwhile may be held shared by its readers indefinitely),
checks again, removes temporary files left by killed downloads of this entry, downloads into
``tmp/``, verifies size, etag and md5, publishes with ``os.replace`` and writes the record.
The returned :class:`CachedShard` keeps the shared lock until closed, so eviction, which
takes entries only with a non-blocking exclusive lock, never removes an entry being read.
Eviction is least-recently-used by the record's ``last_access``. While more shards are open
than the budget holds, the cache exceeds it; the budget is restored as they are closed, when a
process exits with shards still open (a finalizer), and, for processes that ended without
running it (killed, or a DataLoader worker's ``os._exit``), by the next process that uses the
cache with a budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..atomic import TempFile, atomic_write
from ..errors import (
    CacheBudgetError,
    CacheError,
    IndexMismatchError,
    LockTimeoutError,
    OfflineError,
    ShardNotFoundError,
)
from ..lock import FileLock
from ..storage import comparable_etag, redact_url
from . import layout as cachedir
from .promote import Promoter

if TYPE_CHECKING:
    from ..storage import IOStats, Source

__all__ = ["CacheEntry", "CachedShard", "Promoter", "ShardCache", "entry_key"]

log = logging.getLogger(__name__)

_FORMAT = "wids-cache-entry"
_VERSION = 1
_MAX_ATTEMPTS = 5  # fetches of one entry in one open before giving up (eviction thrash)
_UPGRADE_SLICE = 0.25  # seconds of waiting for an exclusive lock before looking again
_TOUCH_EVERY = 1.0  # seconds; coarser last-access updates save a metadata write per open
_SUBDIRS = ("data", "meta", "locks", "tmp")  # this module's part of the cachedir layout


def entry_key(url: str) -> str:
    """The file name of ``url``'s entry: a hash of the URL plus a readable basename.

    Credentials are not part of a shard's identity: the hash is of the URL without
    ``user:password@`` and signature/token query parameters (:func:`redact_url`), so a
    re-signed presigned URL names the same entry, and so does the credential-free URL an
    offline index snapshot stores.
    """
    digest = _url_hash(url)
    base = re.split(r"[?#]", redact_url(url), maxsplit=1)[0].rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base)[-80:].lstrip(".")
    return f"{digest[:24]}-{base or 'shard'}"


def _url_hash(url: str) -> str:
    return hashlib.sha256(redact_url(url).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached shard as its record describes it.

    Attributes:
        key: The entry's file name under ``data/``.
        url: The shard URL, credentials removed.
        path: The cached file.
        size: Size in bytes.
        etag: The storage's etag when it was fetched, if it reported one.
        md5sum: The verified MD5, if the index gave one.
        created: When it was fetched (POSIX time).
        last_access: When it was last opened (POSIX time, about a second's precision).
    """

    key: str
    url: str
    path: str
    size: int
    etag: str | None
    md5sum: str | None
    created: float
    last_access: float


class CachedShard:
    """An open cached (or local) shard; holds the entry's shared lock until :meth:`close`.

    Reads go to the file descriptor opened when the entry was verified, so what is read is
    the verified file. Not picklable: reopen through the cache in each process.
    """

    def __init__(self, url: str, path: str, fd: int, size: int, lock: FileLock | None) -> None:
        self.url = url
        self.path = path
        self.size = size
        self._fd: int | None = fd
        self._lock = lock
        self._pid = os.getpid()
        self._on_close: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"CachedShard({redact_url(self.url)!r}, {self.path!r})"

    def __reduce__(self) -> Any:
        raise TypeError("CachedShard holds a file lock and cannot be pickled; reopen it")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._fd is None

    def read_range(self, start: int, end: int) -> bytes:
        """Return bytes ``start`` to ``end`` (exclusive) of the shard, exactly.

        Raises:
            ValueError: The range is not inside the shard.
            CacheError: The file is shorter than recorded (changed while open) or closed.
        """
        if not 0 <= start <= end <= self.size:
            raise ValueError(f"range {start}:{end} is not inside 0:{self.size}")
        fd = self._fd
        if fd is None:
            raise CacheError("read from a closed cached shard", shard=redact_url(self.url))
        parts, pos = [], start
        while pos < end:
            chunk = os.pread(fd, end - pos, pos)
            if not chunk:
                raise CacheError(
                    f"cached file {self.path} ends at {pos}, expected {self.size} bytes",
                    shard=redact_url(self.url),
                )
            parts.append(chunk)
            pos += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Close the file and release the entry (it becomes evictable)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        os.close(fd)
        if self._lock is not None and self._pid == os.getpid():
            self._lock.release()
            if self._on_close is not None:
                self._on_close()

    def _release_at_exit(self) -> None:
        """Release the entry's lock (it becomes evictable) but keep reading the open file."""
        lock, self._lock, self._on_close = self._lock, None, None
        if lock is not None and self._pid == os.getpid():
            lock.release()

    def __enter__(self) -> CachedShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._fd is not None and self._pid == os.getpid():
                self.close()


class ShardCache:
    """A directory of verified shard copies shared by all processes that use it.

    Args:
        cache_dir: The cache directory, created and marked on first use; an existing one
            must be empty or a wids cache (see :mod:`wids.cache.layout`). Give every user their
            own; a world-writable shared root is not safe.
        max_bytes: Byte budget; least-recently-used entries not open anywhere are evicted to
            keep within it. ``None``: no budget.
        keep: Never evict automatically (a full budget then raises :class:`CacheBudgetError`);
            :meth:`clean` and :meth:`evict_to` still remove entries when asked.
        lock_timeout: Seconds to wait for an entry another process is fetching or writing.
        offline: Serve only what is cached (or local); never download.

    Raises:
        ValueError: A negative ``max_bytes`` or ``lock_timeout``.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        keep: bool = False,
        lock_timeout: float = 600.0,
        offline: bool = False,
    ) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes!r}")
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must be >= 0, got {lock_timeout!r}")
        self.cache_dir = os.path.abspath(os.fspath(cache_dir))
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self.keep = bool(keep)
        self.lock_timeout = float(lock_timeout)
        self.offline = bool(offline)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future[None]] = {}
        self._mutex = threading.Lock()
        self._ready = False  # the directory was checked (and marked) by this object
        self._open_shards: weakref.WeakSet[CachedShard] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"ShardCache({self.cache_dir!r}, max_bytes={self.max_bytes!r}, keep={self.keep!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("cache_dir", "max_bytes", "keep", "lock_timeout", "offline")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("cache_dir"), **state)  # type: ignore[misc]

    # -- paths ------------------------------------------------------------------------------

    def _data(self, key: str) -> str:
        return os.path.join(self.cache_dir, "data", key)

    def _meta(self, key: str) -> str:
        return os.path.join(self.cache_dir, "meta", key + ".json")

    def _lockfile(self, key: str) -> str:
        return os.path.join(self.cache_dir, "locks", key + ".lock")

    def _prepare(self, *, create: bool = True) -> bool:
        """Check (and if new, mark) the directory, once per object; ``False`` if it is missing.

        With a budget, the first use also evicts down to it: processes that ended without
        closing their shards (killed, ``os._exit``) may have left the cache over budget.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        if self._ready:
            return True
        if cachedir.open_cache_dir(self.cache_dir, *_SUBDIRS, create=create) is None:
            return False
        with self._mutex:
            first, self._ready = not self._ready, True
        if first and self.max_bytes is not None and not self.keep:
            weakref.finalize(
                self, _restore_budget, self._open_shards, self.cache_dir, self.max_bytes
            )
            self._evict_quietly()
        return True

    # -- opening ----------------------------------------------------------------------------

    def open(
        self,
        source: Source,
        *,
        size: int | None = None,
        etag: str | None = None,
        md5sum: str | None = None,
        stats: IOStats | None = None,
        verify: Callable[[str], None] | None = None,
    ) -> CachedShard:
        """Open ``source`` from the cache, fetching it first (once, across processes) if needed.

        Local files are opened in place, never copied or locked.

        Args:
            source: The shard.
            size: Expected size (from the index); checked, and used for the budget up front.
            etag: Expected etag; a cached copy with another etag is fetched again.
            md5sum: Expected hex MD5, verified after download.
            stats: I/O counters for the download.
            verify: Called with the downloaded file's path before it is published; raises if
                the copy is wrong (e.g. ``wids.dataset.readers.download_check``: member
                headers), and
                then nothing is cached.

        Returns:
            The open shard; close it (or use ``with``) to let it be evicted.

        Raises:
            CacheBudgetError: The shard is larger than the whole budget.
            OfflineError: Offline, and the shard is not cached.
            IndexMismatchError: The downloaded shard differs from what the index says.
            LockTimeoutError: Another process held the entry longer than ``lock_timeout``.
            ShardNotFoundError: A local shard does not exist.
            CacheDirError: ``cache_dir`` is not one wids may use (not empty and not a wids
                cache, or a subdirectory is a symbolic link).
        """
        if source.is_local:
            return _open_local(source.url, source.local_path or source.url)
        if size is None and self.max_bytes is not None and not self.offline:
            size = source.info(stats).size

        def download(dest: str) -> Any:
            stat = source.download(dest, stats=stats, expected_size=size)
            if verify is not None:
                verify(dest)
            return stat

        return self.open_with(source.url, download, size=size, etag=etag, md5sum=md5sum)

    def open_with(
        self,
        url: str,
        download: Callable[[str], Any],
        *,
        size: int | None = None,
        etag: str | None = None,
        md5sum: str | None = None,
    ) -> CachedShard:
        """The core of :meth:`open`: ``download(dest_path)`` writes the whole shard to a path.

        ``download`` may return an object with an ``etag`` attribute (a ``FileStat``), which
        is then compared with ``etag`` and recorded.
        """
        self._prepare()
        if size is not None:
            self._check_fits(url, size)
        key = entry_key(url)
        deadline = time.monotonic() + self.lock_timeout
        lock = FileLock(self._lockfile(key), shared=True)
        fetches = 0
        while True:
            self._lock(lock, url, deadline)
            try:
                shard = self._open_valid(key, url, size, etag, md5sum, lock)
                if shard is not None:
                    return shard
                if self.offline:
                    raise OfflineError(
                        f"offline, and not in the cache {self.cache_dir}", shard=redact_url(url)
                    )
                if fetches >= _MAX_ATTEMPTS:
                    raise CacheError(
                        f"entry was evicted {fetches} times while being opened; the budget "
                        f"max_bytes={self.max_bytes} is too small for the shards open at once",
                        shard=redact_url(url),
                    )
            except BaseException:
                lock.release()
                raise
            # Become the fetcher, but wait for the exclusive lock only briefly at a time: if
            # another process fetched the entry meanwhile, its readers may hold it shared for
            # as long as they like (idle DataLoader workers do), so look again instead.
            if not self._try_upgrade(lock, url, deadline):
                continue
            try:
                if not self._is_valid(key, url, size, etag, md5sum):
                    fetches += 1
                    self._fetch(key, url, download, size, etag, md5sum)
                lock.downgrade(timeout=self.lock_timeout)  # the fetch may have used the deadline
                shard = self._open_valid(key, url, size, etag, md5sum, lock)
            except BaseException:
                if lock.locked:
                    lock.release()
                raise
            if shard is not None:
                return shard
            lock.release()  # evicted or changed while the lock changed mode: look again

    def _try_upgrade(self, lock: FileLock, url: str, deadline: float) -> bool:
        """Upgrade for at most :data:`_UPGRADE_SLICE` s; ``False`` (lock dropped) if not."""
        left = deadline - time.monotonic()
        try:
            lock.upgrade(timeout=max(0.0, min(_UPGRADE_SLICE, left)))
            return True
        except LockTimeoutError as e:
            if left > _UPGRADE_SLICE:
                return False
            raise LockTimeoutError(
                f"cache entry busy for {self.lock_timeout:g} s; lock file {lock.path}",
                shard=redact_url(url),
            ) from e

    def open_cached(
        self,
        url: str,
        *,
        size: int | None = None,
        etag: str | None = None,
        md5sum: str | None = None,
    ) -> CachedShard | None:
        """Open ``url``'s entry if an intact copy is cached now; never downloads or waits long.

        Returns:
            The open shard, or ``None`` if it is not cached (or another process is writing it).
        """
        key = entry_key(url)
        if not os.path.exists(self._data(key)) or not self._prepare(create=False):
            return None
        lock = FileLock(self._lockfile(key), shared=True)
        if not lock.acquire(blocking=False):
            return None
        try:
            shard = self._open_valid(key, url, size, etag, md5sum, lock)
        except BaseException:
            lock.release()
            raise
        if shard is None:
            lock.release()
        return shard

    def _lock(self, lock: FileLock, url: str, deadline: float) -> None:
        try:
            lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        except LockTimeoutError as e:
            raise LockTimeoutError(
                f"cache entry busy for {self.lock_timeout:g} s (another process fetching it?); "
                f"lock file {lock.path}",
                shard=redact_url(url),
            ) from e

    def _check_fits(self, url: str, size: int) -> None:
        if self.max_bytes is not None and size > self.max_bytes:
            raise CacheBudgetError(
                f"shard is {size} bytes, larger than the cache budget of {self.max_bytes} bytes",
                shard=redact_url(url),
            )

    def _read_record(self, key: str) -> dict[str, Any] | None:
        try:
            with open(self._meta(key), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or rec.get("format") != _FORMAT:
            return None
        if rec.get("version") != _VERSION:
            return None
        return rec

    def _check(
        self,
        key: str,
        url: str,
        st: os.stat_result,
        size: int | None,
        etag: str | None,
        md5sum: str | None,
    ) -> dict[str, Any] | None:
        """The record if the data file ``st`` is the intact, expected copy of ``url``."""
        rec = self._read_record(key)
        if rec is None or rec.get("url_sha256") != _url_hash(url):
            return None
        if (st.st_size, st.st_ino, st.st_mtime_ns) != (
            rec.get("size"),
            rec.get("file_ino"),
            rec.get("file_mtime_ns"),
        ):
            log.info("cache entry %s changed behind the cache's back; refetching", key)
            return None
        if size is not None and size != st.st_size:
            return None
        if etag is not None and rec.get("etag") is not None:
            if comparable_etag(etag) != comparable_etag(rec["etag"]):
                return None
        if md5sum is not None and rec.get("md5sum") != md5sum.lower():
            return None
        return rec

    def _is_valid(self, key: str, url: str, *expected: Any) -> bool:
        try:
            st = os.stat(self._data(key))
        except FileNotFoundError:
            return False
        return self._check(key, url, st, *expected) is not None

    def _open_valid(
        self,
        key: str,
        url: str,
        size: int | None,
        etag: str | None,
        md5sum: str | None,
        lock: FileLock,
    ) -> CachedShard | None:
        """With ``lock`` held shared: an open shard if the entry is valid, else ``None``."""
        path = self._data(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        rec = self._check(key, url, os.fstat(fd), size, etag, md5sum)
        if rec is None:
            os.close(fd)
            return None
        self._touch(key, rec)
        shard = CachedShard(url, path, fd, rec["size"], lock)
        if self.max_bytes is not None and not self.keep:
            shard._on_close = self._evict_quietly
            with self._mutex:
                self._open_shards.add(shard)
        return shard

    def _touch(self, key: str, rec: dict[str, Any]) -> None:
        now = time.time()
        if now - float(rec.get("last_access", 0)) >= _TOUCH_EVERY:
            rec["last_access"] = now
            with contextlib.suppress(OSError):
                self._write_record(key, rec, fsync=False)

    def _write_record(self, key: str, rec: dict[str, Any], *, fsync: bool = True) -> None:
        with atomic_write(self._meta(key), "w", fsync=fsync) as f:
            json.dump(rec, f, sort_keys=True)

    # -- fetching (entry lock held exclusively) ---------------------------------------------

    def _fetch(
        self,
        key: str,
        url: str,
        download: Callable[[str], Any],
        size: int | None,
        etag: str | None,
        md5sum: str | None,
    ) -> None:
        self._remove_entry_files(key)
        self._make_room(size or 0, url)
        log.info("cache: fetching %s", redact_url(url))
        with TempFile(os.path.join(self.cache_dir, "tmp"), key) as tmp:
            result = download(tmp.path)
            got = os.stat(tmp.path).st_size
            if size is not None and got != size:
                raise IndexMismatchError(
                    f"downloaded {got} bytes, the index says {size}", shard=redact_url(url)
                )
            self._check_fits(url, got)
            got_etag = getattr(result, "etag", None)
            if etag is not None and got_etag is not None:
                if comparable_etag(etag) != comparable_etag(got_etag):
                    raise IndexMismatchError(
                        f"etag is {got_etag}, the index says {etag}: the shard changed",
                        shard=redact_url(url),
                    )
            if md5sum is not None:
                actual = _md5_file(tmp.path)
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
            rec = _new_record(url, os.fstat(tmp.fd), etag if got_etag is None else got_etag, md5sum)
            self._write_record(key, rec, fsync=False)
            cachedir.check_layout(self.cache_dir, _SUBDIRS)  # never publish through a link
            tmp.publish(self._data(key), fsync=False)
        if self.max_bytes is not None and not self.keep:
            self._evict_quietly()

    def _remove_entry_files(self, key: str) -> None:
        """Remove an entry's data, record and abandoned downloads (exclusive lock held).

        The data goes before the record, so a data file is never left without one.
        """
        cachedir.unlink_in(self.cache_dir, "data", key)
        cachedir.unlink_in(self.cache_dir, "meta", key + ".json")
        for name in _listdir(os.path.join(self.cache_dir, "tmp"), hidden=True):
            if cachedir.is_own_temp(name, (key,)):
                log.info("cache: removing abandoned download %s", name)
                cachedir.unlink_in(self.cache_dir, "tmp", name)

    def _make_room(self, size: int, url: str) -> None:
        if self.max_bytes is None:
            return
        if self.keep:
            total = self.total_bytes()
            if total + size > self.max_bytes:
                raise CacheBudgetError(
                    f"cache holds {total} bytes, adding {size} exceeds the budget of "
                    f"{self.max_bytes} bytes and keep=True forbids eviction",
                    shard=redact_url(url),
                )
            return
        self.evict_to(self.max_bytes - size)

    def _evict_quietly(self) -> None:
        if self.max_bytes is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: self.max_bytes is not set")
        try:
            self.evict_to(self.max_bytes)
        except (OSError, LockTimeoutError) as e:  # a failed eviction must not fail a read
            log.warning("cache eviction in %s failed: %s", self.cache_dir, e)

    # -- listing and eviction ---------------------------------------------------------------

    def contains(self, url: str) -> bool:
        """Whether an intact copy of ``url`` is cached (no lock taken: a hint)."""
        return self._is_valid(entry_key(url), url, None, None, None)

    def _records(self) -> list[tuple[str, dict[str, Any]]]:
        """``(key, record)`` of every readable record in ``meta/``, with or without data."""
        out = []
        for name in _listdir(os.path.join(self.cache_dir, "meta")):
            if name.endswith(".json"):
                rec = self._read_record(name[: -len(".json")])
                if rec is not None:
                    out.append((name[: -len(".json")], rec))
        return out

    def entries(self) -> list[CacheEntry]:
        """The recorded entries that have their data, least recently used first.

        Raises:
            CacheDirError: A subdirectory of the cache is a symbolic link.
        """
        cachedir.check_layout(self.cache_dir, _SUBDIRS)
        out = []
        for key, rec in self._records():
            if _regular_size(self._data(key)) is None:
                continue
            out.append(
                CacheEntry(
                    key=key,
                    url=str(rec.get("url")),
                    path=self._data(key),
                    size=int(rec["size"]),
                    etag=rec.get("etag"),
                    md5sum=rec.get("md5sum"),
                    created=float(rec.get("created", 0)),
                    last_access=float(rec.get("last_access", 0)),
                )
            )
        out.sort(key=lambda e: (e.last_access, e.key))
        return out

    def _sizes(self) -> dict[str, int]:
        """Sizes of the data files that have a record file: what the budget limits."""
        recorded = {n[: -len(".json")] for n in _listdir(os.path.join(self.cache_dir, "meta"))}
        sizes = {}
        for key in _listdir(os.path.join(self.cache_dir, "data")):
            size = _regular_size(self._data(key)) if key in recorded else None
            if size is not None:
                sizes[key] = size
        return sizes

    def total_bytes(self) -> int:
        """Bytes of the recorded entries' data files (what the budget limits).

        Files in ``data/`` that wids did not record are not counted (nor ever deleted).
        """
        return sum(self._sizes().values())

    def evict_to(self, max_bytes: int) -> list[str]:
        """Remove least-recently-used entries nobody has open until at most ``max_bytes`` remain.

        Only recorded entries are candidates. Ignores ``keep``: this is an explicit request.

        Returns:
            The keys removed.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        if not self._prepare(create=False):
            return []
        removed: list[str] = []
        evict_lock = FileLock(
            os.path.join(self.cache_dir, ".evict.lock"), timeout=self.lock_timeout
        )
        with evict_lock:
            sizes = self._sizes()
            total = sum(sizes.values())
            if total <= max_bytes:
                return removed
            for entry in self.entries():
                if total <= max_bytes:
                    break
                if entry.key in sizes and self._remove_if_free(entry.key):
                    removed.append(entry.key)
                    total -= sizes[entry.key]
        if removed:
            log.info("cache: evicted %d entries from %s", len(removed), self.cache_dir)
        return removed

    def _remove_if_free(self, key: str) -> bool:
        """Remove a recorded entry nobody holds; ``False`` if held or not recorded."""
        lock = FileLock(self._lockfile(key))
        if not lock.acquire(blocking=False):
            return False  # open (shared) or being fetched (exclusive) somewhere
        try:
            if self._read_record(key) is None:  # not (or no longer) an entry wids recorded
                if _regular_size(self._data(key)) is None:
                    lock.unlink()  # only the lock file this call may have created
                return False
            self._remove_entry_files(key)
            lock.unlink()
            return True
        finally:
            lock.release()

    def remove(self, url: str) -> bool:
        """Remove ``url``'s entry now if nobody has it open; ``True`` if it is gone."""
        key = entry_key(url)
        if not self._prepare(create=False):
            return True
        return self._remove_if_free(key) or not os.path.exists(self._data(key))

    def clean(self, older_than: float | None = None, max_bytes: int | None = None) -> list[str]:
        """Remove entries not used for ``older_than`` seconds, then evict to ``max_bytes``.

        With neither given, removes every entry nobody has open. Always removes records whose
        data is gone, abandoned downloads, and temporary files of wids' own naming. Only what
        the cache recorded is removed; a missing directory is left missing.

        Returns:
            The keys of the entries removed.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        if not self._prepare(create=False):
            return []
        removed: list[str] = []
        cutoff = None if older_than is None else time.time() - older_than
        for key, rec in self._records():
            has_data = _regular_size(self._data(key)) is not None
            if not has_data:
                self._remove_if_free(key)  # a record whose data is gone
            elif older_than is not None or max_bytes is None:
                if cutoff is None or float(rec.get("last_access", 0)) < cutoff:
                    if self._remove_if_free(key):
                        removed.append(key)
        if max_bytes is not None:
            removed += self.evict_to(max_bytes)
        self._remove_stale_downloads()
        cachedir.remove_own_temps(self.cache_dir, "meta")
        cachedir.remove_own_temps(self.cache_dir)
        return removed

    def _remove_stale_downloads(self) -> None:
        names = _listdir(os.path.join(self.cache_dir, "tmp"), hidden=True)
        for key in {n[1:].rsplit(".", 2)[0] for n in names if cachedir.is_own_temp(n)}:
            lock = FileLock(self._lockfile(key))
            if lock.acquire(blocking=False):  # nobody is fetching this entry
                try:
                    for name in names:
                        if cachedir.is_own_temp(name, (key,)):
                            cachedir.unlink_in(self.cache_dir, "tmp", name)
                finally:
                    lock.release()

    # -- background fetching ----------------------------------------------------------------

    def prefetch(
        self,
        source: Source,
        *,
        size: int | None = None,
        etag: str | None = None,
        md5sum: str | None = None,
        stats: IOStats | None = None,
        verify: Callable[[str], None] | None = None,
    ) -> Future[None]:
        """Fetch ``source`` into the cache in a background thread (one fetch per URL at a time).

        The future's result is ``None``; its exception is what :meth:`open` would raise.
        """
        with self._mutex:
            self._pending = {u: f for u, f in self._pending.items() if not f.done()}
            pending = self._pending.get(source.url)
            if pending is not None:
                return pending
            if self._executor is None:
                self._executor = ThreadPoolExecutor(2, thread_name_prefix="wids-cache")

            def job() -> None:
                shard = self.open(
                    source, size=size, etag=etag, md5sum=md5sum, stats=stats, verify=verify
                )
                shard.close()

            future = self._executor.submit(job)
            self._pending[source.url] = future
            return future

    def close(self) -> None:
        """Stop background fetches (waiting for those running)."""
        with self._mutex:
            executor, self._executor = self._executor, None
            self._pending.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def _open_local(url: str, path: str) -> CachedShard:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as e:
        raise ShardNotFoundError("no such file", shard=path) from e
    return CachedShard(url, path, fd, os.fstat(fd).st_size, None)


def _new_record(
    url: str, st: os.stat_result, etag: str | None, md5sum: str | None
) -> dict[str, Any]:
    now = time.time()
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "url": redact_url(url),
        "url_sha256": _url_hash(url),
        "size": st.st_size,
        "etag": comparable_etag(etag),
        "md5sum": md5sum.lower() if md5sum is not None else None,
        "file_ino": st.st_ino,
        "file_mtime_ns": st.st_mtime_ns,
        "created": now,
        "last_access": now,
    }


def _regular_size(path: str) -> int | None:
    """The size of ``path`` if it is a regular file (links are not followed), else ``None``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _restore_budget(shards: weakref.WeakSet[CachedShard], cache_dir: str, max_bytes: int) -> None:
    """At exit: release the shards this process still holds, then evict down to the budget.

    Their files stay open and readable (an unlinked file's data lives while it is open), so a
    thread still reading during shutdown reads the right bytes.
    """
    released = 0
    for shard in list(shards):
        if not shard.closed and shard._lock is not None and shard._pid == os.getpid():
            shard._release_at_exit()
            released += 1
    if released:
        # keep=True: this short-lived object must not register a finalizer of its own.
        cache = ShardCache(cache_dir, max_bytes=max_bytes, keep=True, lock_timeout=10.0)
        try:
            cache.evict_to(max_bytes)
        except (OSError, LockTimeoutError) as e:
            log.warning("cache eviction in %s at exit failed: %s", cache_dir, e)


def _listdir(path: str, *, hidden: bool = False) -> list[str]:
    try:
        return [n for n in os.listdir(path) if hidden or not n.startswith(".")]
    except FileNotFoundError:
        return []


def _md5_file(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
