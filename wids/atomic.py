"""Atomic publishing of files: readers see the old file or the whole new one, never a part.

Every writer of the shard cache and of index files publishes through this module.

Publishing (:func:`atomic_write`, :class:`TempFile`) writes to a temporary file in the
destination's directory, flushes and fsyncs it, then ``os.replace``-s it into place, so a
reader sees either the old file or the complete new one, never a part. A temporary file holds
an exclusive ``flock`` on itself while its writer lives, so :func:`remove_stale_temps` can
tell a file left by a killed writer (lock free) from one still being written.

Example:
    >>> with atomic_write("/tmp/x.json", "w") as f:          # doctest: +SKIP
    ...     f.write("{}")
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any

from .lock import same_file

__all__ = [
    "TEMP_SUFFIX",
    "TempFile",
    "atomic_write",
    "atomic_write_bytes",
    "fsync_dir",
    "remove_stale_temps",
]

TEMP_SUFFIX = ".tmp"
"""Suffix of every temporary file this module creates (``.<name>.<random>.tmp``)."""

_TEMP_NAME = re.compile(r"\.(?P<stem>.+)\.[0-9a-f]{12}" + re.escape(TEMP_SUFFIX))
"""The name :class:`TempFile` gives: ``.<stem>.<12 hex digits>.tmp``."""


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


def remove_stale_temps(
    directory: str | os.PathLike[str],
    *,
    min_age: float = 10.0,
    stems: re.Pattern[str] | None = None,
) -> list[str]:
    """Delete temporary files whose writer is gone (their lock is free).

    Only names :class:`TempFile` gives are candidates (``.<stem>.<12 hex digits>.tmp``), and
    with ``stems`` only those whose stem it matches whole: the directory may be the user's
    (a :class:`~wids.ShardWriter`'s output), where another program's ``.notes.tmp`` is not
    ours to delete.

    Args:
        directory: Directory to scan (not recursive).
        min_age: Leave files younger than this many seconds alone; covers the instant
            between creating a temporary file and locking it.
        stems: The destinations' names whose temporary files may be removed (all, if
            ``None``: a directory only wids writes).

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
        ours = _TEMP_NAME.fullmatch(name)
        if ours is None or (stems is not None and stems.fullmatch(ours["stem"]) is None):
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
        if not same_file(fd, path):
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)
