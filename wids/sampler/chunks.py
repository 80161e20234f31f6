"""The order arithmetic of the samplers: chunks of index ranges, shuffles, slices, quotas.

A chunk is a ``(lo, hi)`` range of consecutive indices. Sequences of chunks are computed on
demand (:class:`_Chunks`), so memory is proportional to shards, never to samples; orders of more
than :data:`_BIG` elements use a lazy keyed permutation instead of ``random.shuffle``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = ["Range"]

Range = tuple[int, int]

# Chunks and shuffles up to this many elements are materialised and shuffled with
# ``random.shuffle``, exactly as the reference does; beyond it a lazy permutation takes over, so
# memory stays proportional to shards, not samples (``nsamples=10**12`` must not allocate).
_BIG = 1 << 20
_PIECE = 1 << 16  # indices handed out at once from a chunk larger than _BIG


class _Run(Sequence[Range]):
    """The chunks of ``[a, b)``: consecutive pieces of ``size`` indices, the last one shorter."""

    __slots__ = ("a", "b", "size")

    def __init__(self, a: int, b: int, size: int) -> None:
        self.a, self.b, self.size = a, b, size

    def __len__(self) -> int:
        return -(-(self.b - self.a) // self.size)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        lo = self.a + operator.index(i) * self.size
        return (lo, min(lo + self.size, self.b))

    def __iter__(self) -> Iterator[Range]:
        b, size = self.b, self.size
        return ((lo, min(lo + size, b)) for lo in range(self.a, b, size))


class _Chunks(Sequence[Range]):
    """A sequence of chunks concatenated from parts, each repeated ``times``, built lazily.

    Memory is per part (a shard's run of chunks, a component), never per chunk or sample.
    Compares equal to any sequence of the same ``(lo, hi)`` pairs.
    """

    __slots__ = ("_ends", "_parts")

    def __init__(self, parts: Iterable[tuple[Sequence[Range], int]]) -> None:
        self._parts = [(p, t) for p, t in parts if t > 0 and len(p)]
        self._ends = list(itertools.accumulate(len(p) * t for p, t in self._parts))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("chunk index out of range")
        k = bisect.bisect_right(self._ends, i)
        part = self._parts[k][0]
        return part[(i - (self._ends[k - 1] if k else 0)) % len(part)]

    def __iter__(self) -> Iterator[Range]:
        for part, times in self._parts:
            for _ in range(times):
                yield from part

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        if len(other) != len(self):
            return False
        return all(tuple(x) == y for x, y in zip(other, self))  # noqa: B905 - same length

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self)) if len(self) <= 20 else f"<{len(self)} chunks>"


_GOLDEN = 0x9E3779B97F4A7C15


class _Permutation:
    """A pseudo-random permutation of ``range(n)`` computed on demand, in numpy blocks.

    A four-round Feistel network over the smallest even-bit domain holding ``n`` (less than
    ``4 n``), keyed from one 64-bit draw, with cycle walking to stay below ``n``. Used instead
    of materialising and shuffling when ``n`` exceeds :data:`_BIG`.
    """

    def __init__(self, n: int, key: int) -> None:
        import numpy as np

        bits = max(2, (n - 1).bit_length())
        bits += bits & 1
        self.n, self.half = n, bits // 2
        keys = random.Random(key)
        self.keys = [np.uint64(keys.getrandbits(64)) for _ in range(4)]

    def _round(self, x: Any) -> Any:
        import numpy as np

        u = np.uint64
        half, mask = u(self.half), u((1 << self.half) - 1)
        left, right = x >> half, x & mask
        for key in self.keys:
            z = (right + key) * u(_GOLDEN)
            z = (z ^ (z >> u(30))) * u(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> u(27))) * u(0x94D049BB133111EB)
            left, right = right, left ^ ((z ^ (z >> u(31))) & mask)
        return (left << half) | right

    def block(self, start: int, stop: int) -> list[int]:
        """Positions ``start .. stop - 1`` of the permutation."""
        import numpy as np

        with np.errstate(over="ignore"):
            y = self._round(np.arange(start, stop, dtype=np.uint64))
            out = y >= np.uint64(self.n)
            while out.any():  # cycle walking: a bijection of the domain, so this ends
                y[out] = self._round(y[out])
                out = y >= np.uint64(self.n)
        return y.tolist()  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[int]:
        for start in range(0, self.n, _PIECE):
            yield from self.block(start, min(start + _PIECE, self.n))


def _order(n: int, rng: random.Random) -> Iterable[int]:
    """A shuffled ``range(n)``: by ``random.shuffle`` up to :data:`_BIG`, else lazily."""
    if n <= _BIG:
        order = list(range(n))
        rng.shuffle(order)
        return order
    return _Permutation(n, rng.getrandbits(64))


def _chunk_pieces(a: int, b: int, rng: random.Random, shuffle: bool) -> Iterator[list[int]]:
    """The indices of chunk ``[a, b)``, shuffled if ``shuffle``.

    One list, or past :data:`_BIG` indices several lists of :data:`_PIECE`.
    """
    if b - a <= _BIG:
        indices = list(range(a, b))
        if shuffle:
            rng.shuffle(indices)
        yield indices
    elif not shuffle:
        for lo in range(a, b, _PIECE):
            yield list(range(lo, min(lo + _PIECE, b)))
    else:
        perm = _Permutation(b - a, rng.getrandbits(64))
        for s in range(0, b - a, _PIECE):
            yield [a + x for x in perm.block(s, min(s + _PIECE, b - a))]


def _boundaries(lengths: Sequence[int]) -> list[int]:
    return list(itertools.accumulate(lengths, initial=0))


def _chunks(lo: int, hi: int, cuts: Sequence[int], chunksize: int) -> _Chunks:
    """Cut ``[lo, hi)`` at every position in sorted ``cuts``, then into ``chunksize`` pieces."""
    inner = cuts[bisect.bisect_right(cuts, lo) : bisect.bisect_left(cuts, hi)]
    edges = [lo, *inner, hi]
    return _Chunks((_Run(a, b, chunksize), 1) for a, b in itertools.pairwise(edges))


def _cyclic_segments(lo: int, hi: int, start: int, count: int) -> list[Range]:
    """Positions ``[start, start + count)`` of the sequence ``lo, ..., hi - 1`` repeated forever."""
    n = hi - lo
    segments: list[Range] = []
    while count > 0:
        offset = start % n
        take = min(count, n - offset)
        segments.append((lo + offset, lo + offset + take))
        start += take
        count -= take
    return segments


def _shuffled_pieces(
    ranges: Sequence[Range], rng: random.Random, reorder: bool, shuffle: bool
) -> Iterator[list[int]]:
    """The reference's order: chunk order shuffled if ``reorder``, then each chunk's indices."""
    chunks = (ranges[i] for i in _order(len(ranges), rng)) if reorder else iter(ranges)
    for a, b in chunks:
        yield from _chunk_pieces(a, b, rng, shuffle)


def _slice(pieces: Iterable[list[int]], n: int, start: int, stop: int) -> Iterator[list[int]]:
    """Positions ``[start, stop)`` of a sequence of length ``n`` that wraps around to its start."""
    head_size = min(n, max(0, stop - n))
    head: list[int] = []
    pos = 0
    for piece in pieces:
        if len(head) < head_size:
            head.extend(piece[: head_size - len(head)])
        a, b = max(pos, start), min(pos + len(piece), stop)
        if a < b:
            yield piece[a - pos : b - pos]
        pos += len(piece)
        if pos >= stop and len(head) >= head_size:
            break
    wrapped = [head[p % n] for p in range(max(start, n), stop)]
    if wrapped:
        yield wrapped


def _quotas(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` in proportion to ``weights`` (largest remainder, sums exactly)."""
    wsum = math.fsum(weights)
    shares = [total * w / wsum for w in weights]
    quotas = [math.floor(s) for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: quotas[i] - shares[i])
    for i in by_remainder[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas
