"""The cache directory itself: its mark, its layout, and the checks made before writing to it.

Four writers share one cache directory: the shard cache (:mod:`wids.cache.shards`: ``data/``,
``meta/``, ``locks/``, ``tmp/``), the scan-once member tables (:mod:`wids.cache.scans`:
``scans/``), offline index snapshots (:mod:`wids.cache.snapshots`: ``indexes/``) and the MD5s
of copied local shards (:mod:`wids.index.contents`: ``digests/``). Each goes through
:func:`open_cache_dir` (or :func:`cache_subdir`) first, which enforces:

- **A cache directory is marked.** wids creates it with ``wids-cache.json`` (format and layout
  version) and a ``CACHEDIR.TAG`` (so backup tools skip it). An existing empty directory is
  adopted (marked); a directory marked by an older wids (its ``CACHEDIR.TAG`` names wids) is
  adopted too. Any other non-empty directory is refused with :class:`CacheDirError`: wids
  never writes into, or deletes from, a directory it did not create.
- **No links inside.** A layout subdirectory that is a symbolic link (or not a directory) is
  refused, and deletions open their directory with ``O_NOFOLLOW`` (:func:`unlink_in`), so a
  link swapped in later is not followed either. The cache directory itself may be a link:
  that is the user's explicit choice.

The layout of ``cache_dir`` (created and marked on first use)::

    wids-cache.json                  the mark: this directory is a wids cache, layout version 1
    CACHEDIR.TAG                     backup tools skip the directory
    data/<key>                       a complete, verified shard
    meta/<key>.json                  its record: url (redacted), size, etag, md5, last access
    locks/<key>.lock                 the entry's flock (shared: open; exclusive: writing)
    tmp/.<key>.<random>.tmp          downloads in progress (or left by a killed process)
    .evict.lock                      serialises eviction
    indexes/<key>.json               offline copies of remote indexes (``wids.cache.snapshots``)
    indexes/<key>.widx(.json)        a remote shard table copied whole, and where it came from
    scans/<key>.json                 member tables of scanned shards (``wids.cache.scans``)
    digests/<key>.md5.json           MD5s of local shards read to tell a copy from a rewrite
                                     (``wids.index.contents``, for a dataset's catalog)

``<key>`` is :func:`wids.storage.url_name` of the URL (the one URL -> file name rule, also for
``scans/`` and ``indexes/``): 24 hex digits of the SHA-256 of the URL without credentials plus
its basename reduced to ``[A-Za-z0-9._-]``: two ``train-000000.tar`` from different buckets
never alias, and no URL can name a path outside ``cache_dir``. An entry's record also keeps the
full hash, so the key alone never decides identity.

Read-only callers (``wids cache ls``/``du``) use :func:`cache_state`, which never creates or
marks anything.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import time
from typing import Literal

from ..atomic import atomic_write
from ..errors import CacheDirError

__all__ = [
    "LAYOUT_VERSION",
    "MARKER",
    "SUBDIRS",
    "cache_state",
    "cache_subdir",
    "check_layout",
    "count_files",
    "is_own_temp",
    "open_cache_dir",
    "remove_own_temps",
    "unlink_in",
]

MARKER = "wids-cache.json"
"""The file that marks a directory as a wids cache and records its layout version."""

LAYOUT_VERSION = 1
SUBDIRS = ("data", "meta", "locks", "tmp", "scans", "indexes", "digests")
"""Every subdirectory of the layout (each created only by the writer that needs it)."""

_FORMAT = "wids-cache"
_TAG = "CACHEDIR.TAG"
_TAG_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
_TAG_TEXT = (
    f"{_TAG_SIGNATURE}\n"
    "# This file is a cache directory tag created by wids.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)
_TEMP_NAME = re.compile(r"\.(?P<stem>.+)\.[0-9a-f]{12}\.tmp")  # wids.atomic.TempFile's names
_TEMP_MIN_AGE = 10.0  # seconds; a younger temporary file may not be locked by its writer yet

State = Literal["missing", "empty", "unmarked", "marked"]


def cache_state(cache_dir: str | os.PathLike[str]) -> State:
    """What ``cache_dir`` is, without changing anything.

    Returns:
        ``"missing"`` (no such directory), ``"empty"`` (nothing in it that is not wids' own
        mark), ``"unmarked"`` (files, and no mark: not a wids cache) or ``"marked"``.

    Raises:
        CacheDirError: It is not a directory, or its mark is unreadable or from a newer wids.
    """
    root = os.path.abspath(os.fspath(cache_dir))
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:
        raise CacheDirError(f"{root} is not a directory; give a directory as the cache") from None
    if MARKER in names:
        _check_marker(root)
        return "marked"
    if _TAG in names and _tag_names_wids(os.path.join(root, _TAG)):
        return "marked"  # made by a wids from before the marker (same layout, version 1)
    if all(is_own_temp(n, (MARKER, _TAG)) for n in names):
        return "empty"
    return "unmarked"


def open_cache_dir(
    cache_dir: str | os.PathLike[str], *subdirs: str, create: bool = True
) -> str | None:
    """Check ``cache_dir`` before writing to it; create and mark it if new or empty.

    Args:
        cache_dir: The cache directory.
        subdirs: Layout subdirectories (from :data:`SUBDIRS`) to create if missing.
        create: Create a missing directory; ``False`` returns ``None`` for one instead.

    Returns:
        The absolute path of the cache directory, or ``None`` (missing, and not ``create``).

    Raises:
        CacheDirError: The directory holds files but no wids mark, its mark is from a newer
            wids, or a layout subdirectory is a symbolic link or not a directory.
    """
    root = os.path.abspath(os.fspath(cache_dir))
    state = cache_state(root)
    if state == "missing" and not create:
        return None
    if state == "unmarked":
        raise CacheDirError(
            f"{root} is not empty and not a wids cache (no {MARKER}); wids only writes to and "
            "deletes from directories it created: choose an empty or new cache directory"
        )
    if state != "marked" or not os.path.exists(os.path.join(root, MARKER)):
        _mark(root)
    check_layout(root)
    for sub in subdirs:
        if sub not in SUBDIRS:  # an internal error: every writer names its own subdirectory
            raise ValueError(f"{sub!r} is not a subdirectory of the cache layout {SUBDIRS}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.join(root, sub))
    check_layout(root)  # a link made between the two checks is caught here
    return root


def cache_subdir(cache_dir: str | os.PathLike[str], sub: str) -> str:
    """The path of layout subdirectory ``sub``, after :func:`open_cache_dir` made it safe."""
    root = open_cache_dir(cache_dir, sub)
    if root is None:  # create=True never returns None; kept under python -O
        raise RuntimeError("internal error: open_cache_dir returned None")
    return os.path.join(root, sub)


def check_layout(root: str, subdirs: tuple[str, ...] = SUBDIRS) -> None:
    """Refuse layout subdirectories of ``root`` that are symbolic links or not directories.

    Raises:
        CacheDirError: One is.
    """
    for sub in subdirs:
        path = os.path.join(root, sub)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise CacheDirError(
                f"{path} is a symbolic link; wids never follows links inside a cache directory: "
                "remove the link or choose another cache directory"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise CacheDirError(
                f"{path} is not a directory; the cache needs it for its own files: "
                "move it away or choose another cache directory"
            )


def unlink_in(root: str, sub: str, name: str) -> bool:
    """Remove ``root/sub/name`` without following a link at ``sub``; ``True`` if removed.

    Raises:
        CacheDirError: ``root/sub`` is a symbolic link (or not a directory).
    """
    fd = _open_subdir(root, sub)
    if fd is None:
        return False
    try:
        os.unlink(name, dir_fd=fd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def is_own_temp(name: str, stems: tuple[str, ...] | None = None) -> bool:
    """Whether ``name`` is a temporary file of wids' own naming (of one of ``stems``, if given)."""
    m = _TEMP_NAME.fullmatch(name)
    return m is not None and (stems is None or m.group("stem") in stems)


def remove_own_temps(root: str, sub: str | None = None) -> list[str]:
    """Remove temporary files of wids' naming whose writer is gone, in ``root`` or ``root/sub``.

    Only names :func:`is_own_temp` accepts are touched (in ``root`` itself: only the mark's);
    a file is removed only when older than a few seconds and no writer holds its lock.

    Returns:
        The names removed.
    """
    fd = _open_subdir(root, sub) if sub is not None else os.open(root, _DIR_FLAGS)
    if fd is None:
        return []
    removed = []
    stems = (MARKER, _TAG) if sub is None else None
    try:
        for name in os.listdir(fd):
            if is_own_temp(name, stems) and _remove_if_abandoned(fd, name):
                removed.append(name)
    finally:
        os.close(fd)
    return removed


def count_files(root: str, sub: str) -> tuple[int, int]:
    """``(files, bytes)`` of the regular files directly in ``root/sub`` (not hidden, not locks)."""
    n = total = 0
    path = os.path.join(root, sub)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(path):
            if entry.name.startswith(".") or entry.name.endswith(".lock"):
                continue
            with contextlib.suppress(FileNotFoundError):
                if entry.is_file(follow_symlinks=False):
                    n += 1
                    total += entry.stat(follow_symlinks=False).st_size
    return n, total


# -- helpers ---------------------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _open_subdir(root: str, sub: str) -> int | None:
    try:
        return os.open(os.path.join(root, sub), _DIR_FLAGS | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            check_layout(root, (sub,))  # raises the explanation
        raise


def _remove_if_abandoned(dir_fd: int, name: str) -> bool:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False  # gone, or a link: not a file of ours
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mtime > time.time() - _TEMP_MIN_AGE:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its writer is alive
        try:
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(name, dir_fd=dir_fd)
        return True
    finally:
        os.close(fd)


def _check_marker(root: str) -> None:
    path = os.path.join(root, MARKER)
    try:
        with open(path, encoding="utf-8") as f:
            mark = json.load(f)
    except (OSError, ValueError) as e:
        raise CacheDirError(f"{path} is unreadable ({e}); choose another cache directory") from e
    if not isinstance(mark, dict) or mark.get("format") != _FORMAT:
        raise CacheDirError(f"{path} is not a wids cache mark; choose another cache directory")
    version = mark.get("version")
    if version != LAYOUT_VERSION:
        raise CacheDirError(
            f"{root} is a wids cache of layout version {version!r}; this wids knows version "
            f"{LAYOUT_VERSION}: use a matching wids or another cache directory"
        )


def _tag_names_wids(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except OSError:
        return False
    return text.startswith(_TAG_SIGNATURE) and "created by wids" in text


def _mark(root: str) -> None:
    """Write the mark (first: it is what makes the directory ours) and the tag."""
    os.makedirs(root, exist_ok=True)
    mark = {"format": _FORMAT, "version": LAYOUT_VERSION}
    with atomic_write(os.path.join(root, MARKER), "w") as f:
        json.dump(mark, f)
        f.write("\n")
    if not os.path.exists(os.path.join(root, _TAG)):
        with atomic_write(os.path.join(root, _TAG), "w", fsync=False) as f:
            f.write(_TAG_TEXT)
