"""How many processes read through a cache directory now: marks held by flock.

Each :class:`~wids.cache.shards.ShardCache` that asks (promotion does) marks itself a reader
with a file ``locks/.reader.<pid>.<random>`` it holds an exclusive ``flock`` on for as long as
its process lives; counting tries each mark's lock without blocking. A mark whose lock is free
belongs to a process that is gone (killed ones included: the kernel drops their locks) and is
removed. Marks are counted by process (the pid in their name): a process with several caches
over the directory is one reader; a cache's mark goes with it (``close()`` or collection).
The count is what the budget's promotion rule divides by (:mod:`wids.cache.promote`): a budget
that does not hold two shards per reader active at once is not used for promotion.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import uuid
import weakref

__all__ = ["ReaderMarks"]

_PREFIX = ".reader."
_RECOUNT = 0.25  # seconds a count is reused (readers arriving are seen soon)
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
        self._drop: weakref.finalize[[int, str, int], ReaderMarks] | None = None

    def count(self, *, mark: bool = True) -> int:
        """Readers active now: this process too if it holds a mark, made now with ``mark``."""
        with self._mutex:
            if mark:
                self._hold()
            mine = int(self._fd is not None and self._pid == os.getpid())
            when, others = self._count
            if time.monotonic() - when >= _RECOUNT:
                pids = {_pid_of(name) for name in self._names() if self._live(name)}
                others = len(pids - {str(os.getpid())})
                self._count = (time.monotonic(), others)
            return others + mine

    def hold(self) -> None:
        """Make this process's mark now (counting makes it too)."""
        with self._mutex:
            self._hold()

    def _hold(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            return
        pid = os.getpid()
        path = os.path.join(self.locks_dir, f"{_PREFIX}{pid}.{uuid.uuid4().hex[:8]}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:  # blocking: a process counting marks holds a fresh one's lock for a moment
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            _drop_mark(fd, path, pid)
            raise
        self._fd, self._pid, self._count = fd, pid, (0.0, 0)
        self._drop = weakref.finalize(self, _drop_mark, fd, path, pid)

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
        """Drop this process's mark (also done when the object is collected)."""
        with self._mutex:
            self._fd = None
            drop, self._drop = self._drop, None
            if drop is not None:
                drop()


def _pid_of(name: str) -> str:
    return name[len(_PREFIX) :].split(".", 1)[0]


def _drop_mark(fd: int, path: str, pid: int) -> None:
    """Remove and close a mark, in the process that made it only (a forked child's copy stays)."""
    if os.getpid() != pid:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.close(fd)
