"""Descriptors of local files kept open, as many as the process's file limit allows.

Random access over thousands of local shards reopens shards all the time; a
:class:`DescriptorPool` keeps their descriptors open (least recently used closed first) so
that a shard read again costs one ``os.pread``, and a shard read for the first time in a while
one ``os.open``. Its bound comes from ``RLIMIT_NOFILE`` (with a margin for everything else the
process opens), not from how many shards a dataset keeps "open" otherwise; if the process runs
out of descriptors anyway (several pools, other code), the pool closes half of its idle ones
and tries again.

A descriptor is closed only when no read is using it (reads from several threads are safe).
A hot path keeps a :class:`Descriptor` and reads it without the pool's lock.
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

__all__ = ["Descriptor", "DescriptorPool", "default_capacity"]

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


class Descriptor:
    """One open file of a :class:`DescriptorPool`, read without the pool's lock.

    Kept by a hot path (one local shard) to read one file again and again: :meth:`pread` marks
    itself in use with one atomic list operation instead of taking the pool's lock and finding
    the file by path. The pool closes a descriptor only once it is dropped (least recently
    used, discarded, closed) and no read is using it; a read of a dropped descriptor returns
    ``b""`` without touching it, and its owner asks the pool for a new one
    (:meth:`DescriptorPool.descriptor`).

    Attributes:
        path: The file.
        dropped: The pool let go of it: reads return ``b""`` (closed when no read is using it).
    """

    __slots__ = ("closed", "dropped", "fd", "lock", "path", "readers", "used")

    def __init__(self, lock: threading.Lock, path: str, fd: int) -> None:
        self.lock = lock  # the pool's (not the pool: a dropped pool closes its files at once)
        self.path = path
        self.fd = fd
        self.readers: list[None] = []  # one item per read in progress (append/pop: atomic)
        self.used = False  # read since the pool last passed it over (a second chance)
        self.dropped = False
        self.closed = False

    def pread(self, n: int, offset: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (one ``os.pread``), or ``b""`` if dropped.

        Raises:
            OSError: The read failed.
        """
        readers = self.readers
        readers.append(None)  # before the check: from here on the pool leaves it open
        try:
            if self.dropped:
                return b""
            self.used = True
            return _pread(self.fd, n, offset)
        finally:
            readers.pop()
            if self.dropped and not self.closed:
                self.release()

    def release(self) -> None:
        """Close it if dropped and no read is using it (once)."""
        with self.lock:
            if self.dropped and not self.readers and not self.closed:
                self.closed = True
                _close(self.fd)


_GONE = Descriptor(threading.Lock(), "", -1)  # never read: dropped
_GONE.dropped = _GONE.closed = True


class DescriptorPool:
    """Read-only descriptors of local files by path, least recently used closed first.

    Recency is kept by a second chance: a descriptor read since the pool last made room is
    passed over once (its reads through :class:`Descriptor` take no lock to reorder it).

    Args:
        capacity: Most descriptors kept open; :func:`default_capacity` when ``None``.

    Example:
        >>> pool = DescriptorPool()
        >>> pool.pread("/etc/hostname", 4, 0)  # doctest: +SKIP
    """

    GONE = _GONE
    """A dropped :class:`Descriptor` of no file: a placeholder until the first read opens one."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be an int >= 1, not {capacity!r}")
        self.capacity = default_capacity() if capacity is None else capacity
        self._reset()

    def _reset(self) -> None:
        self._fds: OrderedDict[str, Descriptor] = OrderedDict()
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
        for d in fds.values():
            d.dropped = d.closed = True
            _close(d.fd)

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

    def descriptor(self, path: str) -> Descriptor:
        """The pool's open descriptor of ``path`` (opened now if needed), to read directly.

        The caller called :meth:`check_process` since this process began.

        Raises:
            OSError: The file cannot be opened.
        """
        with self._lock:
            d = self._fds.get(path)
            if d is None:
                return self._open(path)
            self._fds.move_to_end(path)
            d.used = True
            return d

    def pread_owned(self, path: str, n: int, offset: int) -> bytes:
        """:meth:`pread` for a caller that knows the pool is this process's (no ``getpid``).

        The caller called :meth:`check_process` (or :meth:`pread`) since this process began.
        """
        lock = self._lock
        lock.acquire()
        try:
            d = self._fds.get(path)
            if d is None:
                d = self._open(path)
            else:
                self._fds.move_to_end(path)
            d.readers.append(None)  # in use before the lock is let go: never dropped unread
        finally:
            lock.release()
        try:
            return _pread(d.fd, n, offset)
        finally:
            d.readers.pop()
            if d.dropped:
                d.release()

    def _open(self, path: str) -> Descriptor:
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
        d = self._fds[path] = Descriptor(self._lock, path, fd)
        return d

    def _trim(self, keep: int, second_chance: bool = True) -> None:
        """Drop the least recently used beyond ``keep``; close those no read is using.

        A descriptor read since it was last passed over goes to the back once (its reads
        did not reorder it); every one is passed over at most once per call.
        """
        fds = self._fds
        chances = len(fds) if second_chance else 0
        while len(fds) > max(0, keep):
            path, d = fds.popitem(last=False)
            if d.used and chances > 0:
                chances -= 1
                d.used = False
                fds[path] = d
                continue
            self._drop(d)

    def _drop(self, d: Descriptor) -> None:
        d.dropped = True  # first: a read starting now leaves it alone
        if not d.readers and not d.closed:
            d.closed = True
            _close(d.fd)

    def discard(self, path: str) -> None:
        """Close ``path``'s descriptor (when no read is using it): the next read reopens it."""
        if self._pid != os.getpid():
            self._forked()
        with self._lock:
            d = self._fds.pop(path, None)
            if d is not None:
                self._drop(d)

    def close(self) -> None:
        """Close every descriptor no read is using; the others when their reads end."""
        if self._pid != os.getpid():
            self._forked()
            return
        with self._lock:
            self._trim(0, second_chance=False)

    def __del__(self) -> None:
        try:
            if self._pid == os.getpid():
                self._trim(0, second_chance=False)
        except Exception:  # noqa: S110 - interpreter shutdown
            pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
