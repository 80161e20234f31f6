"""Index orders for map-style shard datasets: chunked, shard-local, distributed, resumable.

Every sampler here turns a dataset's shard lengths into one order of sample indices per epoch:

- the index range (all samples, or ``num_samples``) is cut into *chunks* that never cross a
  shard boundary and hold at most ``chunksize`` samples (``chunking="fixed"`` restores the
  reference's fixed-size chunks that ignore shards);
- each epoch draws from ``random.Random(seed + 1289738273 * epoch)``: first the chunk order is
  shuffled (only when ``shuffle`` and either ``shufflefirst`` or ``epoch > 0``), then the
  indices inside each chunk, chunk by chunk, when ``shuffle``;
- the epoch changes only through ``set_epoch`` (or ``auto_epoch=True``, the reference's bump
  after a complete pass), so every rank computes the same order;
- ``len(sampler)`` is exact and the same on every rank; ``state_dict()`` /
  ``load_state_dict()`` resume in the middle of an epoch.

``DistributedChunkedSampler`` partitions the range over ranks: by default each rank keeps the
same contiguous block every epoch (``partition="block"``, good for shard caches), or the
shuffled chunk sequence of the whole range is cut into one slice per rank anew every epoch
(``partition="global"``). ``drop_last=False`` pads the last rank(s) by wrapping around to the
start of the range, as ``torch.utils.data.DistributedSampler`` does; ``drop_last=True`` drops
the tail. ``mix=True`` draws from the dataset's weighted sub-datasets (``dataset.components``)
in proportion to their weights. ``num_workers`` / ``batch_size`` arrange the order so that each
DataLoader worker reads its own chunks.

Mixing (``mix=True``): an epoch still has ``n`` samples (the size of the range). Component
``i`` (its weight, 1.0 when ``None``) gets ``round(n * w_i / sum(w))`` of them (largest
remainder, so they add up to ``n``), drawn *without replacement by passes*: whole passes over
the component, then randomly chosen chunks of it for the remainder (the last one cut short), so
within an epoch the counts of a component's samples differ by at most one. The selected chunks
are shuffled together every epoch (also epoch 0) and partitioned with ``partition="global"``.

Cost: an epoch's order is generated lazily, one chunk at a time; resuming at position ``p``
replays the shuffles up to ``p``. ``partition="global"`` and ``mix`` make every rank generate
the sequence up to the end of its slice. Memory is proportional to shards (and, with ``mix``,
to the chunks drawn for a remainder), never to samples: chunks are computed on demand, and a
chunk order or a chunk of more than 2**20 elements is shuffled by a lazy keyed permutation
instead of ``random.shuffle`` (below that size orders are exactly the reference's).
Worker-aware ordering holds only the chunks handed to workers and not yet consumed.
torch is imported only when ``num_replicas`` or ``rank`` has to be looked up.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import operator
import random
import sys
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

__all__ = ["ChunkedSampler", "DistributedChunkedSampler", "ShardedSampler"]

_EPOCH_STRIDE = 1289738273  # the reference's per-epoch seed stride; orders depend on it
_STATE_FORMAT = "wids-sampler-state"
_STATE_VERSION = 1
# state fields that must match for a saved position to mean the same samples
_STATE_CHECKED = (
    "num_replicas",
    "span",
    "length",
    "chunks",
    "partition",
    "drop_last",
    "shuffle",
    "shufflefirst",
    "mix",
    "num_workers",
    "batch_size",
)

Range = tuple[int, int]
Chunking = Literal["shard", "fixed"]
Partition = Literal["block", "global"]

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


def _shard_lengths(dataset: Any) -> list[int]:
    """Per-shard sample counts: ``dataset.lengths``, a list/tuple of ints, or ``[len(dataset)]``."""
    lengths = getattr(dataset, "lengths", None)
    if lengths is None and isinstance(dataset, (list, tuple)):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in dataset):
            lengths = dataset
    if lengths is None:
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                f"need shard lengths: an object with .lengths, a list of ints or a sized "
                f"dataset, not {type(dataset).__name__}"
            )
        lengths = [len(dataset)]
    result = [operator.index(n) for n in lengths]
    if any(n < 0 for n in result):
        raise ValueError(f"shard lengths must be >= 0, got {result}")
    return result


def _span(num_samples: int | tuple[int, int] | None, total: int) -> Range:
    """The index range ``(lo, hi)`` selected by ``num_samples``."""
    if num_samples is None:
        lo, hi = 0, total
    elif isinstance(num_samples, tuple):
        lo, hi = (operator.index(x) for x in num_samples)
    else:
        lo, hi = 0, operator.index(num_samples)
    if not 0 <= lo <= hi <= total:
        raise ValueError(f"num_samples {num_samples!r} is not a range inside [0, {total}]")
    return lo, hi


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


def _interleave(pieces: Iterable[list[int]], num_workers: int, batch_size: int) -> Iterator[int]:
    """Order indices so that batch ``k`` comes from chunks given to worker ``k % num_workers``.

    A DataLoader sends batch ``k`` to worker ``k % num_workers``. Each chunk goes to the worker
    with the fewest samples so far; a worker whose chunks run out borrows from the fullest.
    Chunks are assigned as the workers need them, so only the chunks handed out but not yet
    consumed are held (about one per worker), not the epoch.
    """
    source = iter(pieces)
    queues: list[collections.deque[list[int]]] = [collections.deque() for _ in range(num_workers)]
    heads = [0] * num_workers  # position inside each queue's first piece
    assigned, taken = [0] * num_workers, [0] * num_workers
    exhausted = False

    def refill(w: int) -> None:
        nonlocal exhausted
        while taken[w] == assigned[w] and not exhausted:
            piece = next(source, None)
            if piece is None:
                exhausted = True
                return
            j = min(range(num_workers), key=assigned.__getitem__)
            queues[j].append(piece)
            assigned[j] += len(piece)

    def take(w: int, need: int) -> list[int]:
        out: list[int] = []
        queue = queues[w]
        while need and queue:
            piece, pos = queue[0], heads[w]
            part = piece[pos : pos + need]
            out += part
            need -= len(part)
            if pos + len(part) >= len(piece):
                queue.popleft()
                heads[w] = 0
            else:
                heads[w] = pos + len(part)
        taken[w] += len(out)
        return out

    for k in itertools.count():
        w = k % num_workers
        need = batch_size
        while need:
            refill(w)
            if taken[w] == assigned[w]:  # this worker's chunks are used up: borrow
                w = max(range(num_workers), key=lambda j: assigned[j] - taken[j])
                if taken[w] == assigned[w]:
                    break
            part = take(w, need)
            need -= len(part)
            yield from part
        if need == batch_size:  # nothing left anywhere
            return


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Fill ``num_replicas`` / ``rank`` from ``torch.distributed`` where they are ``None``."""
    if num_replicas is None or rank is None:
        dist = _initialised_dist()
        if dist is not None:
            # attribute look-ups at call time, so patched get_rank/get_world_size are honoured
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        elif num_replicas is None and rank is None:
            num_replicas, rank = 1, 0
        else:
            raise ValueError(
                "torch.distributed is not initialised: give both num_replicas and rank, or neither"
            )
    replicas, index = operator.index(num_replicas), operator.index(rank)  # type: ignore[arg-type]
    if replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {replicas}")
    if not 0 <= index < replicas:
        raise ValueError(f"rank must be in [0, {replicas - 1}], got {index}")
    return replicas, index


def _initialised_dist() -> Any:
    """The ``torch.distributed`` module if torch is installed and a process group is up."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


class ChunkedSampler:
    """Shuffle chunks of consecutive indices, then the indices inside each chunk.

    Chunks never cross a shard boundary (``chunking="shard"``) and hold at most ``chunksize``
    indices, so consecutive indices stay within one shard. One process, one replica; see
    :class:`DistributedChunkedSampler` for several ranks.

    Args:
        dataset: Anything with ``.lengths`` (per-shard sample counts, like ``ShardListDataset``),
            a list or tuple of ints (the shard lengths themselves), or any sized object (one
            shard). With ``mix=True`` it must also have ``.components``.
        num_samples: ``None`` for all indices, an int ``n`` for ``[0, n)``, or ``(lo, hi)``.
        chunksize: Largest number of indices in a chunk.
        seed: Base of the per-epoch seed ``seed + 1289738273 * epoch``.
        shuffle: Shuffle the indices inside each chunk (and, after epoch 0, the chunk order).
        shufflefirst: Shuffle the chunk order at epoch 0 too.
        chunking: ``"shard"`` cuts chunks at shard boundaries; ``"fixed"`` cuts ``[lo, hi)``
            into consecutive pieces of ``chunksize`` regardless of shards (the reference).
        mix: Draw each epoch from ``dataset.components`` in proportion to their weights.
        num_workers: The DataLoader's ``num_workers``; with ``batch_size``, orders the indices
            so each worker reads its own chunks (0 or 1: plain order).
        batch_size: The DataLoader's ``batch_size`` (used only when ``num_workers > 1``).
        auto_epoch: After a complete pass, advance the epoch by one (the reference did this;
            off by default: call ``set_epoch`` each epoch, as with torch's samplers).

    Raises:
        ValueError: For a ``num_samples`` outside the dataset or a bad option.

    Example:
        >>> sampler = ChunkedSampler([3, 2], chunksize=10, shuffle=False)
        >>> sampler.ranges, list(sampler)
        ([(0, 3), (3, 5)], [0, 1, 2, 3, 4])
    """

    # DistributedChunkedSampler sets these on the instance before ChunkedSampler.__init__ runs
    num_replicas: int = 1
    rank: int = 0
    drop_last: bool = False
    partition: Partition | None = None

    def __init__(
        self,
        dataset: Any,
        *,
        num_samples: int | tuple[int, int] | None = None,
        chunksize: int = 2000,
        seed: int = 0,
        shuffle: bool = True,
        shufflefirst: bool = False,
        chunking: Chunking = "shard",
        mix: bool = False,
        num_workers: int = 0,
        batch_size: int = 1,
        auto_epoch: bool = False,
    ) -> None:
        if chunking not in ("shard", "fixed"):
            raise ValueError(f"chunking must be 'shard' or 'fixed', got {chunking!r}")
        if self.partition not in (None, "block", "global"):
            raise ValueError(f"partition must be 'block' or 'global', got {self.partition!r}")
        if mix and self.partition == "block":
            raise ValueError("mix=True draws a new selection every epoch: use partition='global'")
        if operator.index(chunksize) < 1 or operator.index(batch_size) < 1:
            raise ValueError(f"chunksize and batch_size must be >= 1: {chunksize}, {batch_size}")
        if operator.index(num_workers) < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        lengths = _shard_lengths(dataset)
        self.seed, self.epoch = operator.index(seed), 0
        self.shuffle, self.shufflefirst = bool(shuffle), bool(shufflefirst)
        self.chunking, self.mix = chunking, bool(mix)
        self.partition: Partition = self.partition or ("global" if mix else "block")
        self.chunksize, self.num_workers, self.batch_size = chunksize, num_workers, batch_size
        self.auto_epoch = bool(auto_epoch)
        self.span = _span(num_samples, sum(lengths))
        self._cuts = _boundaries(lengths) if chunking == "shard" else []
        lo, hi = self.span
        n = hi - lo
        replicas = self.num_replicas
        self._length = n // replicas if self.drop_last else -(-n // replicas)
        self._components = self._read_components(dataset) if mix else []
        self.ranges: Sequence[Range]
        if self.partition == "block":
            start = self.rank * self._length
            segments = _cyclic_segments(lo, hi, start, self._length) if n else []
            self.ranges = _Chunks((self._chunk(a, b), 1) for a, b in segments)
        elif mix:
            self.ranges = _Chunks((self._chunk(a, b), 1) for a, b, _ in self._components)
        else:
            self.ranges = self._chunk(lo, hi)
        self._position = 0  # indices handed out by the current iterator
        self._resume = 0  # indices to skip at the start of the next iterator
        self._epoch_set = False
        self._completed_epoch: int | None = None
        self._warned = False

    def _chunk(self, lo: int, hi: int) -> _Chunks:
        return _chunks(lo, hi, self._cuts, self.chunksize)

    def _read_components(self, dataset: Any) -> list[tuple[int, int, float]]:
        components = getattr(dataset, "components", None)
        if not components:
            raise ValueError("mix=True needs a dataset with sub-datasets (.components)")
        lo, hi = self.span
        result = []
        for c in components:
            weight = 1.0 if c.weight is None else float(c.weight)
            if not weight >= 0 or math.isinf(weight):
                raise ValueError(f"component {c.name!r}: weight must be >= 0, got {c.weight!r}")
            a, b = max(lo, c.start), min(hi, c.stop)
            if a < b:
                result.append((a, b, weight))
        if not any(w > 0 for _, _, w in result):
            raise ValueError("mix=True: no component with a positive weight inside num_samples")
        return result

    def __len__(self) -> int:
        return self._length

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next iteration on.

        Setting the epoch that a loaded state holds keeps its resume position; any other epoch
        starts at the beginning.
        """
        epoch = operator.index(epoch)
        if epoch != self.epoch:
            self._resume = 0
        self.epoch = epoch
        self._epoch_set = True

    def _pieces(self) -> Iterator[list[int]]:
        """This replica's indices for the current epoch, as lists taken from single chunks."""
        rng = random.Random(self.seed + _EPOCH_STRIDE * self.epoch)
        reorder = self.shuffle and (self.shufflefirst or self.epoch > 0)
        if self.partition == "block":
            return _shuffled_pieces(self.ranges, rng, reorder, self.shuffle)
        lo, hi = self.span
        if self.mix:
            # the chunk order is always shuffled when mixing: the blend is the point
            pieces = _shuffled_pieces(self._mixed_ranges(rng), rng, self.shuffle, self.shuffle)
        else:
            pieces = _shuffled_pieces(self.ranges, rng, reorder, self.shuffle)
        start = self.rank * self._length
        return _slice(pieces, hi - lo, start, start + self._length)

    def _mixed_ranges(self, rng: random.Random) -> _Chunks:
        """Whole passes over each component plus randomly chosen chunks for the remainder."""
        lo, hi = self.span
        quotas = _quotas(hi - lo, [w for _, _, w in self._components])
        selected: list[tuple[Sequence[Range], int]] = []
        for (a, b, _), quota in zip(self._components, quotas, strict=True):
            chunks = self._chunk(a, b)
            passes, rest = divmod(quota, b - a)
            selected.append((chunks, passes))
            extra: list[Range] = []
            for i in _order(len(chunks), rng):  # as random.shuffle(chunks), lazily past _BIG
                if rest <= 0:
                    break
                c_lo, c_hi = chunks[i]
                extra.append((c_lo, min(c_hi, c_lo + rest)))
                rest -= c_hi - c_lo
            selected.append((extra, 1))
        return _Chunks(selected)

    def _indices(self) -> Iterator[int]:
        pieces = self._pieces()
        if self.num_workers > 1:
            return _interleave(pieces, self.num_workers, self.batch_size)
        return itertools.chain.from_iterable(pieces)

    def __iter__(self) -> Iterator[int]:
        start, self._resume = self._resume, 0
        if (
            self._completed_epoch == self.epoch
            and start == 0
            and self.shuffle
            and not (self._epoch_set or self.auto_epoch or self._warned)
        ):
            self._warned = True
            warnings.warn(
                f"{type(self).__name__} repeats the order of epoch {self.epoch}: call "
                "set_epoch(epoch) before each epoch (or pass auto_epoch=True)",
                stacklevel=2,
            )
        self._position = start
        return self._generate(start)

    def _generate(self, start: int) -> Iterator[int]:
        for index in itertools.islice(self._indices(), start, None):
            self._position += 1
            yield index
        self._completed_epoch = self.epoch
        if self.auto_epoch:
            self.epoch += 1
            self._position = 0

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """The epoch, seed and position to resume from, plus the settings they depend on.

        Args:
            position: How many of this epoch's indices were consumed on this rank. Defaults to
                how many the sampler has handed out, which under a DataLoader with workers runs
                ahead of the training loop by the prefetched batches: pass
                ``steps * batch_size`` to resume at the step the loop reached.

        Returns:
            A dict of plain values (JSON- and ``torch.save``-friendly). Every rank in lockstep
            holds the same state, so saving rank 0's and loading it everywhere is fine.
        """
        pos = self._position if position is None else operator.index(position)
        if not 0 <= pos <= self._length:
            raise ValueError(f"position must be in [0, {self._length}], got {pos}")
        return {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "seed": self.seed,
            "position": pos,
            **self._settings(),
        }

    def _settings(self) -> dict[str, Any]:
        return {
            "num_replicas": self.num_replicas,
            "span": list(self.span),
            "length": self._length,
            "chunks": [self.chunking, self.chunksize, zlib.crc32(repr(self._cuts).encode())],
            "partition": self.partition,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "shufflefirst": self.shufflefirst,
            "mix": self.mix,
            "num_workers": self.num_workers if self.num_workers > 1 else 0,
            "batch_size": self.batch_size if self.num_workers > 1 else 1,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore epoch, seed and position: the next iteration yields the rest of that epoch.

        Raises:
            ValueError: If the state is not a sampler state, or was saved with settings that
                give a different order, in particular a different number of replicas
                (resuming on another world size is not supported).
        """
        if state.get("format") != _STATE_FORMAT or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a {_STATE_FORMAT} version {_STATE_VERSION} dict")
        mine = self._settings()
        theirs = {key: state.get(key) for key in _STATE_CHECKED}
        if theirs["num_replicas"] != mine["num_replicas"]:
            raise ValueError(
                f"sampler state was saved with num_replicas={theirs['num_replicas']}, this "
                f"sampler has num_replicas={mine['num_replicas']}; resuming on a different "
                "world size is not supported (start the epoch over instead)"
            )
        for key in _STATE_CHECKED:
            if theirs[key] != mine[key]:
                raise ValueError(
                    f"sampler state was saved with {key}={theirs[key]!r}, "
                    f"this sampler has {key}={mine[key]!r}"
                )
        position = operator.index(state["position"])
        if not 0 <= position <= self._length:
            raise ValueError(f"position must be in [0, {self._length}], got {position}")
        self.epoch, self.seed = operator.index(state["epoch"]), operator.index(state["seed"])
        self._resume = self._position = position
        self._epoch_set = True

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(span={self.span}, chunks={len(self.ranges)}, "
            f"rank={self.rank}/{self.num_replicas}, len={self._length}, epoch={self.epoch})"
        )


class DistributedChunkedSampler(ChunkedSampler):
    """A :class:`ChunkedSampler` for one rank of a distributed job.

    With ``partition="block"`` (the default) rank ``r`` owns positions
    ``[r * L, (r + 1) * L)`` of the range, ``L = len(sampler)``, every epoch, so its shard
    cache keeps serving it; its chunks are shuffled as in :class:`ChunkedSampler`. With
    ``partition="global"`` the whole range's chunk sequence is shuffled each epoch and rank
    ``r`` takes positions ``[r * L, (r + 1) * L)`` of it. ``drop_last=False``:
    ``L = ceil(n / R)`` and positions past the end wrap around to the start of the range (at
    most ``R - 1`` indices repeat per epoch); ``drop_last=True``: ``L = floor(n / R)`` and the
    last ``n mod R`` positions are dropped. Every rank must use the same seed.

    Args:
        dataset: As for :class:`ChunkedSampler`.
        num_replicas: Number of ranks; ``None``: ``torch.distributed.get_world_size()`` if a
            process group is initialised, else 1.
        rank: This rank; ``None``: ``torch.distributed.get_rank()`` if a process group is
            initialised, else 0. Explicit values always win.
        num_samples: As for :class:`ChunkedSampler`; partitioned over the ranks.
        shuffle: As for :class:`ChunkedSampler`.
        shufflefirst: As for :class:`ChunkedSampler`.
        seed: As for :class:`ChunkedSampler`.
        drop_last: ``True`` drops the tail so every rank has ``floor(n / R)`` indices;
            ``False`` or ``None`` pads to ``ceil(n / R)``.
        chunksize: As for :class:`ChunkedSampler`.
        chunking: As for :class:`ChunkedSampler`.
        partition: ``"block"`` or ``"global"``; ``None``: ``"global"`` with ``mix``, else
            ``"block"``.
        mix: As for :class:`ChunkedSampler` (needs ``partition="global"``).
        num_workers: As for :class:`ChunkedSampler`.
        batch_size: As for :class:`ChunkedSampler`.
        auto_epoch: As for :class:`ChunkedSampler`.

    Raises:
        ValueError: For a bad ``num_replicas`` or ``rank``, only one of them given without an
            initialised process group, or a bad option.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        num_samples: int | tuple[int, int] | None = None,
        shuffle: bool = True,
        shufflefirst: bool = False,
        seed: int = 0,
        drop_last: bool | None = None,
        chunksize: int = 1000000,
        chunking: Chunking = "shard",
        partition: Partition | None = None,
        mix: bool = False,
        num_workers: int = 0,
        batch_size: int = 1,
        auto_epoch: bool = False,
    ) -> None:
        self.num_replicas, self.rank = _world(num_replicas, rank)
        self.drop_last, self.partition = bool(drop_last), partition
        super().__init__(
            dataset,
            num_samples=num_samples,
            chunksize=chunksize,
            seed=seed,
            shuffle=shuffle,
            shufflefirst=shufflefirst,
            chunking=chunking,
            mix=mix,
            num_workers=num_workers,
            batch_size=batch_size,
            auto_epoch=auto_epoch,
        )


class ShardedSampler(ChunkedSampler):
    """One chunk per shard: the shard order shuffled, then the indices inside each shard.

    The shard order is shuffled after epoch 0, or from the start with ``shufflefirst``.

    Args:
        dataset: As for :class:`ChunkedSampler`; may be ``None`` when ``lengths`` is given.
        lengths: Per-shard sample counts, instead of the dataset's.
        seed: As for :class:`ChunkedSampler`.
        shufflefirst: Shuffle the shard order at epoch 0 too.
        auto_epoch: As for :class:`ChunkedSampler`.
    """

    def __init__(
        self,
        dataset: Any = None,
        *,
        lengths: Sequence[int] | None = None,
        seed: int = 0,
        shufflefirst: bool = False,
        auto_epoch: bool = False,
    ) -> None:
        super().__init__(
            dataset if lengths is None else list(lengths),
            chunksize=sys.maxsize,
            seed=seed,
            shufflefirst=shufflefirst,
            auto_epoch=auto_epoch,
        )
        # keep empty shards as (a, a) ranges: they take part in the shard shuffle, as before
        self.ranges = list(itertools.pairwise(self._cuts))
