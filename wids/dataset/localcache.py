"""Where a dataset keeps data locally, and whether it may use the network.

The dataset's catalog (offline checks, scanning a cached copy offline, the scan and snapshot
caches in ``cache_dir``) and its reader pool (whole shards for ``access="shard"``, promotion
for ``access="auto"``) share one :class:`LocalCache`: the one owner of ``cache_dir``,
``cache_size``, ``keep`` and ``offline``. The ``ShardCache`` it hands out is made on first use
in each process: never pickled, made anew after a fork (the parent's background threads do not
exist in the child); :meth:`LocalCache.close` stops its threads.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import OfflineError
from ..storage import is_local, redact_url
from .rangesupport import RangeSupport

if TYPE_CHECKING:
    from ..cache import CachedShard, ShardCache
    from ..index import ContentMemo, Fingerprint
    from ..storage import IOStats, Source

__all__ = ["CacheThrashWarning", "LocalCache"]

logger = logging.getLogger(__name__)

_THRASH = 3  # downloads of a shard again too soon before this process warns


class CacheThrashWarning(UserWarning):
    """``access="shard"`` downloads shards again before their reads are done (once per process).

    The budget holds fewer shards than the order reads at once (a random order over a dataset
    larger than ``cache_size``): ``access="auto"`` reads by range there instead.
    """


class LocalCache:
    """A dataset's local cache settings and offline switch, and this process's ``ShardCache``.

    Args:
        cache_dir: The cache directory, or ``None`` for no cache.
        cache_size: Byte budget (``ShardCache(max_bytes=...)``), ``None`` for none.
        keep: Never evict automatically.
        offline: Never touch the network: serve only local files and what is cached.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None,
        *,
        cache_size: int | None = None,
        keep: bool = False,
        offline: bool = False,
    ) -> None:
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_size = cache_size
        self.keep = bool(keep)
        self.offline = bool(offline)
        self._cache: ShardCache | None = None
        self._pid = 0
        self._memo: ContentMemo | None = None
        self._warned = 0  # the process that warned of thrashing (CacheThrashWarning)
        self.ranges = RangeSupport()  # servers seen ignoring or honouring Range

    def shard_cache(self) -> ShardCache:
        """This process's ``ShardCache``, made on first use.

        Raises:
            RuntimeError: There is no ``cache_dir`` (callers check; a bug if reached).
        """
        cache = self._cache
        if cache is None or self._pid != os.getpid():
            from ..cache import ShardCache

            if self.cache_dir is None:
                raise RuntimeError("the shard cache needs cache_dir")
            cache = ShardCache(
                self.cache_dir, max_bytes=self.cache_size, keep=self.keep, offline=self.offline
            )
            cache.reader = False  # until this process reads through it (reading_cache)
            self._cache, self._pid = cache, os.getpid()
        return cache

    def reading_cache(self) -> ShardCache:
        """:meth:`shard_cache`, with this process marked a reader of it (before it counts).

        The budget's share per reader divides by the readers active at once: this process's
        DataLoader siblings are counted from the start, before they mark themselves.
        """
        from .lookahead import loader_workers

        cache = self.shard_cache()
        cache.min_readers = max(cache.min_readers, loader_workers())
        cache.reader = True
        cache.mark_reader()
        return cache

    def stop_reading(self) -> None:
        """This process no longer reads through the cache (until :meth:`reading_cache` again)."""
        if self._cache is not None and self._pid == os.getpid():
            self._cache.unmark_reader()

    def open_whole(
        self,
        source: Source,
        *,
        expected: Fingerprint,
        stats: IOStats,
        verify: Callable[[str], None],
    ) -> CachedShard:
        """``access="shard"``: ``source`` from the shard cache, downloaded first if needed.

        Warns once per process (:class:`CacheThrashWarning`) when its downloads fetch shards
        again soon after fetching them: the budget is too small for the order.
        """
        cache = self.shard_cache()
        shard = cache.open(source, expected=expected, stats=stats, verify=verify)
        again = cache.refetches.too_soon
        if again >= _THRASH and self._warned != os.getpid() and self.cache_size is not None:
            self._warned = os.getpid()
            warnings.warn(
                f"access='shard' downloaded {again} shards again soon after downloading them: "
                f"cache_size={self.cache_size} bytes holds about "
                f"{self.cache_size // max(1, shard.size)} shards of {shard.size} bytes, fewer "
                "than this order reads at once, so copies are evicted before their samples are "
                "read and fetched whole again. Use "
                "access='auto' (it reads by range then, moving no more bytes than "
                "access='range'), or a cache_size that holds the shards read at once",
                CacheThrashWarning,
                stacklevel=2,
            )
        return shard

    def contents(self, index: Any) -> ContentMemo:
        """MD5s of local shards read to tell a copy from a rewrite (``wids.index.contents``).

        Made on first use and kept, also in forked workers. Remembered across processes in
        ``cache_dir/digests/`` when there is a cache directory, else in the ``*.members/``
        directory of a local JSON ``index`` (which wids made), else in this process only.
        """
        if self._memo is None:
            from ..index import ContentMemo

            self._memo = ContentMemo(self._digests_dir(index))
        return self._memo

    def _digests_dir(self, index: Any) -> str | None:
        if self.cache_dir is not None:
            from ..cache import cache_subdir
            from ..errors import CacheDirError

            try:
                return cache_subdir(self.cache_dir, "digests")
            except (CacheDirError, OSError) as e:
                logger.warning("not keeping digests in %s: %s", self.cache_dir, e)
                return None
        from ..index import index_digests_dir

        return index_digests_dir(index)

    def close(self) -> None:
        """Stop this process's background fetches (the cache stays usable: they restart)."""
        if self._cache is not None and self._pid == os.getpid():
            self._cache.close()

    def check_online(self, url: str) -> None:
        """Raise ``OfflineError`` if ``url`` is remote and the dataset is offline."""
        if self.offline and not is_local(url):
            raise OfflineError("offline, and this is not a local file", shard=redact_url(url))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"], state["_pid"] = None, 0
        return state

    def __repr__(self) -> str:
        return f"LocalCache({self.cache_dir!r}, cache_size={self.cache_size!r}, keep={self.keep!r})"
