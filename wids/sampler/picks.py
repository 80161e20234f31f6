"""Mixing's remainder: randomly chosen chunks of a component, held as positions in an order."""

from __future__ import annotations

import operator
import random
from collections.abc import Iterable, Iterator
from typing import Any

from .chunks import _PIECE, Range, _order, _Ranges, _Runs

__all__: list[str] = []


class _Picked(_Ranges):
    """The first chunks of a shuffled order whose sizes add up to ``rest``, the last cut short.

    What ``random.shuffle(chunks)`` then taking chunks until ``rest`` indices are covered gives,
    without a list of the chosen chunks: positions are looked up in the order on demand.
    """

    __slots__ = ("_array", "_chunks", "_count", "_last", "_order")

    def __init__(self, chunks: _Runs, order: Any, count: int, last: int) -> None:
        self._chunks, self._order, self._count, self._last = chunks, order, count, last
        self._array: Any = None

    def __len__(self) -> int:
        return self._count

    def _chunk(self, j: int, i: int) -> Range:
        lo, hi = self._chunks[i]
        return (lo, lo + self._last) if j == self._count - 1 else (lo, hi)

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        j = operator.index(j)
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError("chunk index out of range")
        order = self._order
        return self._chunk(j, order[j] if isinstance(order, list) else order.block(j, j + 1)[0])

    def sizes(self, picks: Any) -> Any:
        """The number of indices in each chunk of the int64 array ``picks``."""
        import numpy as np

        order = self._order
        if isinstance(order, list):  # at most _BIG entries, converted once
            if self._array is None:
                self._array = np.asarray(order, dtype=np.int64)
            chunks = self._array[picks]
        else:
            chunks = order.at(picks).astype(np.int64)
        return np.where(picks == self._count - 1, self._last, self._chunks.sizes(chunks))

    def __iter__(self) -> Iterator[Range]:
        for j, i in zip(range(self._count), self._order):  # noqa: B905 - the first count
            yield self._chunk(j, i)


def _picked(chunks: _Runs, rng: random.Random, rest: int, lazy: bool = False) -> _Picked:
    """Chunks of ``chunks`` in a random order (``_order``) until ``rest`` indices are covered."""
    import numpy as np

    order: Any = _order(len(chunks), rng, lazy)
    count = last = 0
    if isinstance(order, list):
        blocks: Iterable[Any] = (order[s : s + _PIECE] for s in range(0, len(order), _PIECE))
    else:
        blocks = (order.array(s, min(s + _PIECE, order.n)) for s in range(0, order.n, _PIECE))
    for block in blocks:
        if rest <= 0:
            break
        sizes = chunks.sizes(np.asarray(block, dtype=np.int64))
        covered = np.cumsum(sizes)
        if covered[-1] < rest:
            count, rest = count + len(block), rest - int(covered[-1])
            continue
        k = int(np.searchsorted(covered, rest))  # the chunk that completes ``rest``
        last = rest - (int(covered[k - 1]) if k else 0)
        count, rest = count + k + 1, 0
    return _Picked(chunks, order, count, last)
