"""When a dataset's remote shards are fetched whole: evidence from the reads and from the plan.

:func:`requested` reports each range read to the pool's :class:`~wids.cache.Promoter`
(``access="auto"`` with a cache), which promotes a shard that draws most of the recent reads;
:func:`planned` reports what the sampler's plan says (:mod:`wids.dataset.lookahead`): a shard
of which a large share comes soon is fetched now (``access="auto"``), or its download for
``access="shard"`` starts before its first read.

``pool`` is the dataset's :class:`~wids.dataset.pool.ReaderPool` (not imported: it imports
this module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .readers import download_check

if TYPE_CHECKING:
    from .readers import ShardReader

__all__ = ["planned", "requested"]


def requested(pool: Any, shard: int, reader: ShardReader, nbytes: int) -> None:
    """``access="auto"``: count ``nbytes`` read by range from ``shard`` towards promotion."""
    if pool.access != "auto" or pool.local.cache_dir is None or reader.cached:
        return
    source = reader.source
    if source is None or source.is_local:
        return
    info = pool.catalog.load().infos[shard]
    members, data_end = pool.catalog.members(shard)
    pool.get_promoter().requested(
        source,
        nbytes,
        shard_bytes=info.size if info.size is not None else data_end,
        expected=info.fingerprint,
        stats=pool.catalog.store.stats,
        verify=download_check(members, info.url),
    )


def planned(pool: Any, shard: int, share: float) -> bool:
    """The plan reads ``share`` of the samples of ``shard`` soon: start its download early.

    Returns:
        Whether the shard is being fetched whole (its reads will come from the cache).
    """
    local = pool.local
    if local.cache_dir is None or local.offline or pool.access == "range":
        return False
    info = pool.catalog.load().infos[shard]
    source = pool.catalog.source(info.url, info)
    if source.is_local:
        return False
    members, data_end = pool.catalog.members(shard)
    stats = pool.catalog.store.stats
    verify = download_check(members, info.url)
    if pool.access == "shard":  # read whole anyway: start the download before the first read
        local.shard_cache().prefetch(source, expected=info.fingerprint, stats=stats, verify=verify)
        return True
    return bool(
        pool.get_promoter().planned(
            source,
            share,
            shard_bytes=info.size if info.size is not None else data_end,
            expected=info.fingerprint,
            stats=stats,
            verify=verify,
        )
    )
