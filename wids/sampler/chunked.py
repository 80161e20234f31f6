"""The chunked sampler: chunks shuffled, then the indices inside each chunk; epochs, resume."""

from __future__ import annotations

import copy
import itertools
import math
import operator
import random
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from ..errors import SamplerStateError
from ..plan import first_plan, planned_order
from .chunks import (
    _BIG,
    Range,
    _boundaries,
    _Chunks,
    _chunks,
    _cuts_crc,
    _cyclic_segments,
    _quotas,
    _Runs,
    _shuffled_pieces,
    _slice,
)
from .elastic import _Resumed, read_stages
from .picks import _picked
from .skip import _keyed_pieces
from .workers import _interleave

__all__ = ["ChunkedSampler"]

_EPOCH_STRIDE = 1289738273  # the reference's per-epoch seed stride; orders depend on it
_STATE_FORMAT = "wids-sampler-state"
_STATE_VERSION = 1
_STAGES_VERSION = 2  # a state inside an epoch resumed on another world size
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
# what must match for a state of another world size: the data and the order's settings
_DATA_CHECKED = ("span", "chunks", "partition", "drop_last", "shuffle", "shufflefirst", "mix")

Chunking = Literal["shard", "fixed"]
Partition = Literal["block", "global"]


def _shard_lengths(dataset: Any) -> Any:
    """Per-shard sample counts as an int64 array.

    From ``dataset.lengths`` (``ShardListDataset``, ``ConcatDataset``-like objects) when they
    are shard lengths: non-negative ints summing to ``len(dataset)``. Else ``[len(dataset)]``:
    a list, a range or a user's ``Dataset`` is one shard of ``len()`` samples, as in the
    reference (a list of ints is a dataset of ints, not of shard lengths), and so is a dataset
    whose ``.lengths`` means something else (tokens per sample).
    """
    import numpy as np

    lengths = getattr(dataset, "lengths", None)
    sized = hasattr(dataset, "__len__")
    if lengths is not None:
        try:
            result = _as_ints(lengths)
        except (TypeError, ValueError, OverflowError):
            if not sized:
                raise
        else:
            if not sized or int(result.sum()) == len(dataset):
                if len(result) and result.min() < 0:
                    bad = int(np.argmax(result < 0))
                    raise ValueError(
                        f"shard lengths must be >= 0, got {int(result[bad])} for shard {bad}"
                    )
                return result
    if not sized:
        raise TypeError(
            f"need a sized dataset (len()) or one with shard lengths (.lengths), not "
            f"{type(dataset).__name__}"
        )
    return np.array([len(dataset)], dtype=np.int64)


def _as_ints(lengths: Any) -> Any:
    """``lengths`` as an int64 array (``TypeError`` for a value that is not an int)."""
    import numpy as np

    if not isinstance(lengths, (list, tuple, np.ndarray)):
        lengths = list(lengths)
    as_array = np.asarray(lengths) if len(lengths) else np.zeros(0, dtype=np.int64)
    if as_array.dtype.kind in "iu":  # ints only (bools, floats and big ints: one by one)
        result = as_array.astype(np.int64, copy=False)
    else:  # any integer-like values (operator.index), one block at a time
        result = np.empty(len(lengths), dtype=np.int64)
        for start in range(0, len(lengths), 1 << 16):
            block = [operator.index(n) for n in lengths[start : start + (1 << 16)]]
            result[start : start + len(block)] = block
    return result


class _Lengths:
    """Shard lengths given on their own (``ShardedSampler(lengths=...)``), as a dataset."""

    __slots__ = ("lengths",)

    def __init__(self, lengths: Sequence[int]) -> None:
        self.lengths = lengths


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


class ChunkedSampler:
    """Shuffle chunks of consecutive indices, then the indices inside each chunk.

    Chunks never cross a shard boundary (``chunking="shard"``) and hold at most ``chunksize``
    indices, so consecutive indices stay within one shard. One process, one replica; see
    :class:`DistributedChunkedSampler` for several ranks.

    Args:
        dataset: Anything with ``.lengths`` (per-shard sample counts, like
            ``ShardListDataset``), or any sized object (a list, a user's ``Dataset``): one
            shard of ``len(dataset)`` samples. With ``mix=True`` it must also have
            ``.components``.
        num_samples: ``None`` for all indices, an int ``n`` for ``[0, n)``, or ``(lo, hi)``.
        chunksize: Largest number of indices in a chunk.
        seed: Base of the per-epoch seed ``seed + 1289738273 * epoch``.
        shuffle: Shuffle the indices inside each chunk (and, after epoch 0, the chunk order).
        shufflefirst: Shuffle the chunk order at epoch 0 too.
        chunking: ``"shard"`` cuts chunks at shard boundaries; ``"fixed"`` cuts ``[lo, hi)``
            into consecutive pieces of ``chunksize`` regardless of shards (the reference).
        mix: Draw each epoch from ``dataset.components`` in proportion to their weights.
        num_workers: Not needed for speed: the indices handed out carry the plan the dataset
            reads ahead from, whatever the loader (:mod:`wids.plan`). With ``batch_size``, it
            still orders the indices so that each of ``num_workers`` workers taking turns
            reads its own chunks (0 or 1: plain order).
        batch_size: The DataLoader's ``batch_size`` (used only when ``num_workers > 1``).
        dslength_per_replica: What ``len()`` says, as the reference's keyword of that name
            did (``-1``, the default: the number of indices an epoch yields). An epoch still
            yields the indices of ``num_samples``; a length that differs from their number
            warns (``len(DataLoader)`` and the batches a loader yields then differ, and ranks
            built this way step differently: :class:`DistributedChunkedSampler` gives every
            rank the same length).
        auto_epoch: After a complete pass, advance the epoch by one. ``None`` (the default)
            or ``True``: always, as the reference does (a ``set_epoch`` call sets the epoch of
            the next pass; passes after it advance from there). ``False``: never (torch's
            samplers).

    Raises:
        ValueError: For a ``num_samples`` outside the dataset or a bad option.

    Example:
        >>> sampler = ChunkedSampler(list(range(25)), num_samples=20, chunksize=8)
        >>> sampler.ranges
        [(0, 8), (8, 16), (16, 20)]
        >>> first, second = list(sampler), list(sampler)  # epoch 0, then epoch 1
        >>> sorted(first) == sorted(second) == list(range(20)), first != second
        (True, True)
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
        auto_epoch: bool | None = None,
        dslength_per_replica: int = -1,
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
        self.auto_epoch = None if auto_epoch is None else bool(auto_epoch)
        self.span = _span(num_samples, int(lengths.sum()))
        self._cuts = _boundaries(lengths) if chunking == "shard" else _boundaries([])[:0]
        self._cuts_crc: int | None = None
        lo, hi = self.span
        n = hi - lo
        replicas = self.num_replicas
        self._length = n // replicas if self.drop_last else -(-n // replicas)
        self._said = self._said_length(dslength_per_replica)
        self._components = self._read_components(dataset) if mix else []
        self.ranges: Sequence[Range] = self._rank_ranges()
        self._position = 0  # indices handed out by the current iterator
        self._resume = 0  # indices to skip at the start of the next iterator
        # an epoch resumed on another world size: its stages, loaded (for the next iterator)
        # and in the current iterator (None: a plain epoch)
        self._pending: _Resumed | None = None
        self._resumed: _Resumed | None = None
        # the epoch (and its stages) a pass just completed and advanced from, until the next
        # pass starts: a position given to state_dict() then still means that epoch
        self._finished: tuple[int, _Resumed | None] | None = None
        # read, never configured: the dataset learns the plan from the indices handed out
        reads_plans = getattr(dataset, "_reads_plans", None)
        self._reader = dataset if callable(reads_plans) else None

    def _said_length(self, length: int) -> int | None:
        """The reference's ``dslength_per_replica``: what ``len()`` says, if given (> 0)."""
        length = operator.index(length)
        if length <= 0:
            return None
        if self.num_replicas != 1:
            raise ValueError(
                "dslength_per_replica is for one replica: a distributed sampler's length is its own"
            )
        if length != self._length:
            warnings.warn(
                f"ChunkedSampler: dslength_per_replica={length} but an epoch yields "
                f"{self._length} indices: len() says {length}, as in the reference (a "
                "DataLoader's len() and its batches then differ; DistributedChunkedSampler "
                "gives every rank the same length)",
                stacklevel=3,
            )
        return length

    def _rank_ranges(self) -> Sequence[Range]:
        """The chunks this rank's order is made of (block: its own; else the whole range's)."""
        lo, hi = self.span
        if self.partition == "block":
            start = self.rank * self._length
            segments = _cyclic_segments(lo, hi, start, self._length) if hi > lo else []
            return _Chunks((self._chunk(a, b), 1) for a, b in segments)
        if self.mix:
            return _Chunks((self._chunk(a, b), 1) for a, b, _ in self._components)
        return self._chunk(lo, hi)

    def _replica(
        self, replicas: int, rank: int, epoch: int, seed: int, num_workers: int, batch_size: int
    ) -> ChunkedSampler:
        """A copy that computes the order of ``rank`` of ``replicas`` in ``epoch`` (no plans)."""
        other = copy.copy(self)
        other.num_replicas, other.rank, other.epoch, other.seed = replicas, rank, epoch, seed
        other.num_workers, other.batch_size = num_workers, batch_size
        n = self.span[1] - self.span[0]
        other._length = n // replicas if self.drop_last else -(-n // replicas)
        other.ranges = other._rank_ranges()
        other._reader, other._pending, other._resumed, other._finished = None, None, None, None
        return other

    def _chunk(self, lo: int, hi: int) -> _Runs:
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
        """The number of indices in a full epoch on this rank (the same on every rank).

        Also after :meth:`load_state_dict`, when the resumed pass yields only the rest of the
        epoch: ``len(DataLoader)`` and a trainer's batches per epoch count the whole epoch, and
        the batches already done before the state was saved (as torchdata's
        ``StatefulDistributedSampler`` does).
        """
        return self._length if self._said is None else self._said

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next iteration on.

        Setting the epoch that a loaded state holds keeps its resume position; any other epoch
        starts at the beginning. Unless ``auto_epoch=False``, each complete pass still adds one
        to the epoch afterwards (as in the reference), so calling it once, on resume, does not
        make later passes repeat an order.
        """
        epoch = operator.index(epoch)
        if epoch != self.epoch:
            self._resume, self._pending = 0, None
        self.epoch, self._finished = epoch, None

    def _pieces(self, ranks: int = 1) -> Iterator[list[int]]:
        """This replica's indices for the current epoch, as lists taken from single chunks.

        ``ranks > 1`` (not block): this rank's slice and the next ``ranks - 1`` ranks', from one
        pass over the epoch's order (an elastic resume reads consecutive old ranks).
        """
        rng = random.Random(self.seed + _EPOCH_STRIDE * self.epoch)
        reorder = self.shuffle and (self.shufflefirst or self.epoch > 0)
        lo, hi = self.span
        n, start = hi - lo, self.rank * self._length
        big = n > _BIG  # lazy chunk orders; global/mix enter at this rank's slice (.skip)
        if self.partition == "block":
            return _shuffled_pieces(self.ranges, rng, reorder, self.shuffle, big)
        # the chunk order is always shuffled when mixing: the blend is the point
        ranges = self._mixed_ranges(rng, big) if self.mix else self.ranges
        reorder = self.shuffle if self.mix else reorder
        stop = start + ranks * self._length
        if big:
            keep = min(n, max(0, stop - n))
            pieces = _keyed_pieces(ranges, rng, reorder, self.shuffle, start, keep)
        else:
            pieces = _shuffled_pieces(ranges, rng, reorder, self.shuffle)
        return _slice(pieces, n, start, stop)

    def _mixed_ranges(self, rng: random.Random, lazy: bool = False) -> _Chunks:
        """Whole passes over each component plus randomly chosen chunks for the remainder."""
        lo, hi = self.span
        quotas = _quotas(hi - lo, [w for _, _, w in self._components])
        selected: list[tuple[Sequence[Range], int]] = []
        for (a, b, _), quota in zip(self._components, quotas, strict=True):
            chunks = self._chunk(a, b)
            passes, rest = divmod(quota, b - a)
            selected.append((chunks, passes))
            selected.append((_picked(chunks, rng, rest, lazy), 1))
        return _Chunks(selected)

    def _indices(self) -> Iterator[int]:
        pieces = self._pieces()
        if self.num_workers > 1:
            return _interleave(pieces, self.num_workers, self.batch_size)
        return itertools.chain.from_iterable(pieces)

    def __iter__(self) -> Iterator[int]:
        start, self._resume = self._resume, 0
        self._resumed, self._pending, self._finished = self._pending, None, None
        self._position = start
        order: Iterator[int]
        if self._resumed is not None:  # the rest of an epoch begun on another world size
            order = self._resumed.order(self.rank, start)
        else:
            order = itertools.islice(self._indices(), start, None)
        reader = self._reader
        if reader is None or not reader._reads_plans():
            return self._generate(order, None)
        # each index carries what follows it; the first window goes to the dataset here too
        return self._generate(planned_order(order, start), reader)

    def _generate(self, order: Iterator[int], reader: Any) -> Iterator[int]:
        plan = None
        if reader is not None:  # at the first index asked for: after a DataLoader's workers start
            plan, order = first_plan(order)
            if plan is not None:
                reader._plan_begins(plan)
        try:
            for index in order:
                self._position += 1
                yield index
        finally:  # the iteration ended or was dropped: a warm-up for it stops
            if plan is not None:
                reader._plan_ends(plan)
        resumed, self._resumed = self._resumed, None  # that epoch is complete
        if resumed is not None:
            self._position = self._length
        if self.auto_epoch is not False:
            self._finished = (self.epoch, resumed)
            self.epoch += 1
            self._position = 0

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """The epoch, seed and position to resume from, plus the settings they depend on.

        Args:
            position: How many of this epoch's indices were consumed on this rank. Defaults to
                how many the sampler has handed out, which under a DataLoader with workers runs
                ahead of the training loop by the prefetched batches: pass
                ``steps * batch_size`` to resume at the step the loop reached (in an epoch
                resumed on another world size, the steps since that resume). If the loader
                has already drawn the epoch's last indices (the sampler has moved on to the
                next epoch but no pass of it has begun), a non-zero position is one of the
                epoch that pass completed.

        Returns:
            A dict of plain values (JSON- and ``torch.save``-friendly). Every rank in lockstep
            holds the same state, so saving rank 0's and loading it everywhere is fine, also
            on another number of ranks (docs/elastic-resume.md). In an epoch resumed on
            another world size it also lists the epoch's ``stages`` (and has version 2).
        """
        epoch, resumed = self.epoch, self._pending or self._resumed
        if position is not None and position and self._finished is not None:
            # the pass ended (a DataLoader prefetched its last indices) and advanced the epoch,
            # but no pass of the next epoch began: the loop's position is in the finished one
            epoch, resumed = self._finished
        limit = self._length if resumed is None else resumed.stage.length
        pos = self._position if position is None else operator.index(position)
        if not 0 <= pos <= limit:
            raise ValueError(f"position must be in [0, {limit}], got {pos}")
        state = {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "epoch": epoch,
            "seed": self.seed,
            "position": pos,
            **self._settings(),
        }
        if resumed is not None:
            stages = resumed.at(pos).stages
            state.update(version=_STAGES_VERSION, stages=[s.to_dict() for s in stages])
        return state

    def _settings(self) -> dict[str, Any]:
        return {
            "num_replicas": self.num_replicas,
            "span": list(self.span),
            "length": self._length,
            "chunks": [self.chunking, self.chunksize, self._layout_crc()],
            "partition": self.partition,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "shufflefirst": self.shufflefirst,
            "mix": self.mix,
            "num_workers": self.num_workers if self.num_workers > 1 else 0,
            "batch_size": self.batch_size if self.num_workers > 1 else 1,
        }

    def _layout_crc(self) -> int:
        if self._cuts_crc is None:
            self._cuts_crc = _cuts_crc(self._cuts)
        return self._cuts_crc

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore epoch, seed and position: the next iteration yields the rest of that epoch.

        A state saved on another number of ranks (``num_replicas``) is resumed elastically:
        the indices no rank had consumed are split anew over this sampler's ranks
        (docs/elastic-resume.md).

        Raises:
            SamplerStateError: (a ``ValueError``) If the state is not a sampler state, or was
                saved over other data (shard lengths, range), with another seed or with
                settings that give a different order.
        """
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise SamplerStateError(f"not a {_STATE_FORMAT} dict")
        version = state.get("version")
        if version not in (_STATE_VERSION, _STAGES_VERSION):
            raise SamplerStateError(
                f"{_STATE_FORMAT} version {version!r} is not one this wids reads "
                f"({_STATE_VERSION}, {_STAGES_VERSION})"
            )
        mine = self._settings()
        plain = "stages" not in state and state.get("num_replicas") == self.num_replicas
        for key in _STATE_CHECKED if plain else _DATA_CHECKED:
            if state.get(key) != mine[key]:
                raise SamplerStateError(
                    f"sampler state was saved with {key}={state.get(key)!r}, "
                    f"this sampler has {key}={mine[key]!r}"
                    + (" (other data)" if key in ("span", "chunks") else "")
                )
        try:
            epoch, seed = operator.index(state["epoch"]), operator.index(state["seed"])
        except (KeyError, TypeError) as e:
            raise SamplerStateError(f"sampler state: no valid epoch and seed ({e})") from e
        if seed != self.seed:  # another order for this epoch and every later one
            raise SamplerStateError(
                f"sampler state was saved with seed={seed}, this sampler has seed={self.seed}"
            )
        stages = read_stages(state)
        if plain:
            resumed = None  # on the same world size: the same order, from the position
        elif stages[-1].replicas == self.num_replicas:  # a resumed stage, resumed again
            if len(stages) < 2:  # wids saves a one-stage epoch without 'stages'
                raise SamplerStateError(
                    "sampler state: 'stages' holds only the stage of this world size "
                    "(a resumed stage follows the epoch's first stage)"
                )
            resumed = _Resumed(self, epoch, seed, stages[:-1], stages[-1])
        else:
            resumed = _Resumed(self, epoch, seed, stages)
        self.epoch, self._finished = epoch, None
        self._pending = resumed
        last = stages[-1] if resumed is None else resumed.stage
        self._resume = self._position = last.position

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(span={self.span}, chunks={len(self.ranges)}, "
            f"rank={self.rank}/{self.num_replicas}, len={self._length}, epoch={self.epoch})"
        )
