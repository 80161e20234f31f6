"""Where a subset goes: the names it writes, the checks before writing, and undo on failure.

Every path a subset writes is decided (:func:`plan_paths`) and checked (:func:`check_destination`)
before anything is written; files are then published through one :class:`Run`, which never
replaces a file it did not create (unless ``force``) and removes what it created if the
subset fails.

Staging directories (``.wids-subset-*``) hold an ``flock`` on a lock file inside for as long as
their run lives; a run removes those of killed runs (lock free) in the directories it stages
in, so a SIGKILLed subset leaves nothing behind once another one has run there. Copies are
named after the shard's basename, or, when names clash or a basename is longer than
:data:`MAX_NAME` bytes (S3 keys may be 1,024), after :func:`~wids.storage.url_name`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from ..atomic import fsync_dir
from ..errors import OutputExistsError, writing
from ..storage import redact_url, url_name

__all__ = ["MAX_NAME", "Plan", "Run", "check_destination", "local_names", "plan_paths"]

MAX_NAME = 120
"""Longest copy name kept from a basename, in bytes (file systems allow 255; staged copies and
member sidecars add a prefix)."""
STAGING_PREFIX = ".wids-subset-"
_STAGING_LOCK = ".lock"


def local_names(urls: list[str]) -> list[str]:
    """File names for the copies: the basename, made unique with a hash where they clash."""
    bases = [u.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "shard.tar" for u in urls]
    bases = ["".join(c if c.isalnum() or c in "-_." else "_" for c in b).lstrip(".") for b in bases]
    seen: dict[str, int] = {}
    for b in bases:
        seen[b] = seen.get(b, 0) + 1
    out = []
    for u, b in zip(urls, bases, strict=True):
        if seen[b] > 1 or len(b.encode("utf-8", "surrogateescape")) > MAX_NAME:
            b = url_name(u)
        out.append(b or "shard.tar")
    return out


@dataclass(frozen=True, slots=True)
class Plan:
    """Every path a subset writes, decided before anything is written."""

    out_dir: str
    index: str
    members_dir: str
    shards: list[str]
    sidecars: list[str]

    def paths(self) -> list[str]:
        """Every file the subset writes."""
        return [self.index, *self.shards, *self.sidecars]


def plan_paths(out_dir: str, index: str, names: list[str], tables: list[Any]) -> Plan:
    """The paths of the subset's index, member tables and shard copies ``names`` in ``out_dir``.

    The index keeps the source's format (``train.widx`` -> ``train.widx``, SQLite -> SQLite);
    a source of any other name gives a JSON index.
    """
    from ..index import is_sqlite_name, is_table_name, members_dir, sidecar_name

    base = os.path.basename(redact_url(index).split("?", 1)[0].rstrip("/")) or "index"
    stem = base.rsplit(".", 1)[0] if "." in base.lstrip(".") else base
    keep = is_sqlite_name(base) or is_table_name(base)
    suffix = base[len(stem) :] if keep else ".json"
    out = os.path.join(out_dir, f"{stem}{suffix}")
    sidecar_dir = members_dir(out)
    sidecars = [
        os.path.join(sidecar_dir, sidecar_name(n))
        for n, t in zip(names, tables, strict=True)
        if t is not None and suffix == ".json"  # other formats hold their tables in one file
    ]
    return Plan(out_dir, out, sidecar_dir, [os.path.join(out_dir, n) for n in names], sidecars)


def check_destination(plan: Plan, index: str, shard_urls: list[str], force: bool) -> None:
    """Refuse a destination that holds the source or, without ``force``, files of our names."""
    from ..index import members_dir
    from ..storage import is_local, local_file

    real = os.path.realpath
    source = {real(local_file(u)) for u in shard_urls if is_local(u)}
    source_dirs = set()
    if is_local(index):
        src_index = real(local_file(index))
        source.add(src_index)
        source_dirs.add(real(members_dir(src_index)))
        if real(plan.out_dir) == os.path.dirname(src_index) and not force:
            raise OutputExistsError(
                f"{plan.out_dir} is the source index's own directory; give --to a new or empty "
                "directory (or force=True / --force to write beside the source)"
            )
    if real(plan.members_dir) in source_dirs:
        raise OutputExistsError(f"{plan.members_dir} holds the source index's member tables")
    for path in plan.paths():
        if real(path) in source:
            raise OutputExistsError(
                f"{path} is part of the source dataset and is never replaced; choose another --to"
            )
    existing = [p for p in plan.paths() if os.path.lexists(p)]
    if existing and not force:
        shown = ", ".join(os.path.relpath(p, plan.out_dir) for p in existing[:3])
        more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        raise OutputExistsError(
            f"{plan.out_dir} already holds {shown}{more}, which the subset would write; "
            "nothing was changed (force=True / --force replaces files of these names only)"
        )


class Run:
    """What one :func:`make_subset` call created, so that a failure leaves the directory as it was.

    Files are published with :meth:`place`: without ``force`` never onto an existing name (a hard
    link fails if the name exists, so even a file appearing meanwhile is not replaced); with
    ``force`` by ``os.replace``. On failure, files this run added (not those it replaced), its
    staging directory and the directories it created (if empty) are removed; nothing else.
    """

    def __init__(self, force: bool) -> None:
        self.force = force
        self._lock = threading.Lock()
        self._added: list[tuple[str, int]] = []
        self._dirs: list[str] = []
        self._staging: list[str] = []
        self._held: list[int] = []  # descriptors holding each staging directory's lock

    def makedirs(self, path: str) -> None:
        """``os.makedirs``, remembering the directories created (removed by :meth:`undo`)."""
        missing = []
        p = path
        while not os.path.isdir(p):
            missing.append(p)
            p = os.path.dirname(p)
        with writing(path):  # a read-only parent: WritePermissionError naming it
            os.makedirs(path, exist_ok=True)
        with self._lock:
            self._dirs.extend(reversed(missing))

    def staging(self, parent: str) -> str:
        """A new staging directory in ``parent``, removed at the end of the run.

        Those of killed runs in ``parent`` (their lock free) are removed first.
        """
        remove_stale_staging(parent)
        with writing(parent):
            path = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent)
            fd = os.open(os.path.join(path, _STAGING_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        with self._lock:
            self._staging.append(path)
            self._held.append(fd)
        return path

    def _release(self) -> None:
        for path in self._staging:
            shutil.rmtree(path, ignore_errors=True)
        for fd in self._held:
            os.close(fd)
        self._staging, self._held = [], []

    def place(self, path: str, dest: str) -> None:
        """Move the finished file ``path`` (same filesystem) to ``dest``."""
        if self.force:
            existed = os.path.lexists(dest)
            os.replace(path, dest)
        else:
            existed = False
            try:
                os.link(path, dest)
            except FileExistsError:
                raise OutputExistsError(f"{dest} appeared while the subset was written") from None
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                if os.path.lexists(dest):  # no hard links here: check, then replace
                    raise OutputExistsError(f"{dest} appeared while the subset was written") from e
                os.replace(path, dest)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if not existed:
            with self._lock:
                self._added.append((dest, os.lstat(dest).st_ino))

    def finish(self) -> None:
        """Success: remove the staging directories, fsync the directories published into."""
        self._release()
        for d in {os.path.dirname(p) for p, _ in self._added}:
            fsync_dir(d)

    def undo(self) -> None:
        """Failure: remove what this run added and the directories it created (if empty)."""
        self._release()
        for path, ino in self._added:
            with contextlib.suppress(OSError):
                if os.lstat(path).st_ino == ino:
                    os.unlink(path)
        for d in reversed(self._dirs):
            with contextlib.suppress(OSError):
                os.rmdir(d)  # only if empty


def remove_stale_staging(parent: str, *, min_age: float = 60.0) -> list[str]:
    """Remove the staging directories of killed runs in ``parent``; returns those removed.

    A directory whose lock file is free belonged to a run that is gone. One without a lock
    file (a run killed between making it and locking it) is removed once older than
    ``min_age`` seconds.
    """
    import time

    removed: list[str] = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(STAGING_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(path, _STAGING_LOCK), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and time.time() - os.lstat(path).st_mtime > min_age:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live run
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed
