"""An open cache entry (:class:`CachedShard`) and opening one under the entry's lock.

An open takes the entry's lock shared (:func:`acquire`), checks the entry against its record
and the caller's expectations, and hands out a :class:`CachedShard` that reads the verified
file and keeps the lock until closed, so eviction never removes an entry being read. A
fetcher upgrades the lock to exclusive a quarter second at a time (:func:`try_upgrade`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from ..errors import CacheError, LockTimeoutError, ShardNotFoundError
from ..index import Fingerprint
from ..lock import FileLock
from ..storage import redact_url
from .entries import EntryFiles

__all__ = ["CachedShard", "acquire", "open_local", "open_valid", "try_upgrade"]

_UPGRADE_SLICE = 0.25  # seconds of waiting for an exclusive lock before looking again
_TOUCH_EVERY = 1.0  # seconds; coarser last-access updates save a metadata write per open


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

    def release_at_exit(self) -> bool:
        """Release the entry's lock (it becomes evictable) but keep reading the open file.

        Returns:
            Whether this process held the entry open and released it now.
        """
        if self.closed or self._lock is None or self._pid != os.getpid():
            return False
        lock, self._lock, self._on_close = self._lock, None, None
        lock.release()
        return True

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
    return CachedShard(url, path, fd, os.fstat(fd).st_size, None)


def open_valid(
    files: EntryFiles,
    key: str,
    url: str,
    expected: Fingerprint,
    lock: FileLock,
    on_close: Callable[[], None] | None = None,
) -> CachedShard | None:
    """With ``lock`` held shared: an open shard if the entry is valid, else ``None``.

    ``on_close`` is called after the shard is closed and its lock released (eviction).
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
    shard = CachedShard(url, path, fd, rec["size"], lock)
    shard._on_close = on_close
    return shard


def _touch(files: EntryFiles, key: str, rec: dict[str, Any]) -> None:
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
