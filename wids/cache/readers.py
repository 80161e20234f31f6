"""How many processes read through a cache directory now: marks held by flock.

Each :class:`~wids.cache.shards.ShardCache` that asks (promotion does) marks itself a reader
with a file ``locks/.reader.<pid>.<random>`` it holds an exclusive ``flock`` on for as long as
its process lives; counting tries each mark's lock without blocking. A mark whose lock is free
belongs to a process that is gone (killed ones included: the kernel drops their locks) and is
removed. The count is what the budget's promotion rule divides by (:mod:`wids.cache.promote`):
a budget that does not hold two shards per reader active at once is not used for promotion.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import uuid

__all__ = ["ReaderMarks"]

_PREFIX = ".reader."
_RECOUNT = 1.0  # seconds a count is reused
_STALE_AGE = 10.0  # a free mark younger than this may be one being created: left alone


class ReaderMarks:
    """This process's reader mark in a cache directory, and the count of all of them.

    Args:
        locks_dir: The cache's ``locks/`` directory (checked by the caller).
    """

    def __init__(self, locks_dir: str) -> None:
        self.locks_dir = locks_dir
        self._fd: int | None = None
        self._pid = 0
        self._count = (0.0, 0)  # (when, count)
        self._mutex = threading.Lock()

    def count(self) -> int:
        """Readers active now, this process included (its mark is made on first use)."""
        with self._mutex:
            self._hold()
            when, n = self._count
            if time.monotonic() - when < _RECOUNT:
                return n
            n = max(1, sum(self._live(name) for name in self._names()))
            self._count = (time.monotonic(), n)
            return n

    def _hold(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            return
        path = os.path.join(self.locks_dir, f"{_PREFIX}{os.getpid()}.{uuid.uuid4().hex[:8]}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
        self._fd, self._pid, self._count = fd, os.getpid(), (0.0, 0)

    def _names(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.locks_dir) if n.startswith(_PREFIX)]
        except FileNotFoundError:
            return []

    def _live(self, name: str) -> bool:
        path = os.path.join(self.locks_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True  # held: its process lives
            if os.fstat(fd).st_mtime < time.time() - _STALE_AGE:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its process is gone
            return False
        finally:
            os.close(fd)

    def close(self) -> None:
        """Drop this process's mark."""
        with self._mutex:
            fd, self._fd = self._fd, None
            if fd is not None and self._pid == os.getpid():
                os.close(fd)
