"""The cache's byte budget: a bound at every moment, not a target.

What the budget limits: the recorded entries' data files in ``data/`` plus the downloads in
flight (each announced with its size, see below). The rule, kept under ``.evict.lock`` by
every process sharing the directory:

- **Before a download** the fetcher evicts least-recently-used entries until the entries,
  the other downloads in flight and this one fit in ``max_bytes``, and announces its size (it
  writes it into the entry's lock file, which it holds exclusively while fetching; an
  announcement whose lock is free is stale: its process died, and it counts for nothing).
- **Publishing** (the record, then the data file's rename) happens under the same lock,
  after evicting again, so the directory never holds more than the budget.
- When every entry has been evicted and the downloads other processes have in flight still
  leave no room, the download goes ahead anyway: the directory then holds at most
  ``max_bytes`` plus one shard per process downloading at that moment (a
  :class:`~wids.cache.shards.ShardCache` downloads one shard at a time).

Eviction unlinks: an entry open for reading anywhere is removed like any other (its readers
keep reading their open descriptor, whose data lives until they close it), so open readers
never hold the directory above its budget. Nothing needs to run at exit: a process killed
at any point leaves the directory within budget (a killed download's temporary file, counted
as in flight before, is removed by the next eviction or ``wids cache clean``).

Only entries wids recorded are removed (:class:`~wids.cache.entries.EntryFiles`); files of
anyone else in ``data/`` are neither counted against the budget nor deleted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Iterator

from ..errors import CacheBudgetError, LockTimeoutError
from ..lock import FileLock
from ..storage import redact_url
from . import layout as cachedir
from .entries import EntryFiles, listdir, regular_size

__all__ = [
    "announce",
    "check_fits",
    "clean",
    "evict_quietly",
    "evict_to",
    "in_flight",
    "make_room",
    "room_locked",
]

log = logging.getLogger(__name__)


def check_fits(url: str, size: int, max_bytes: int | None) -> None:
    """Raise :class:`CacheBudgetError` if a shard of ``size`` bytes exceeds the whole budget."""
    if max_bytes is not None and size > max_bytes:
        raise CacheBudgetError(
            f"shard is {size} bytes, larger than the cache budget of {max_bytes} bytes",
            shard=redact_url(url),
        )


@contextlib.contextmanager
def room_locked(files: EntryFiles, lock_timeout: float) -> Iterator[None]:
    """Hold ``.evict.lock``: the budget's bookkeeping of every process is serialised by it."""
    with FileLock(os.path.join(files.cache_dir, ".evict.lock"), timeout=lock_timeout):
        yield


def in_flight(files: EntryFiles, exclude: str | None = None) -> int:
    """Bytes of the downloads announced and still in flight (but ``exclude``'s)."""
    total = 0
    try:
        it = os.scandir(os.path.join(files.cache_dir, "locks"))
    except FileNotFoundError:
        return 0
    with it:
        for entry in it:  # one stat per lock file; only a non-empty one is opened
            name = entry.name
            if name.startswith(".") or not name.endswith(".lock"):
                continue
            if name[: -len(".lock")] == exclude:
                continue
            try:
                if entry.stat(follow_symlinks=False).st_size == 0:
                    continue  # no download announced (announcing holds .evict.lock, as we do)
            except OSError:
                continue
            total += _announced(entry.path)
    return total


def _announced(path: str) -> int:
    """The size announced in a lock file whose fetcher holds it, else 0."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        if os.fstat(fd).st_size == 0:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return 0
            text = os.pread(fd, 32, 0)  # held exclusively: a fetch in flight
            return int(text) if text.strip().isdigit() else 0
        return 0  # nobody fetches: a stale announcement
    finally:
        os.close(fd)  # drops the shared lock taken above, if any


def announce(files: EntryFiles, key: str, size: int | None) -> None:
    """Write (``size``) or clear (``None``) the download in flight of ``key``.

    The caller holds ``key``'s lock exclusively.
    """
    fd = os.open(files.lockfile(key), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, 0)
        if size:
            os.pwrite(fd, str(int(size)).encode(), 0)
    finally:
        os.close(fd)


def make_room(
    files: EntryFiles,
    size: int,
    url: str,
    max_bytes: int,
    keep: bool,
    own: str | None = None,
) -> list[str]:
    """With ``.evict.lock`` held: evict until ``size`` more bytes fit beside what is there.

    What is there: the entries and the downloads in flight of other processes (``own``: the
    entry being fetched, not counted). If even an empty directory leaves no room beside
    those downloads, every entry is evicted and the caller goes ahead (the documented
    allowance).

    Returns:
        The keys evicted.

    Raises:
        CacheBudgetError: With ``keep``, the entry would take the cache over ``max_bytes``.
    """
    others = in_flight(files, own)
    if keep:
        total = sum(files.sizes().values()) + others
        if total + size > max_bytes:
            raise CacheBudgetError(
                f"cache holds {total} bytes, adding {size} exceeds the budget of "
                f"{max_bytes} bytes and keep=True forbids eviction",
                shard=redact_url(url),
            )
        return []
    return _evict_unlocked(files, max(0, max_bytes - size - others))


def _evict_unlocked(files: EntryFiles, max_bytes: int) -> list[str]:
    """Unlink least-recently-used entries until at most ``max_bytes`` remain (lock held)."""
    sizes = files.sizes()
    total = sum(sizes.values())
    removed: list[str] = []
    if total <= max_bytes:
        return removed
    for entry in files.entries():
        if total <= max_bytes:
            break
        key = entry.key  # free: removed with its lock file; open: unlinked under its readers
        if key in sizes and (files.remove_if_free(key) or files.unlink_entry(key)):
            removed.append(key)
            total -= sizes[key]
    if removed:
        log.info("cache: evicted %s from %s", ", ".join(removed), files.cache_dir)
    return removed


def evict_to(files: EntryFiles, max_bytes: int, lock_timeout: float) -> list[str]:
    """Evict least-recently-used entries until they and the downloads in flight fit.

    Open entries are evicted too (unlinked: their readers keep reading). Only recorded
    entries are candidates.

    Returns:
        The keys removed.
    """
    with room_locked(files, lock_timeout):
        return _evict_unlocked(files, max(0, max_bytes - in_flight(files)))


def evict_quietly(files: EntryFiles, max_bytes: int, lock_timeout: float) -> None:
    """:func:`evict_to`, logging instead of raising: a failed eviction must not fail a read."""
    try:
        evict_to(files, max_bytes, lock_timeout)
    except (OSError, LockTimeoutError) as e:
        log.warning("cache eviction in %s failed: %s", files.cache_dir, e)


def clean(
    files: EntryFiles, older_than: float | None, max_bytes: int | None, lock_timeout: float
) -> list[str]:
    """Remove entries not used for ``older_than`` seconds, then evict to ``max_bytes``.

    With neither given, removes every entry (open ones are unlinked: their readers keep
    reading). Always removes records whose
    data is gone, abandoned downloads, and temporary files of wids' own naming.

    Returns:
        The keys of the entries removed.
    """
    removed: list[str] = []
    cutoff = None if older_than is None else time.time() - older_than
    for key, rec in files.records():
        has_data = regular_size(files.data(key)) is not None
        if not has_data:
            files.remove_if_free(key)  # a record whose data is gone
        elif older_than is not None or max_bytes is None:
            if cutoff is None or float(rec.get("last_access", 0)) < cutoff:
                if files.remove_if_free(key) or _unlink(files, key, lock_timeout):
                    removed.append(key)
    if max_bytes is not None:
        removed += evict_to(files, max_bytes, lock_timeout)
    remove_stale_downloads(files)
    _remove_orphan_locks(files)
    cachedir.remove_own_temps(files.cache_dir, "meta")
    cachedir.remove_own_temps(files.cache_dir)
    return removed


def _remove_orphan_locks(files: EntryFiles) -> None:
    """Remove the free lock files of entries never recorded (a download that failed)."""
    recorded = {key for key, _ in files.records()}
    for name in listdir(os.path.join(files.cache_dir, "locks")):
        key = name[: -len(".lock")]
        if name.endswith(".lock") and not name.startswith(".") and key not in recorded:
            files.remove_if_free(key)  # unlinks only a lock with neither record nor data


def _unlink(files: EntryFiles, key: str, lock_timeout: float) -> bool:
    with room_locked(files, lock_timeout):
        return files.unlink_entry(key)


def remove_stale_downloads(files: EntryFiles) -> None:
    """Remove temporary downloads whose entry nobody is fetching (a killed process's)."""
    names = listdir(os.path.join(files.cache_dir, "tmp"), hidden=True)
    for key in {n[1:].rsplit(".", 2)[0] for n in names if cachedir.is_own_temp(n)}:
        lock = FileLock(files.lockfile(key))
        if lock.acquire(blocking=False):  # nobody is fetching this entry
            try:
                for name in names:
                    if cachedir.is_own_temp(name, (key,)):
                        cachedir.unlink_in(files.cache_dir, "tmp", name)
            finally:
                lock.release()
