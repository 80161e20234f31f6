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
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = ["Range"]

Range = tuple[int, int]

# Chunks and shuffles up to this many elements are materialised and shuffled with
# ``random.shuffle``, exactly as the reference does; beyond it a lazy permutation takes over, so
# memory stays proportional to shards, not samples (``nsamples=10**12`` must not allocate).
_BIG = 1 << 20
_PIECE = 1 << 16  # indices handed out at once from a chunk larger than _BIG


class _Ranges(Sequence[Range]):
    """A sequence of ``(lo, hi)`` chunks that compares equal to any sequence of the same pairs."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        if len(other) != len(self):
            return False
        return all(tuple(x) == y for x, y in zip(other, self))  # noqa: B905 - same length

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self)) if len(self) <= 20 else f"<{len(self)} chunks>"


class _Runs(_Ranges):
    """The chunks of consecutive runs ``[edges[k], edges[k + 1])``, each cut into ``size`` pieces.

    Three int64 arrays (edges, chunk counts' running total): 16 bytes per run, so 10^6 shards
    cost 16 MB, not 10^6 Python objects.
    """

    __slots__ = ("_edges", "_ends", "size")

    def __init__(self, edges: Any, size: int) -> None:
        import numpy as np

        self._edges = np.asarray(edges, dtype=np.int64)
        self.size = size
        counts = -(-np.diff(self._edges) // size)
        self._ends = np.cumsum(counts, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("chunk index out of range")
        k = int(self._ends.searchsorted(i, "right"))
        lo = int(self._edges[k]) + (i - (int(self._ends[k - 1]) if k else 0)) * self.size
        return (lo, min(lo + self.size, int(self._edges[k + 1])))

    def sizes(self, chunks: Any) -> Any:
        """The number of indices in each chunk of the int64 array ``chunks``."""
        import numpy as np

        order = np.argsort(chunks, kind="stable")  # sorted needles search much faster
        k = np.empty_like(chunks)
        k[order] = self._ends.searchsorted(chunks[order], "right")
        first = np.where(k > 0, self._ends[np.maximum(k - 1, 0)], 0)
        lo = self._edges[k] + (chunks - first) * self.size
        return np.minimum(self._edges[k + 1] - lo, self.size)

    def __iter__(self) -> Iterator[Range]:
        size, n = self.size, len(self._edges) - 1
        for start in range(0, n, _PIECE):  # a block of runs at a time as Python ints
            edges = self._edges[start : start + _PIECE + 1].tolist()
            for a, b in itertools.pairwise(edges):
                for lo in range(a, b, size):
                    yield (lo, min(lo + size, b))


class _Pairs(_Ranges):
    """``(cuts[i], cuts[i + 1])`` for every ``i``: one range per shard, empty shards included."""

    __slots__ = ("_cuts",)

    def __init__(self, cuts: Any) -> None:
        self._cuts = cuts

    def __len__(self) -> int:
        return max(0, len(self._cuts) - 1)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("shard index out of range")
        return (int(self._cuts[i]), int(self._cuts[i + 1]))

    def __iter__(self) -> Iterator[Range]:
        for start in range(0, len(self), _PIECE):
            yield from itertools.pairwise(self._cuts[start : start + _PIECE + 1].tolist())


class _Chunks(_Ranges):
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

    def sizes(self, chunks: Any) -> Any:
        """The number of indices in each chunk of the int64 array ``chunks``."""
        import numpy as np

        ends = np.asarray(self._ends, dtype=np.int64)
        k = ends.searchsorted(chunks, "right")
        out = np.empty(len(chunks), dtype=np.int64)
        for part_no in np.unique(k).tolist():
            mask = k == part_no
            part = self._parts[part_no][0]
            local = (chunks[mask] - (ends[part_no - 1] if part_no else 0)) % len(part)
            out[mask] = part.sizes(local)
        return out

    def __iter__(self) -> Iterator[Range]:
        for part, times in self._parts:
            for _ in range(times):
                yield from part


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
        return self.array(start, stop).tolist()  # type: ignore[no-any-return]

    def array(self, start: int, stop: int) -> Any:
        """Positions ``start .. stop - 1`` of the permutation, as a uint64 array."""
        import numpy as np

        return self.at(np.arange(start, stop, dtype=np.uint64))

    def at(self, positions: Any) -> Any:
        """The permutation at an array of positions, as a uint64 array."""
        import numpy as np

        with np.errstate(over="ignore"):
            y = self._round(positions.astype(np.uint64))
            out = y >= np.uint64(self.n)
            while out.any():  # cycle walking: a bijection of the domain, so this ends
                y[out] = self._round(y[out])
                out = y >= np.uint64(self.n)
        return y

    def __iter__(self) -> Iterator[int]:
        for start in range(0, self.n, _PIECE):
            yield from self.block(start, min(start + _PIECE, self.n))


def _order(n: int, rng: random.Random, lazy: bool = False) -> Iterable[int]:
    """A shuffled ``range(n)``: by ``random.shuffle`` up to :data:`_BIG`, else lazily.

    ``lazy`` (the epoch has more than ``_BIG`` indices) takes the lazy permutation at any size.
    """
    if n <= _BIG and not lazy:
        order = list(range(n))
        rng.shuffle(order)
        return order
    return _Permutation(n, rng.getrandbits(64))


def _chunk_pieces(
    a: int, b: int, rng: random.Random, shuffle: bool, lazy: bool = False
) -> Iterator[list[int]]:
    """The indices of chunk ``[a, b)``, shuffled if ``shuffle``.

    One list, or past :data:`_BIG` indices (past :data:`_PIECE` if ``lazy``: the epoch has more
    than ``_BIG`` indices) several lists of ``_PIECE`` from a lazy permutation.
    """
    if b - a <= (_PIECE if lazy else _BIG):
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


def _boundaries(lengths: Any) -> Any:
    """The shards' start positions and the total, as an int64 array (``0, l0, l0 + l1, ...``)."""
    import numpy as np

    cuts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cuts[1:])
    return cuts


def _chunks(lo: int, hi: int, cuts: Any, chunksize: int) -> _Runs:
    """Cut ``[lo, hi)`` at every position in sorted ``cuts``, then into ``chunksize`` pieces."""
    import numpy as np

    if len(cuts) == 0:
        return _Runs([lo, hi], chunksize)
    inner = cuts[int(np.searchsorted(cuts, lo, "right")) : int(np.searchsorted(cuts, hi, "left"))]
    return _Runs(np.concatenate(([lo], inner, [hi])), chunksize)


def _cuts_crc(cuts: Any) -> int:
    """``zlib.crc32(repr(list(cuts)).encode())`` without building the string.

    Resume states record it to recognise the shard layout; at 10^6 shards the string is 8 MB.
    """
    crc = zlib.crc32(b"[")
    for start in range(0, len(cuts), _PIECE):
        text = ", ".join(map(str, cuts[start : start + _PIECE].tolist()))
        crc = zlib.crc32((", " + text if start else text).encode(), crc)
    return zlib.crc32(b"]", crc)


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
    ranges: Sequence[Range], rng: random.Random, reorder: bool, shuffle: bool, lazy: bool = False
) -> Iterator[list[int]]:
    """The reference's order: chunk order shuffled if ``reorder``, then each chunk's indices."""
    order = _order(len(ranges), rng, lazy) if reorder else None
    chunks = iter(ranges) if order is None else (ranges[i] for i in order)
    for a, b in chunks:
        yield from _chunk_pieces(a, b, rng, shuffle, lazy)


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
