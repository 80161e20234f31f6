"""Long shuffled chunk sequences that a rank enters in the middle without replaying them.

The reference shuffles every chunk with one random stream, so reaching position ``p`` of an
epoch means running every shuffle before it: with ``partition="global"`` or ``mix``, the last
of ``R`` ranks would generate ``(R - 1) / R`` of all indices before its first one. Over more
than :data:`~.chunks._BIG` indices these partitions key each chunk's shuffle by its position
in the chunk order instead, so a rank finds its slice by adding chunk sizes (numpy, a block of
chunks at a time) and generates only its own chunks. Orders up to ``_BIG`` indices are the
reference's, unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, cast

from .chunks import _PIECE, Range, _chunk_pieces, _order

__all__: list[str] = []


class _Gap:
    """Stands for ``size`` indices that precede this rank's slice and are never generated."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def _block(order: Any, start: int, stop: int) -> Any:
    """Chunk numbers at positions ``start .. stop - 1`` of the order (``None``: unshuffled)."""
    import numpy as np

    if order is None:
        return np.arange(start, stop, dtype=np.int64)
    if isinstance(order, list):
        return np.asarray(order[start:stop], dtype=np.int64)
    return order.array(start, stop).astype(np.int64)


def _walk(ranges: Any, order: Any, limit: int) -> tuple[int, int]:
    """How many chunks, in order, end at or before position ``limit``, and where they end."""
    import numpy as np

    count = position = 0
    while count < len(ranges):
        stop = min(count + _PIECE, len(ranges))
        ends = position + np.cumsum(ranges.sizes(_block(order, count, stop)))
        inside = int(np.searchsorted(ends, limit, "right"))
        if inside < len(ends):
            return count + inside, (int(ends[inside - 1]) if inside else position)
        count, position = stop, int(ends[-1])
    return count, position


def _start(ranges: Any, order: Any, count: int) -> int:
    """Where chunk number ``count`` of the order starts (``count`` is small: the kept ones)."""
    return sum(int(ranges.sizes(_block(order, s, min(s + _PIECE, count))).sum())
               for s in range(0, count, _PIECE))  # fmt: skip


def _keyed_pieces(
    ranges: Sequence[Range], rng: random.Random, reorder: bool, shuffle: bool, skip: int, keep: int
) -> Iterator[list[int]]:
    """The chunk sequence's pieces, each chunk shuffled by a key drawn for its position.

    The first chunks covering ``keep`` indices (a padded rank's wrap-around) and every chunk
    that does not end before ``skip`` are generated; the chunks between them are one
    :class:`_Gap` of their total size. ``ranges`` must have ``sizes`` (``_Runs``, ``_Chunks``).
    """
    order: Any = _order(len(ranges), rng, lazy=True) if reorder else None
    base = rng.getrandbits(64)

    def pieces(p: int) -> Iterator[list[int]]:
        if order is None:
            i = p
        else:
            i = order[p] if isinstance(order, list) else order.block(p, p + 1)[0]
        a, b = ranges[i]
        return _chunk_pieces(a, b, random.Random((base << 64) | p), shuffle, lazy=True)

    kept = min(len(ranges), _walk(ranges, order, keep - 1)[0] + 1) if keep > 0 else 0
    first, first_start = _walk(ranges, order, skip)
    if kept >= first:  # nothing to leave out
        kept = first = 0
    for p in range(kept):
        yield from pieces(p)
    if kept < first:
        yield cast(list[int], _Gap(first_start - _start(ranges, order, kept)))
    for p in range(first, len(ranges)):
        yield from pieces(p)
