"""Descriptors of local files kept open, as many as the process's file limit allows.

Random access over thousands of local shards reopens shards all the time; a
:class:`DescriptorPool` keeps their descriptors open (least recently used closed first) so
that a shard read again costs one ``os.pread``, and a shard read for the first time in a while
one ``os.open``. Its bound comes from ``RLIMIT_NOFILE`` (with a margin for everything else the
process opens), not from how many shards a dataset keeps "open" otherwise; if the process runs
out of descriptors anyway (several pools, other code), the pool closes half of its idle ones
and tries again.

A descriptor is closed only when no read is using it (reads from several threads are safe).
A pool belongs to the process that made it: in a forked child the inherited copies are closed
at its first use there and never read (``pread`` has no shared offset, but the copies would
count against the child's limit); a pickled pool is a new, empty one.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from typing import Any

__all__ = ["DescriptorPool", "default_capacity"]

_getpid = os.getpid
_pread = os.pread
_MAX = 1 << 16
"""Never keep more than this many, whatever the limit."""


def default_capacity() -> int:
    """Descriptors a pool may keep: the soft ``RLIMIT_NOFILE`` minus a quarter (>= 32) spare."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # not POSIX: a modest fixed bound
        return 128
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return _MAX
    return max(8, min(_MAX, soft - max(32, soft // 4)))


class DescriptorPool:
    """Read-only descriptors of local files by path, least recently used closed first.

    Args:
        capacity: Most descriptors kept open; :func:`default_capacity` when ``None``.

    Example:
        >>> pool = DescriptorPool()
        >>> pool.pread("/etc/hostname", 4, 0)  # doctest: +SKIP
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be an int >= 1, not {capacity!r}")
        self.capacity = default_capacity() if capacity is None else capacity
        self._reset()

    def _reset(self) -> None:
        # path -> [fd, reads in progress, dropped from the pool (close when idle)]
        self._fds: OrderedDict[str, list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self._fds)

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.capacity = state["capacity"]
        self._reset()

    def _forked(self) -> None:
        """In a forked child: close the inherited copies (never read them), start empty."""
        fds, self._fds = self._fds, OrderedDict()
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        self._pid = os.getpid()
        for entry in fds.values():
            _close(entry[0])

    def pread(self, path: str, n: int, offset: int) -> bytes:
        """Up to ``n`` bytes of ``path`` at ``offset`` (one ``os.pread``; fewer at the end).

        Raises:
            OSError: The file cannot be opened or read (``ENOENT``, ``EACCES``, ``EISDIR``,
                ``EMFILE`` when even a pool with no idle descriptor cannot open one, ...).
        """
        if self._pid != _getpid():
            self._forked()
        return self.pread_owned(path, n, offset)

    def check_process(self) -> None:
        """In a forked child: close the inherited descriptors (before :meth:`pread_owned`)."""
        if self._pid != _getpid():
            self._forked()

    def pread_owned(self, path: str, n: int, offset: int) -> bytes:
        """:meth:`pread` for a caller that knows the pool is this process's (no ``getpid``).

        The caller called :meth:`check_process` (or :meth:`pread`) since this process began:
        the hot path of local reads, which checks the process once per read itself.
        """
        lock = self._lock
        lock.acquire()
        try:
            entry = self._fds.get(path)
            if entry is None:
                entry = self._open(path)
            else:
                self._fds.move_to_end(path)
            entry[1] += 1
        finally:
            lock.release()
        try:
            return _pread(entry[0], n, offset)
        finally:
            lock.acquire()
            entry[1] -= 1
            if entry[2] and not entry[1]:
                _close(entry[0])
            lock.release()

    def _open(self, path: str) -> list[Any]:
        """Open ``path`` into the pool, making room first (the caller holds the lock)."""
        self._trim(self.capacity - 1)
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            self._trim(len(self._fds) // 2)  # out of descriptors: give back half of ours
            fd = os.open(path, flags)
        entry = [fd, 0, False]
        self._fds[path] = entry
        return entry

    def _trim(self, keep: int) -> None:
        """Drop the least recently used beyond ``keep``; close those no read is using."""
        fds = self._fds
        while len(fds) > max(0, keep):
            _, entry = fds.popitem(last=False)
            entry[2] = True
            if not entry[1]:
                _close(entry[0])

    def discard(self, path: str) -> None:
        """Close ``path``'s descriptor (when no read is using it): the next read reopens it."""
        if self._pid != os.getpid():
            self._forked()
        with self._lock:
            entry = self._fds.pop(path, None)
            if entry is not None:
                entry[2] = True
                if not entry[1]:
                    _close(entry[0])

    def close(self) -> None:
        """Close every descriptor no read is using; the others when their reads end."""
        if self._pid != os.getpid():
            self._forked()
            return
        with self._lock:
            self._trim(0)

    def __del__(self) -> None:
        try:
            if self._pid == os.getpid():
                self._trim(0)
        except Exception:  # noqa: S110 - interpreter shutdown
            pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
