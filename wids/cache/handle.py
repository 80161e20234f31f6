"""An open cache entry (:class:`CachedShard`) and opening one under the entry's lock.

An open takes the entry's lock shared (:func:`acquire`), checks the entry against its record
and the caller's expectations, and hands out a :class:`CachedShard` that reads the verified
file through the descriptor it opened; the lock is released then (eviction unlinks, and open
descriptors keep reading). A fetcher upgrades the lock to exclusive a quarter second at a
time (:func:`try_upgrade`): it waits only for other fetchers and for opens being checked.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from ..errors import CacheError, LockTimeoutError, ShardNotFoundError
from ..index import Fingerprint
from ..lock import FileLock
from ..storage import redact_url
from .entries import EntryFiles

__all__ = ["CachedShard", "acquire", "downloading", "open_local", "open_valid", "try_upgrade"]

_UPGRADE_SLICE = 0.25  # seconds of waiting for an exclusive lock before looking again
_TOUCH_EVERY = 1.0  # seconds; coarser last-access updates save a metadata write per open
_READ_TOUCH_EVERY = 0.05  # seconds between reads' touches of the record's mtime (a utime)


class CachedShard:
    """An open cached (or local) shard: a descriptor of the verified file.

    Reads go to the file descriptor opened when the entry was verified, so what is read is
    the verified file, even after the cache evicted (unlinked) it: eviction never waits for
    readers (:mod:`wids.cache.budget`). No lock is held while it is open. Not picklable:
    reopen through the cache in each process.

    Args:
        url: The shard.
        path: The file opened.
        fd: Its descriptor (owned from now on).
        size: Its size.
        entry: Whether it is a cache entry (``False``: a local shard opened in place).
        record: The entry's record file, whose mtime reads move forward (at most every
            50 ms), so eviction, least recently *used* first, leaves shards being read.
    """

    def __init__(
        self, url: str, path: str, fd: int, size: int, entry: bool, record: str | None = None
    ) -> None:
        self.url = url
        self.path = path
        self.size = size
        self.entry = entry
        self.record = record
        self._fd: int | None = fd
        self._pid = os.getpid()
        self._touched = time.monotonic()

    def __repr__(self) -> str:
        return f"CachedShard({redact_url(self.url)!r}, {self.path!r})"

    def __reduce__(self) -> Any:
        raise TypeError("CachedShard holds a file descriptor and cannot be pickled; reopen it")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._fd is None

    def fileno(self) -> int:
        """The copy's read-only descriptor (valid until :meth:`close`; evicted or not).

        Raises:
            ValueError: The shard is closed.
        """
        fd = self._fd
        if fd is None:
            raise ValueError(f"{self!r} is closed")
        return fd

    @property
    def evicted(self) -> bool:
        """Whether the cache evicted this copy while it is open (its file is unlinked).

        It still reads the right bytes, but holds its disk space until closed: a reader
        that is done with it should close it.
        """
        fd = self._fd
        if fd is None or not self.entry:
            return False
        try:
            return os.fstat(fd).st_nlink == 0
        except OSError:
            return False

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
        if self.record is not None and time.monotonic() - self._touched >= _READ_TOUCH_EVERY:
            self._touched = time.monotonic()
            with contextlib.suppress(OSError):  # gone (evicted): nothing to keep
                os.utime(self.record)
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
        """Close the file (an evicted copy's disk space is freed once every reader closed it)."""
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            os.close(fd)

    def __enter__(self) -> CachedShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._fd is not None and self._pid == os.getpid():
                self.close()


def open_local(url: str, path: str) -> CachedShard:
    """A local shard opened in place: never copied, never locked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as e:
        raise ShardNotFoundError("no such file", shard=path) from e
    return CachedShard(url, path, fd, os.fstat(fd).st_size, entry=False)


def open_valid(
    files: EntryFiles,
    key: str,
    url: str,
    expected: Fingerprint,
) -> CachedShard | None:
    """With the entry's lock held (shared): an open shard if the entry is valid, else ``None``.

    The caller releases the lock once this returns: the descriptor is what reads use.
    """
    path = files.data(key)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    rec = files.check(key, url, os.fstat(fd), expected)
    if rec is None:
        os.close(fd)
        return None
    _touch(files, key, rec)
    return CachedShard(url, path, fd, rec["size"], entry=True, record=files.meta(key))


def _touch(files: EntryFiles, key: str, rec: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        os.utime(files.meta(key))  # the fine-grained last access (EntryFiles.entries)
    now = time.time()
    if now - float(rec.get("last_access", 0)) >= _TOUCH_EVERY:
        rec["last_access"] = now
        with contextlib.suppress(OSError):
            files.write_record(key, rec, fsync=False)


def acquire(lock: FileLock, url: str, deadline: float, lock_timeout: float) -> None:
    """Take the entry's ``lock`` by ``deadline``, or raise naming the shard and lock file."""
    try:
        lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
    except LockTimeoutError as e:
        raise LockTimeoutError(
            f"cache entry busy for {lock_timeout:g} s (another process fetching it?); "
            f"lock file {lock.path}",
            shard=redact_url(url),
        ) from e


def try_upgrade(lock: FileLock, url: str, deadline: float, lock_timeout: float) -> bool:
    """Upgrade for at most :data:`_UPGRADE_SLICE` s; ``False`` (lock dropped) if not."""
    left = deadline - time.monotonic()
    try:
        lock.upgrade(timeout=max(0.0, min(_UPGRADE_SLICE, left)))
        return True
    except LockTimeoutError as e:
        if left > _UPGRADE_SLICE:
            return False
        raise LockTimeoutError(
            f"cache entry busy for {lock_timeout:g} s; lock file {lock.path}",
            shard=redact_url(url),
        ) from e


def downloading(lock_path: str) -> bool:
    """Whether a fetcher holds the entry's lock exclusively now (it is downloading the shard)."""
    lock = FileLock(lock_path, shared=True)
    if not lock.acquire(blocking=False):
        return True
    lock.release()
    return False
