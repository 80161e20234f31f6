"""The cache's byte budget: least-recently-used eviction, cleaning, and the budget at exit.

Only entries wids recorded are ever removed (:class:`~wids.cache.entries.EntryFiles`), and
only when nobody holds them: eviction takes an entry's lock without blocking and skips it if
it is open (shared) or being fetched (exclusive) anywhere. The functions here assume the
directory was checked (:func:`wids.cache.layout.open_cache_dir`); :class:`ShardCache` calls
them.

Ownership: wids refuses a non-empty directory it did not mark and layout subdirectories that
are symbolic links (:mod:`wids.cache.layout`). Clean and eviction delete only entries that have a
record in ``meta/``, and a download's record is written before its data is published, so every
data file wids makes is recorded; files of anyone else in ``data/`` are neither counted against
the budget nor deleted, and only temporary files of wids' own naming are removed.

Eviction is least-recently-used by the record's ``last_access``. While more shards are open
than the budget holds, the cache exceeds it; the budget is restored as they are closed, when a
process exits with shards still open (a finalizer), and, for processes that ended without
running it (killed, or a DataLoader worker's ``os._exit``), by the next process that uses the
cache with a budget.
"""

from __future__ import annotations

import logging
import os
import time
import weakref

from ..errors import CacheBudgetError, LockTimeoutError
from ..lock import FileLock
from ..storage import redact_url
from . import layout as cachedir
from .entries import ENTRY_SUBDIRS, EntryFiles, listdir, regular_size
from .handle import CachedShard

__all__ = ["check_fits", "clean", "evict_quietly", "evict_to", "make_room", "restore_budget"]

log = logging.getLogger(__name__)


def check_fits(url: str, size: int, max_bytes: int | None) -> None:
    """Raise :class:`CacheBudgetError` if a shard of ``size`` bytes exceeds the whole budget."""
    if max_bytes is not None and size > max_bytes:
        raise CacheBudgetError(
            f"shard is {size} bytes, larger than the cache budget of {max_bytes} bytes",
            shard=redact_url(url),
        )


def evict_to(files: EntryFiles, max_bytes: int, lock_timeout: float) -> list[str]:
    """Remove least-recently-used entries nobody has open until at most ``max_bytes`` remain.

    Only recorded entries are candidates; eviction is serialised by ``.evict.lock``.

    Returns:
        The keys removed.
    """
    removed: list[str] = []
    evict_lock = FileLock(os.path.join(files.cache_dir, ".evict.lock"), timeout=lock_timeout)
    with evict_lock:
        sizes = files.sizes()
        total = sum(sizes.values())
        if total <= max_bytes:
            return removed
        for entry in files.entries():
            if total <= max_bytes:
                break
            if entry.key in sizes and files.remove_if_free(entry.key):
                removed.append(entry.key)
                total -= sizes[entry.key]
    if removed:
        log.info("cache: evicted %d entries from %s", len(removed), files.cache_dir)
    return removed


def evict_quietly(files: EntryFiles, max_bytes: int, lock_timeout: float) -> None:
    """:func:`evict_to`, logging instead of raising: a failed eviction must not fail a read."""
    try:
        evict_to(files, max_bytes, lock_timeout)
    except (OSError, LockTimeoutError) as e:
        log.warning("cache eviction in %s failed: %s", files.cache_dir, e)


def make_room(
    files: EntryFiles, size: int, url: str, max_bytes: int, keep: bool, lock_timeout: float
) -> None:
    """Make room for ``size`` more bytes before a download (``keep``: only check it fits).

    Raises:
        CacheBudgetError: With ``keep``, the entry would take the cache over ``max_bytes``.
    """
    if keep:
        total = sum(files.sizes().values())
        if total + size > max_bytes:
            raise CacheBudgetError(
                f"cache holds {total} bytes, adding {size} exceeds the budget of "
                f"{max_bytes} bytes and keep=True forbids eviction",
                shard=redact_url(url),
            )
        return
    evict_to(files, max_bytes - size, lock_timeout)


def clean(
    files: EntryFiles, older_than: float | None, max_bytes: int | None, lock_timeout: float
) -> list[str]:
    """Remove entries not used for ``older_than`` seconds, then evict to ``max_bytes``.

    With neither given, removes every entry nobody has open. Always removes records whose
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
                if files.remove_if_free(key):
                    removed.append(key)
    if max_bytes is not None:
        removed += evict_to(files, max_bytes, lock_timeout)
    _remove_stale_downloads(files)
    cachedir.remove_own_temps(files.cache_dir, "meta")
    cachedir.remove_own_temps(files.cache_dir)
    return removed


def _remove_stale_downloads(files: EntryFiles) -> None:
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


def restore_budget(shards: weakref.WeakSet[CachedShard], cache_dir: str, max_bytes: int) -> None:
    """At exit: release the shards this process still holds, then evict down to the budget.

    Their files stay open and readable (an unlinked file's data lives while it is open), so a
    thread still reading during shutdown reads the right bytes.
    """
    released = sum(shard.release_at_exit() for shard in list(shards))
    if released:
        try:
            if cachedir.open_cache_dir(cache_dir, *ENTRY_SUBDIRS, create=False) is not None:
                evict_to(EntryFiles(cache_dir), max_bytes, lock_timeout=10.0)
        except (OSError, LockTimeoutError) as e:
            log.warning("cache eviction in %s at exit failed: %s", cache_dir, e)
