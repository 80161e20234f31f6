"""How a batch becomes requests through a pool's readers: the one plan of a batch's reads.

:func:`plan_reads` opens (or finds) the readers of the batch's shards, computes each sample's
byte span (512 bytes earlier where the reader verifies, for the first member's tar header),
merges them into blocks (:func:`~wids.dataset.readers.plan_batch`) and makes the header check
of each block. The pool reads a batch with it, and the lookahead
(:mod:`wids.dataset.lookahead`) plans a predicted batch with it, so that prefetched blocks are
the very blocks, with the very checks, of the direct read.

``pool`` is the dataset's :class:`~wids.dataset.pool.ReaderPool` (not imported: it imports
this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .readers import HEADER, Block, ShardReader, header_check, plan_batch

if TYPE_CHECKING:
    from ..storage import Check
    from .tables import MemberTable

__all__ = ["plan_reads"]

Located = Sequence[tuple[int, int, int]]


def plan_reads(
    pool: Any, located: Located, merge_gap: int, count: bool = True
) -> tuple[
    dict[int, ShardReader],
    dict[int, MemberTable],
    list[tuple[int, int, int, int]],
    list[Block],
    list[tuple[int, int]],
    list[Check | None] | None,
]:
    """Readers, tables, spans, merged blocks, where each sample is, and header checks.

    Args:
        pool: The reader pool.
        located: ``(global index, shard, index in shard)`` of each sample, in batch order.
        merge_gap: As for :func:`~wids.dataset.readers.plan_batch`.
        count: Count the shard look-ups in the pool's ``accesses`` (not for prefetches).
    """
    readers: dict[int, ShardReader] = {shard: pool.reader(shard, count) for _, shard, _ in located}
    tables: dict[int, MemberTable] = {shard: pool._tables[shard] for shard in readers}
    spans = []
    for _, shard, local in located:
        start, end = tables[shard].span(local)
        if readers[shard].verifies:  # the first member's tar header too, to check it
            start -= HEADER
        spans.append((shard, start, end, local))
    blocks, where = plan_batch(spans, merge_gap)
    checks = _header_checks(located, readers, tables, blocks, where)
    return readers, tables, spans, blocks, where, checks


def _header_checks(
    located: Located,
    readers: dict[int, ShardReader],
    tables: dict[int, MemberTable],
    blocks: Sequence[Block],
    where: list[tuple[int, int]],
) -> list[Check | None] | None:
    """Per block, a check of the first-member header of every sample it holds, if verified."""
    headers: dict[int, list[tuple[int, str, int]]] = {}
    for (_, shard, local), (b, offset) in zip(located, where, strict=True):
        if readers[shard].verifies:
            name, size = tables[shard].first_member(local)
            headers.setdefault(b, []).append((offset, name, size))
    if not headers:
        return None
    return [
        header_check(headers[b], blk.start) if b in headers else None
        for b, blk in enumerate(blocks)
    ]
