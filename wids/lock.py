"""File locks with timeouts, and atomic publishing of files.

Every writer of the shard cache and of index files goes through this module.

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
- **Deletable lock files.** After ``flock`` succeeds, the lock checks that its path still
  names the file it locked, and retries if not. So a holder of the exclusive lock may remove
  the lock file (:meth:`FileLock.unlink`); anyone blocked on the old file notices and starts
  over on a new one. Nobody else ever deletes a lock file. :func:`writer_lock` uses this to
  guard a user's output (an index) without leaving a ``*.lock`` file beside it.

Publishing (:func:`atomic_write`, :class:`TempFile`) writes to a temporary file in the
destination's directory, flushes and fsyncs it, then ``os.replace``-s it into place, so a
reader sees either the old file or the complete new one, never a part. A temporary file holds
an exclusive ``flock`` on itself while its writer lives, so :func:`remove_stale_temps` can
tell a file left by a killed writer (lock free) from one still being written.

Example:
    >>> with FileLock("/tmp/x.lock", timeout=5):           # doctest: +SKIP
    ...     with atomic_write("/tmp/x.json", "w") as f:
    ...         f.write("{}")
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any

from .errors import LockTimeoutError

__all__ = [
    "TEMP_SUFFIX",
    "FileLock",
    "TempFile",
    "atomic_write",
    "atomic_write_bytes",
    "fsync_dir",
    "remove_stale_temps",
    "writer_lock",
]

LOCK_MARK = b"wids writer lock\n"
"""Content of a lock file made by :func:`writer_lock`; only such (or empty) files are removed."""

TEMP_SUFFIX = ".tmp"
"""Suffix of every temporary file this module creates (``.<name>.<random>.tmp``)."""

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
            if ok and not _same_file(self._fd, self.path):
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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not _flock_wait(fd, op, left):
                    os.close(fd)
                    return None
                if _same_file(fd, self.path):
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
        if ours and fd is not None:
            os.pwrite(fd, LOCK_MARK, 0)
        try:
            yield lock
        finally:
            if ours:
                lock.unlink()


def _same_file(fd: int, path: str) -> bool:
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


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or unlink inside directory ``path`` durable (best effort)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class TempFile:
    """A temporary file beside a destination, locked by its writer until published or dropped.

    The file is created (exclusively, with the permissions the user's umask gives a new file,
    ``0o666 & ~umask``) in ``directory`` under the name
    ``.<stem>.<random>.tmp`` and holds an exclusive ``flock`` on itself for as long as this
    object is open, which marks it as live for :func:`remove_stale_temps`.

    Args:
        directory: Where to create it; must be on the same filesystem as the destination.
        stem: Readable part of the name (usually the destination's basename).

    Example:
        >>> with TempFile(cache_dir, "shard.tar") as tmp:   # doctest: +SKIP
        ...     download(tmp.path)
        ...     tmp.publish(os.path.join(cache_dir, "shard.tar"))
    """

    def __init__(self, directory: str | os.PathLike[str], stem: str) -> None:
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        name = f".{stem}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"
        self.path = os.path.join(self.directory, name)
        # 0o666 so the kernel applies the user's umask: an index or a cache entry published
        # from this file must be as readable as any file the user creates (not mkstemp's 0600).
        self.fd: int | None = os.open(
            self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666
        )
        # Fresh name, so nobody else can hold it; the lock marks the file as live.
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.published = False

    def publish(self, dest: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """Flush the file to disk and ``os.replace`` it onto ``dest``, then release it."""
        if self.fd is None:
            raise RuntimeError(f"{self.path}: already closed")
        if fsync:
            os.fsync(self.fd)
        os.replace(self.path, dest)
        self.published = True
        if fsync:
            fsync_dir(os.path.dirname(os.fspath(dest)) or ".")
        self.close()

    def close(self) -> None:
        """Remove the file unless it was published, and release its lock."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if not self.published:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> TempFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    mode: str = "wb",
    *,
    fsync: bool = True,
    encoding: str | None = None,
) -> Iterator[IO[Any]]:
    """Write a file so that readers see the old content or the whole new content, never a part.

    Args:
        path: The destination; its directory is created if needed.
        mode: ``"wb"`` or ``"w"``.
        fsync: Flush data and the directory entry to disk before returning (skip only for
            data that is cheap to lose, e.g. an access time).
        encoding: Text encoding for ``"w"`` (default UTF-8).

    Yields:
        A file object open on the temporary file. If the block raises, the temporary file is
        removed and the destination is untouched.

    Raises:
        ValueError: ``mode`` is not a write mode this function supports.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    dest = os.fspath(path)
    with TempFile(os.path.dirname(dest) or ".", os.path.basename(dest)) as tmp:
        if tmp.fd is None:
            raise RuntimeError(f"{dest}: temporary file is not open")
        with open(
            os.dup(tmp.fd), mode, encoding=(encoding or "utf-8") if mode == "w" else None
        ) as f:
            yield f
        tmp.publish(dest, fsync=fsync)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    with atomic_write(path, "wb", fsync=fsync) as f:
        f.write(data)


def remove_stale_temps(directory: str | os.PathLike[str], *, min_age: float = 10.0) -> list[str]:
    """Delete temporary files whose writer is gone (their lock is free).

    Args:
        directory: Directory to scan (not recursive).
        min_age: Leave files younger than this many seconds alone; covers the instant
            between creating a temporary file and locking it.

    Returns:
        The paths removed.
    """
    removed: list[str] = []
    directory = os.fspath(directory)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    now = time.time()
    for name in names:
        if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
            continue
        path = os.path.join(directory, name)
        if _remove_if_unlocked(path, now - min_age):
            removed.append(path)
    return removed


def _remove_if_unlocked(path: str, born_before: float) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_mtime > born_before:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live writer holds it
        if not _same_file(fd, path):
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)
