"""Local files: one descriptor per process, read with ``os.pread``; stat with ``os.stat``.

Reads go through fsspec only for remote files; a local path or ``file://`` URL is read here,
with the same errors a remote read raises (:class:`~wids.errors.ShardNotFoundError`,
:class:`~wids.errors.PermanentRemoteError`, :class:`~wids.errors.ShortReadError`).
"""

from __future__ import annotations

import errno
import os
import re
import stat as stat_mod
from typing import Any

from ..errors import PermanentRemoteError, ShardNotFoundError, ShortReadError
from .stats import FileStat, IOStats

__all__ = ["LocalFile", "no_such_file", "windows_style"]


# A Windows path read on a system whose separator is "/": a backslash, or a drive ("C:/")
_WINDOWS = re.compile(r"\\|(?:^|/)[A-Za-z]:/")
# "s3:/bucket/x" or "https:/host/x", made absolute ("/cwd/s3:/bucket/x"): a URL typed wrong
_SCHEME_ONE_SLASH = re.compile(r"(?:^|/)[A-Za-z][A-Za-z0-9+.-]+:/(?!/)")


def windows_style(path: str) -> bool:
    """Whether ``path`` is written as on Windows, on a system whose separator is ``/``."""
    return os.sep == "/" and _WINDOWS.search(path) is not None


def no_such_file(path: str) -> str:
    """Say "no such file", and why: an unexpanded wildcard, a Windows path, a mistyped URL."""
    if any(c in path for c in "*?["):
        return (
            "no such file (a wildcard like * expands only in a list of shards, as given to "
            "wids index create or ShardListDataset; not in an index or a shard named by one)"
        )
    if windows_style(path):
        return (
            "no such file (a Windows-style path: here folders are separated by '/' and there "
            "are no drive letters; give the path as this system names the file)"
        )
    if _SCHEME_ONE_SLASH.search(path):
        return (
            "no such file (it looks like a URL missing a slash after its scheme, such as "
            "s3:/bucket/x: write s3://bucket/x)"
        )
    return "no such file" + _nearby(path)


_LISTED = 4096  # names of a folder compared with a missing file's (a bound on the work)


def _nearby(path: str) -> str:
    """What is there instead of a missing ``path``: its folder is missing, or a close name."""
    import difflib
    import itertools

    folder, name = os.path.split(path)
    if folder and not os.path.isdir(folder):
        return f" (nor its folder {folder})"
    try:
        with os.scandir(folder or ".") as entries:
            names = [e.name for e in itertools.islice(entries, _LISTED)]
    except OSError:
        return ""
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if len(close) == 1 else ""  # one, or it is a guess


class LocalFile:
    """One local file; its descriptor is opened lazily in each process and dropped when pickled.

    Args:
        path: The absolute path.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "fd": None, "pid": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def close(self) -> None:
        """Close the descriptor, if this process opened one."""
        fd, self.fd = self.fd, None
        if fd is not None and self.pid == os.getpid():
            os.close(fd)

    def _local_fd(self) -> int:
        pid = os.getpid()
        if self.fd is None or self.pid != pid:
            try:
                fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                raise ShardNotFoundError(no_such_file(self.path), shard=self.path) from None
            except PermissionError as exc:
                raise PermanentRemoteError(str(exc), shard=self.path) from None
            if self.fd is not None and self.pid == pid:  # another thread was quicker
                os.close(fd)
                return self.fd
            self.fd, self.pid = fd, pid  # (a parent's descriptor is the parent's to close)
        return self.fd

    def _pread(self, start: int, end: int) -> bytes:
        n = end - start
        try:
            fd = self._local_fd()
        except OSError as exc:
            if exc.errno != errno.EMFILE:
                raise
            with open(self.path, "rb") as f:  # out of descriptors: don't keep one
                f.seek(start)
                data = f.read(n)
        else:
            try:
                data = os.pread(fd, n, start)
            except IsADirectoryError:  # os.open() opens a directory; reading it fails
                raise ShardNotFoundError(
                    f"is a directory, not a file (to read the shards in it, name them, as in "
                    f"'{self.path.rstrip('/')}/*.tar', or give their index)",
                    shard=self.path,
                ) from None
            while 0 < len(data) < n:
                more = os.pread(fd, n - len(data), start + len(data))
                if not more:
                    break
                data += more
        if len(data) != n:
            raise ShortReadError(
                f"range {start}-{end}: file has only {len(data)} of {n} bytes there",
                shard=self.path,
            )
        return data

    def read(self, start: int, end: int, stats: IOStats | None) -> bytes:
        """Bytes ``[start, end)``, exactly (one request in ``stats``)."""
        if stats is not None:
            stats.requests += 1
        try:
            data = self._pread(start, end)
        except Exception:
            if stats is not None:
                stats.errors += 1
            raise
        if stats is not None:
            stats.bytes_read += len(data)
        return data

    def stat(self, stats: IOStats | None) -> FileStat:
        """Size and mtime (one request in ``stats``)."""
        if stats is not None:
            stats.requests += 1
        try:
            st = os.stat(self.path)
            if stat_mod.S_ISDIR(st.st_mode):
                raise FileNotFoundError(errno.EISDIR, "is a directory")
        except (FileNotFoundError, PermissionError) as exc:
            if stats is not None:
                stats.errors += 1
            if isinstance(exc, FileNotFoundError) and exc.errno == errno.ENOENT:
                raise ShardNotFoundError(no_such_file(self.path), shard=self.path) from None
            cls = ShardNotFoundError if isinstance(exc, FileNotFoundError) else PermanentRemoteError
            raise cls(str(exc.strerror or exc), shard=self.path) from None
        return FileStat(size=st.st_size, etag=None, mtime=st.st_mtime)
