"""File locks with timeouts, and the writer lock that guards an output file.

Every writer of the shard cache and of index files takes its locks here; publishing the files
themselves (temporary file + ``os.replace``) is :mod:`wids.atomic`.

Locks (:class:`FileLock`) are ``fcntl.flock`` locks on a lock file, shared or exclusive, with
a timeout. Ownership rules, chosen deliberately:

- **One owner per** :class:`FileLock` **object.** Each object opens the lock file itself, so
  two objects on the same path contend exactly like two processes do, even inside one
  process (two threads, two datasets). That is what lets the cache protect an entry that one
  thread is reading from an eviction started by another thread of the same process. POSIX
  ``fcntl`` record locks would not: they are per process.
- **Re-entrant per object.** Acquiring an object that is already held by this process nests
  (a counter); the lock is released when the outermost hold is released. Re-acquiring in a
  stronger mode (shared, then exclusive) through the same object is refused with
  ``RuntimeError``; changing mode is explicit (:meth:`FileLock.upgrade`,
  :meth:`FileLock.downgrade`) because ``flock`` does not convert atomically.
- **Fork-safe.** A child process inherits the descriptor but does not own the lock: in the
  child the object reports itself unlocked and releasing it never unlocks the parent's hold.
- **No symbolic links.** A lock file is opened with ``O_NOFOLLOW``: a link planted at its name
  is :class:`~wids.errors.OutputExistsError`, its target never created or written.
- **Deletable lock files.** After ``flock`` succeeds, the lock checks that its path still
  names the file it locked, and retries if not. So a holder of the exclusive lock may remove
  the lock file (:meth:`FileLock.unlink`); anyone blocked on the old file notices and starts
  over on a new one. Nobody else ever deletes a lock file. :func:`writer_lock` uses this to
  guard a user's output (an index) without leaving a ``*.lock`` file beside it.

Example:
    >>> with FileLock("/tmp/x.lock", timeout=5):           # doctest: +SKIP
    ...     pass
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from .errors import LockTimeoutError, OutputExistsError

__all__ = ["LOCK_MARK", "FileLock", "same_file", "writer_lock"]

LOCK_MARK = b"wids writer lock\n"
"""Content of a lock file made by :func:`writer_lock`; only such (or empty) files are removed."""

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_POLL_FIRST = 0.001
_POLL_MAX = 0.05


class FileLock:
    """A shared or exclusive ``flock`` on a lock file, with a timeout.

    The lock file (and its directory) is created on first acquisition. The object is
    re-entrant (see the module docstring for the exact rules), usable as a context manager,
    thread-safe, and picklable (it pickles unlocked).

    Args:
        path: The lock file.
        shared: Acquire a shared (reader) lock instead of an exclusive one.
        timeout: Seconds to wait; ``None`` waits forever, ``0`` tries once.

    Raises:
        ValueError: ``timeout`` is negative.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, shared: bool = False, timeout: float | None = None
    ) -> None:
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        self.path = os.fspath(path)
        self.shared = shared
        self.timeout = timeout
        self._fd: int | None = None
        self._pid = 0
        self._count = 0
        self._mode_shared = shared
        self._mutex = threading.RLock()

    def __repr__(self) -> str:
        state = ("shared" if self._mode_shared else "exclusive") if self.locked else "unlocked"
        return f"FileLock({self.path!r}, {state})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "shared": self.shared, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], shared=state["shared"], timeout=state["timeout"])  # type: ignore[misc]

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock in this process."""
        return self._fd is not None and self._count > 0 and self._pid == os.getpid()

    @property
    def is_shared(self) -> bool:
        """The mode currently held (meaningful only while :attr:`locked`)."""
        return self._mode_shared

    def acquire(self, *, timeout: float | None = -1.0, blocking: bool = True) -> bool:
        """Take the lock, waiting at most ``timeout`` seconds.

        Args:
            timeout: Overrides the object's timeout for this call; ``-1`` keeps it.
            blocking: ``False`` tries once and returns ``False`` instead of raising.

        Returns:
            ``True`` once held; ``False`` only when ``blocking`` is false and it is busy.

        Raises:
            LockTimeoutError: The lock was not free within the timeout.
            RuntimeError: This object holds a shared lock and was asked for an exclusive one.
        """
        wait = self.timeout if timeout is not None and timeout < 0 else timeout
        if not blocking:
            wait = 0.0
        with self._mutex:
            self._forget_if_forked()
            if self._count > 0:
                if self._mode_shared and not self.shared:
                    raise RuntimeError(f"{self.path}: held shared; use upgrade() for exclusive")
                self._count += 1
                return True
            fd = self._lock_path(fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX, wait)
            if fd is None:
                if not blocking:
                    return False
                raise LockTimeoutError(
                    f"{'shared' if self.shared else 'exclusive'} lock not acquired in {wait:g} s",
                    shard=self.path,
                )
            self._fd, self._pid, self._count, self._mode_shared = fd, os.getpid(), 1, self.shared
            return True

    def release(self) -> None:
        """Undo one :meth:`acquire`; the lock is dropped when the outermost hold ends.

        Raises:
            RuntimeError: The lock is not held.
        """
        with self._mutex:
            if self._forget_if_forked() or self._count == 0:
                raise RuntimeError(f"{self.path}: release() of a lock that is not held")
            self._count -= 1
            if self._count == 0:
                self._close(unlock=True)

    def upgrade(self, *, timeout: float | None = -1.0) -> None:
        """Turn a held shared lock into an exclusive one.

        ``flock`` drops the shared lock before waiting for the exclusive one, so another
        process may change the protected state in between: re-check it after upgrading.

        Raises:
            LockTimeoutError: Not acquired in time; the object then holds nothing.
            RuntimeError: The lock is not held, or held more than once.
        """
        self._convert(fcntl.LOCK_EX, timeout)

    def downgrade(self, *, timeout: float | None = -1.0) -> None:
        """Turn a held exclusive lock into a shared one (not atomic either: re-check after).

        Raises:
            LockTimeoutError: Not reacquired in time; the object then holds nothing.
            RuntimeError: The lock is not held, or held more than once.
        """
        self._convert(fcntl.LOCK_SH, timeout)

    def unlink(self) -> None:
        """Remove the lock file; only allowed while holding it exclusively.

        Others waiting on the removed file re-check the path after locking and start over.

        Raises:
            RuntimeError: The lock is not held exclusively.
        """
        with self._mutex:
            if not self.locked or self._mode_shared:
                raise RuntimeError(f"{self.path}: unlink() needs the exclusive lock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _convert(self, op: int, timeout: float | None) -> None:
        wait = self.timeout if timeout is not None and timeout < 0 else timeout
        with self._mutex:
            if not self.locked:
                raise RuntimeError(f"{self.path}: cannot change the mode of a lock not held")
            if self._count != 1:
                raise RuntimeError(f"{self.path}: cannot change mode while held re-entrantly")
            if self._fd is None:  # held locks always have a descriptor
                raise RuntimeError(f"{self.path}: lock held without a descriptor")
            deadline = None if wait is None else time.monotonic() + wait
            ok = _flock_wait(self._fd, op, wait)
            if ok and not same_file(self._fd, self.path):
                # Unlinked by an exclusive holder in the gap of the conversion: the lock
                # now belongs to whatever file the path names.
                self._close(unlock=True)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                fd = self._lock_path(op, left)
                if fd is None:
                    ok = False
                else:
                    self._fd, self._pid, self._count = fd, os.getpid(), 1
            if not ok:
                self._close(unlock=True)
                raise LockTimeoutError(f"lock not converted within {wait:g} s", shard=self.path)
            self._mode_shared = op == fcntl.LOCK_SH

    def _forget_if_forked(self) -> bool:
        """In a forked child, drop the inherited descriptor without unlocking the parent."""
        if self._fd is not None and self._pid != os.getpid():
            self._close(unlock=False)
            return True
        return False

    def _close(self, *, unlock: bool) -> None:
        fd, self._fd, self._count = self._fd, None, 0
        if fd is None:
            return
        if unlock:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def _lock_path(self, op: int, wait: float | None) -> int | None:
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            try:  # never through a symbolic link planted at the lock's name
                fd = os.open(self.path, _OPEN_FLAGS, 0o666)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise OutputExistsError(
                    "is a symbolic link; wids does not follow it to create or lock its target "
                    "(remove it)",
                    shard=self.path,
                ) from None
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not _flock_wait(fd, op, left):
                    os.close(fd)
                    return None
                if same_file(fd, self.path):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            # The file was unlinked by its exclusive holder while we waited: start over.
            os.close(fd)


@contextlib.contextmanager
def writer_lock(dest: str | os.PathLike[str], *, timeout: float | None = 0.0) -> Iterator[FileLock]:
    """Hold the exclusive lock that guards writing ``dest``, and leave no lock file behind.

    The lock file is ``dest + ".lock"``. It is removed on the way out while still held (see
    :meth:`FileLock.unlink`: anyone waiting on it starts over on a new file), but only if it is
    empty or holds :data:`LOCK_MARK`, so a user's own file of that name is never deleted. A
    writer killed while holding it leaves the marked file, and the next writer removes it.

    Args:
        dest: The file being written.
        timeout: Seconds to wait for another writer (default: fail at once).

    Yields:
        The held lock.

    Raises:
        LockTimeoutError: Another writer holds it.
    """
    lock = FileLock(os.fspath(dest) + ".lock", timeout=timeout)
    with lock:
        fd = lock._fd
        ours = fd is not None and os.pread(fd, len(LOCK_MARK) + 1, 0) in (b"", LOCK_MARK)
        try:
            if ours and fd is not None:
                os.pwrite(fd, LOCK_MARK, 0)  # may fail (a full disk): the file is still ours
            yield lock
        finally:
            if ours:
                lock.unlink()


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open on ``fd`` (not removed or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _flock_wait(fd: int, op: int, wait: float | None) -> bool:
    """``flock`` with a timeout, by polling non-blocking attempts with a growing delay."""
    deadline = None if wait is None else time.monotonic() + wait
    delay = _POLL_FIRST
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        time.sleep(delay if deadline is None else min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, _POLL_MAX)
