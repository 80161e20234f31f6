"""The local shard cache: collision-free names, fetch-once across processes, byte-budget LRU.

API (what ``ShardListDataset`` and the ``wids cache`` command use)::

    cache = ShardCache(cache_dir, max_bytes=None, keep=False, lock_timeout=600.0, offline=False)
    with cache.open(source, expected=info.fingerprint, stats=...) as shard:
        shard.path, shard.size, shard.read_range(start, end)     # os.pread on the cached file
    cache.open_with(url, download, expected=...)                # core: download(dest) -> any
    cache.open_cached(url, expected=...) -> CachedShard | None  # only if cached now
    cache.prefetch(source, expected=..., ...) -> Future         # background (wait_fetches())
    cache.contains(url); cache.entries(); cache.total_bytes()
    cache.evict_to(max_bytes); cache.clean(older_than=None, max_bytes=None); cache.remove(url)

``expected`` is a :class:`wids.index.Fingerprint` (or give ``size=``, ``etag=``, ``md5sum=``).
The directory's layout is documented (and owned) by :mod:`wids.cache.layout`; entries'
records and files by :mod:`wids.cache.entries`; an open entry by :mod:`wids.cache.handle`.

Protocol: an open takes the entry's lock shared and checks the entry (record present, data
file's size, inode, mtime and ctime as recorded, and the expected version: size, etag or
``Last-Modified``, md5, when known), opens its file and releases the lock: the returned
:class:`CachedShard` reads that descriptor, which stays valid when the entry is evicted
(unlinked). If the check fails it waits for this process's download slot (one at a time)
holding no lock, then upgrades to exclusive (a quarter second at a time, then checking again:
another process may be fetching it), checks again, removes temporary files left by killed
downloads of this entry, makes room in the budget, downloads into ``tmp/`` (a copy that fails
its check is fetched again within the retry policy), verifies size, etag and md5, and records
and publishes it under the budget's lock. Eviction: :mod:`wids.cache.budget`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import CacheError, OfflineError, writing
from ..index import Fingerprint
from ..lock import FileLock
from ..storage import redact_url, url_name
from . import budget
from . import layout as cachedir
from .download import download_entry, fetch_checked
from .entries import ENTRY_SUBDIRS, CacheEntry, EntryFiles, version_mismatch
from .handle import CachedShard, acquire, downloading, open_local, open_valid, try_upgrade
from .promote import BackgroundFetches
from .readers import ReaderMarks
from .refetch import Refetches

if TYPE_CHECKING:
    from ..storage import IOStats, Source

__all__ = ["ShardCache"]

log = logging.getLogger(__name__)

_AHEAD_AGE = 120.0  # seconds a shard fetched ahead counts against the share if never opened
# shards fetched ahead per process at most: enough to overlap downloads with reads, and a
# process that counted the readers before the others marked themselves does not fill the budget
_AHEAD_SHARDS = 3
_MAX_ATTEMPTS = 5  # fetches of one entry in one open before giving up (eviction thrash)


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
        self._background = BackgroundFetches(thread_name_prefix="wids-cache")
        self._mutex = threading.Lock()
        self._ready = False  # the directory was checked (and marked) by this object
        self._downloading = threading.Lock()
        self._readers = ReaderMarks(os.path.join(self.cache_dir, "locks"))
        # fetched ahead, not yet opened by a read: url -> (bytes, when, fetched)
        self._ahead: dict[str, tuple[int, float, bool]] = {}
        # readers known to come whatever the marks say yet (a DataLoader's workers: each is
        # a process of its own, and its siblings may not have marked themselves yet)
        self.min_readers = 1
        # counting readers marks this process one (it reads through the cache); a process that
        # only fetches ahead for others (a DataLoader's main process warming it) is not counted
        self.reader = True
        self.refetches = Refetches()  # this object's downloads of a shard again, too soon
        self.files = EntryFiles(self.cache_dir)

    def __repr__(self) -> str:
        return f"ShardCache({self.cache_dir!r}, max_bytes={self.max_bytes!r}, keep={self.keep!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("cache_dir", "max_bytes", "keep", "lock_timeout", "offline")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("cache_dir"), **state)  # type: ignore[misc]

    def _prepare(self, *, create: bool = True) -> bool:
        """Check (and if new, mark) the directory, once per object; ``False`` if it is missing.

        With a budget, the first use also evicts down to it: an earlier run may have had a
        larger one.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        if self._ready:
            return True
        if cachedir.open_cache_dir(self.cache_dir, *ENTRY_SUBDIRS, create=create) is None:
            return False
        with self._mutex:
            first, self._ready = not self._ready, True
        if first and self.max_bytes is not None and not self.keep:
            self._evict_quietly()  # a budget made smaller than what an earlier run left
        return True

    # -- opening ----------------------------------------------------------------------------

    def open(
        self,
        source: Source,
        *,
        expected: Fingerprint | None = None,
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
            expected: What the index says (``ShardInfo.fingerprint``): the size is checked
                (and budgeted up front), another etag is fetched again, the MD5 verified.
            size: Expected size, instead of ``expected``.
            etag: Expected etag, instead of ``expected``.
            md5sum: Expected hex MD5, instead of ``expected``.
            stats: I/O counters for the download.
            verify: Called with the downloaded file's path before it is published; raises if
                the copy is wrong (e.g. ``wids.dataset.readers.download_check``: member
                headers), and then nothing is cached.

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
        expect = _expectation(expected, size, etag, md5sum)
        if source.is_local:
            return open_local(source.url, source.local_path or source.url)
        if expect.size is None and self.max_bytes is not None and not self.offline:
            expect = replace(expect, size=source.info(stats).size)

        with self._mutex:
            self._ahead.pop(source.url, None)
        return self._open_source(source, expect, stats, verify)

    def _open_source(
        self,
        source: Source,
        expect: Fingerprint,
        stats: IOStats | None,
        verify: Callable[[str], None] | None,
        ahead: bool = False,
    ) -> CachedShard:
        def download(dest: str) -> Any:
            return fetch_checked(source, dest, stats, expect.size, verify)

        return self.open_with(source.url, download, expected=expect, ahead=ahead)

    def open_with(
        self,
        url: str,
        download: Callable[[str], Any],
        *,
        expected: Fingerprint | None = None,
        size: int | None = None,
        etag: str | None = None,
        md5sum: str | None = None,
        ahead: bool = False,
    ) -> CachedShard:
        """The core of :meth:`open`: ``download(dest_path)`` writes the whole shard to a path.

        ``download`` may return an object with an ``etag`` attribute (a ``FileStat``), which
        is then compared with the expected etag and recorded. Expectations as for :meth:`open`.
        ``ahead``: downloaded ahead of its reads; until a read opens it, eviction takes the
        entries already read first (its last use is set :data:`_AHEAD_AGE` seconds ahead).
        """
        expect = _expectation(expected, size, etag, md5sum)
        self._prepare()
        if expect.size is not None:
            budget.check_fits(url, expect.size, self.max_bytes)
        key = url_name(url)
        deadline = time.monotonic() + self.lock_timeout
        lock = FileLock(self.files.lockfile(key), shared=True)
        fetches = 0
        while True:
            acquire(lock, url, deadline, self.lock_timeout)
            try:
                shard = self._open_valid(key, url, expect, lock)
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
            lock.release()
            # one download at a time per process (the budget's allowance), waited for holding
            # no lock on this entry: another process may fetch it meanwhile
            with self._downloading:
                if not lock.acquire(blocking=False):  # another process is fetching it
                    continue
                try:
                    shard = self._open_valid(key, url, expect, lock)
                except BaseException:
                    lock.release()
                    raise
                if shard is not None:
                    return shard
                # become the fetcher; another process fetching it: look again (its copy)
                if not try_upgrade(lock, url, deadline, self.lock_timeout):
                    continue
                try:
                    if self.files.is_valid(key, url, expect):  # fetched meanwhile by another
                        shard = self._open_valid(key, url, expect, lock)
                    else:
                        fetches += 1
                        tmp = os.path.join(self.cache_dir, "tmp")
                        with writing(redact_url(url), tmp):  # a full disk: which shard, cache
                            shard = self._fetch(key, url, download, expect)
                        if ahead:
                            self._reserve(key)
                        lock.release()
                except BaseException:
                    if lock.locked:
                        lock.release()
                    raise
                if shard is not None:
                    return shard
            lock.release()  # evicted at once by another process: look again

    def open_cached(
        self,
        url: str,
        *,
        expected: Fingerprint | None = None,
        size: int | None = None,
        etag: str | None = None,
        md5sum: str | None = None,
    ) -> CachedShard | None:
        """Open ``url``'s entry if an intact copy is cached now (as expected, see :meth:`open`).

        Returns:
            The open shard, or ``None`` if it is not cached (or another process is writing it).
        """
        expect = _expectation(expected, size, etag, md5sum)
        key = url_name(url)
        with self._mutex:
            self._ahead.pop(url, None)
        if not os.path.exists(self.files.data(key)) or not self._prepare(create=False):
            return None
        lock = FileLock(self.files.lockfile(key), shared=True)
        if not lock.acquire(blocking=False):
            return None
        try:
            shard = self._open_valid(key, url, expect, lock)
        except BaseException:
            lock.release()
            raise
        if shard is None:
            lock.release()
        return shard

    def _open_valid(
        self,
        key: str,
        url: str,
        expected: Fingerprint,
        lock: FileLock,
    ) -> CachedShard | None:
        """With ``lock`` held: an open shard if the entry is valid (then ``lock`` is released)."""
        shard = open_valid(self.files, key, url, expected)
        if shard is not None:
            lock.release()
        return shard

    # -- fetching (entry lock held exclusively) ---------------------------------------------

    def _fetch(
        self,
        key: str,
        url: str,
        download: Callable[[str], Any],
        expected: Fingerprint,
    ) -> CachedShard:
        """Download, publish and open the entry.

        Its descriptor is taken before publishing: another process evicting it at once does
        not take it from this reader.
        """
        self.files.remove_files(key)
        fd, size = download_entry(  # in this process's download slot (open_with)
            self.files,
            key,
            url,
            download,
            expected,
            self.max_bytes,
            keep=self.keep,
            lock_timeout=self.lock_timeout,
        )
        self.refetches.note(url)
        return CachedShard(url, self.files.data(key), fd, size, True, self.files.meta(key))

    def _reserve(self, key: str) -> None:
        """Mark a copy fetched ahead as used :data:`_AHEAD_AGE` s from now (until a read opens it).

        Eviction is least recently used first: without this, a shard fetched ahead and not
        read yet was older than the shard being read, and evicted before its own reads.
        """
        when = time.time() + _AHEAD_AGE
        with contextlib.suppress(OSError):  # evicted at once: nothing to keep
            os.utime(self.files.meta(key), (when, when))

    def _evict_quietly(self) -> None:
        if self.max_bytes is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: self.max_bytes is not set")
        budget.evict_quietly(self.files, self.max_bytes, self.lock_timeout)

    # -- listing and eviction (see wids.cache.budget) ---------------------------------------

    def contains(self, url: str) -> bool:
        """Whether an intact copy of ``url`` is cached (no lock taken: a hint)."""
        return self.files.is_valid(url_name(url), url, Fingerprint())

    def entries(self) -> list[CacheEntry]:
        """The recorded entries that have their data, least recently used first.

        Raises:
            CacheDirError: A subdirectory of the cache is a symbolic link.
        """
        return self.files.entries()

    def total_bytes(self) -> int:
        """Bytes of the recorded entries' data files (what the budget limits).

        Files in ``data/`` that wids did not record are not counted (nor ever deleted).
        """
        return sum(self.files.sizes().values())

    def stale(self, shards: Iterable[tuple[str, Fingerprint]]) -> dict[str, str]:
        """Cached copies that are not the version an index records (they are fetched again).

        Args:
            shards: ``(url, fingerprint)`` of each shard of an index (``ShardInfo``'s).

        Returns:
            The redacted URL of each stale copy, and what differs.
        """
        out = {}
        for url, expected in shards:
            key = url_name(url)
            rec = self.files.read_record(key)
            if rec is None or not os.path.exists(self.files.data(key)):
                continue
            problem = version_mismatch(rec, expected)
            if problem is not None:
                out[redact_url(url)] = problem
        return out

    def evict_to(self, max_bytes: int) -> list[str]:
        """Remove least-recently-used entries until they and downloads in flight fit ``max_bytes``.

        Open entries are removed too (unlinked: their readers keep reading). Only recorded
        entries are candidates. Ignores ``keep``: this is an explicit request.

        Returns:
            The keys removed.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        if not self._prepare(create=False):
            return []
        return budget.evict_to(self.files, max_bytes, self.lock_timeout)

    def remove(self, url: str) -> bool:
        """Remove ``url``'s entry now if nobody has it open; ``True`` if it is gone."""
        key = url_name(url)
        if not self._prepare(create=False):
            return True
        return self.files.remove_if_free(key) or not os.path.exists(self.files.data(key))

    def clean(self, older_than: float | None = None, max_bytes: int | None = None) -> list[str]:
        """Remove entries not used for ``older_than`` seconds, then evict to ``max_bytes``.

        With neither given, removes every entry (open ones are unlinked: their readers keep
        reading). Always removes records whose
        data is gone, abandoned downloads, and temporary files of wids' own naming. Only what
        the cache recorded is removed; a missing directory is left missing.

        Returns:
            The keys of the entries removed.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        if not self._prepare(create=False):
            return []
        return budget.clean(self.files, older_than, max_bytes, self.lock_timeout)

    # -- background fetching ----------------------------------------------------------------

    def prefetch(
        self,
        source: Source,
        *,
        expected: Fingerprint | None = None,
        size: int | None = None,
        etag: str | None = None,
        md5sum: str | None = None,
        stats: IOStats | None = None,
        verify: Callable[[str], None] | None = None,
        ahead: bool = True,
    ) -> Future[None]:
        """Fetch ``source`` into the cache in a background thread (one fetch per URL at a time).

        The future's result is ``None``; its exception is what :meth:`open` would raise. A
        fetch ``ahead`` of the shard's reads happens only within this process's share of the
        budget (:meth:`may_fetch_ahead`: it would evict what is being read); otherwise the
        future is done at once. ``ahead=False``: its reads begin now, as with :meth:`open`.
        """
        expect = _expectation(expected, size, etag, md5sum)
        if ahead and expect.size is not None and not self.may_fetch_ahead(source.url, expect.size):
            skipped: Future[None] = Future()
            skipped.set_result(None)
            return skipped

        with self._mutex:
            counted = ahead and source.url in self._ahead  # against this process's share

        def job() -> None:
            with self._mutex:  # queued behind other fetches: its reads may be done already
                if counted and source.url not in self._ahead:
                    return  # a read opened it meanwhile (and fetches it if it must)
            # another process downloading it: its reads open that copy (waiting here held up
            # the fetches queued behind this one too)
            self._prepare()
            if ahead and downloading(self.files.lockfile(url_name(source.url))):
                with self._mutex:  # it holds no room of this process's share
                    self._ahead.pop(source.url, None)
                return
            log.debug("cache: fetching %s ahead of its reads", redact_url(source.url))
            try:
                self._open_source(source, expect, stats, verify, ahead=ahead).close()
            except BaseException:
                with self._mutex:  # nothing was fetched: it holds no room
                    self._ahead.pop(source.url, None)
                raise
            with self._mutex:
                held = self._ahead.get(source.url)
                if held is not None:
                    self._ahead[source.url] = (held[0], held[1], True)

        return self._background.submit(source.url, job)

    def may_fetch_ahead(self, url: str, size: int) -> bool:
        """Whether ``url`` may be fetched ahead of its reads now (and if so, count it ahead).

        This process's share of the budget (``max_bytes`` over the readers active now) holds
        the shard being read, one more its reads may open, and what was fetched ahead and not
        yet opened by a read (at most :data:`_AHEAD_SHARDS` of them); a plan announcing a whole
        epoch gets only what fits, the rest is fetched as room frees or when read.
        """
        if self.max_bytes is None:
            return True
        if not self.roomy(size):
            return False
        share = self.max_bytes // self.active_readers() - 2 * size
        with self._mutex:
            if url in self._ahead:
                return True
            held = self._held_ahead()
            if sum(held) + size > share or len(held) >= _AHEAD_SHARDS:
                return False
            self._ahead[url] = (size, time.monotonic(), False)
            return True

    def _held_ahead(self) -> list[int]:
        """Sizes of shards fetched ahead that still hold room (under the mutex).

        A shard stops counting when a read here opens it, its fetch fails, its copy is no
        longer in the cache (evicted, or read and dropped by another process), or it was
        announced more than ``_AHEAD_AGE`` seconds ago (the plan's guess was wrong).
        """
        now = time.monotonic()
        for url, (_, when, fetched) in list(self._ahead.items()):
            if now - when > _AHEAD_AGE or (
                fetched and not os.path.exists(self.files.data(url_name(url)))
            ):
                del self._ahead[url]
        return [size for size, _, _ in self._ahead.values()]

    def roomy(self, shard_bytes: int) -> bool:
        """Whether the budget holds two shards of ``shard_bytes`` per reader active now."""
        if self.max_bytes is None:
            return True
        return 2 * shard_bytes * self.active_readers() <= self.max_bytes

    def active_readers(self) -> int:
        """Processes reading through this cache directory now, this one included.

        At least :attr:`min_readers`: a process that knows it is one of several (a DataLoader
        worker) counts them all before their marks are made.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        self._prepare()
        return max(self.min_readers, self._readers.count(mark=self.reader))

    def marked_readers(self) -> int:
        """Processes marked readers of this cache directory now (:meth:`mark_reader`), or 0.

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        self._prepare()
        return self._readers.count(mark=False)

    def mark_reader(self) -> None:
        """Mark this process a reader now, before it counts (so others count it early).

        Raises:
            CacheDirError: The directory is not one wids may use (see :mod:`wids.cache.layout`).
        """
        self._prepare()
        self._readers.hold()

    def unmark_reader(self) -> None:
        """This process stops counting as a reader; counting with :attr:`reader` marks it again."""
        self.reader = False
        self._readers.close()

    def wait_fetches(self) -> None:
        """Wait for the background fetches (:meth:`prefetch`) started so far."""
        self._background.wait()

    def close(self) -> None:
        """Stop background fetches (waiting for those running) and drop this reader mark."""
        self._background.close()
        self._readers.close()


def _expectation(
    expected: Fingerprint | None, size: int | None, etag: str | None, md5sum: str | None
) -> Fingerprint:
    """The one :class:`Fingerprint` a public method was given (ValueError if given twice)."""
    if expected is None:
        return Fingerprint(size, etag, md5=md5sum)
    if (size, etag, md5sum) != (None, None, None):
        raise ValueError("give expected or size/etag/md5sum, not both")
    return expected
