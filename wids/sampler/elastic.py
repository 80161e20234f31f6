"""Resuming an epoch on another world size: what was consumed, what is left, who reads it.

An epoch on ``R`` ranks is ``R`` orders of ``L`` indices each: rank ``r``'s order is what a
sampler with ``num_replicas=R, rank=r`` yields, and the whole epoch is their concatenation in
rank order (``R * L`` *slots*). Slots past the end of the range are padding
(``drop_last=False``: the wrapped-around copies that make every rank ``L`` long).

Ranks of a DDP job move in lockstep, so a checkpoint at global step ``k`` with batch size ``B``
means every rank consumed the first ``p = k * B`` indices of its order: one ``(R, L, p)`` triple,
a *stage*, describes what the whole job consumed, and the state of any one rank is enough (the
orders are recomputed from seed, epoch and the settings).

Resuming on ``R'`` ranks starts a new stage over the *rest* of the epoch: the slots each old rank
had not consumed (positions ``p ..  L`` of its order), concatenated in rank order, without the
padding copies and without the indices a copy of which was consumed (so nothing consumed is
read again). Only the at most ``2 * (R - 1)`` slots that are copies or have one are ever
tracked: the first and last ranks' orders are replayed up to ``p`` to see which were read.
That sequence of ``T`` indices is cut into ``R'`` consecutive slices of ``L' = ceil(T / R')``
(``floor`` with ``drop_last``), the last ones wrapping around to its start as a fresh epoch's
do. Consecutive slices of consecutive orders keep each rank's reads inside
the chunks (shards) the old orders were reading. A stage can itself be checkpointed and
resumed on yet another world size: the next rest is made of the same slots, in the same way.

Only the stage the sampler is reading is ever generated; the rest of an old rank's order is
found by replaying that order up to the consumed position, as a plain resume does.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..errors import SamplerStateError
from .chunks import _BIG, Range, _cyclic_segments
from .workers import _interleave

__all__: list[str] = []

# bounds on what a state may ask for (a real job is far below them)
_MAX_RANKS = 1 << 17  # all stages' ranks together (a rank replayed costs ~100 indices' time)
_MAX_STAGES = 1024
_MAX_WORKERS = 1 << 10  # per rank: a replay costs a step per worker for each chunk
_MAX_REPLAY = 1 << 26  # indices replayed to find the padding copies read (~20 s)
_RANK_COST = 512  # a replayed rank's own cost, in indices (~65 us each)


@dataclasses.dataclass(frozen=True, slots=True)
class _Stage:
    """One world size's part of an epoch: ``replicas`` orders of ``length``, ``position`` read."""

    replicas: int
    length: int
    position: int
    num_workers: int = 0  # the worker-aware settings the first stage's orders were made with
    batch_size: int = 1

    def to_dict(self) -> dict[str, int]:
        return {
            "num_replicas": self.replicas,
            "length": self.length,
            "position": self.position,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
        }

    @classmethod
    def from_dict(cls, value: Any) -> _Stage:
        try:
            stage = cls(
                replicas=operator.index(value["num_replicas"]),
                length=operator.index(value["length"]),
                position=operator.index(value["position"]),
                num_workers=operator.index(value.get("num_workers", 0)),
                batch_size=operator.index(value.get("batch_size", 1)),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise SamplerStateError(f"sampler state: a malformed stage {value!r}") from e
        if stage.replicas < 1 or stage.num_workers < 0 or stage.batch_size < 1:
            raise SamplerStateError(f"sampler state: a malformed stage {value!r}")
        if not 0 <= stage.position <= stage.length:
            raise SamplerStateError(
                f"sampler state: position {stage.position} outside [0, {stage.length}]"
            )
        return stage


def _per_rank(total: int, replicas: int, drop_last: bool) -> int:
    return total // replicas if drop_last else -(-total // replicas)


class _Resumed:
    """An epoch resumed on another world size: the stages done, and the one being read.

    Args:
        sampler: The sampler that reads the current stage (its settings make the first
            stage's orders).
        epoch: The epoch.
        seed: The seed of the orders.
        done: The first stage (the epoch on its original world size), then one per earlier
            resume, each with the position its ranks had consumed.
        current: The stage being read; ``None``: ``sampler``'s world size from position 0.

    Raises:
        SamplerStateError: If a stage's length is not the one its world size gives.
    """

    def __init__(
        self,
        sampler: Any,  # a ChunkedSampler (which imports this module)
        epoch: int,
        seed: int,
        done: Sequence[_Stage],
        current: _Stage | None = None,
    ) -> None:
        self.sampler, self.epoch, self.seed = sampler, epoch, seed
        lo, hi = sampler.span
        first = done[0]
        self._first, self._n = first, hi - lo
        if first.length != _per_rank(self._n, first.replicas, sampler.drop_last):
            raise SamplerStateError(
                f"sampler state: {first.length} indices per rank cannot be an epoch of "
                f"{self._n} on {first.replicas} ranks"
            )
        # the rest after the first stage: old rank r's unread slots, without the padding
        # copies and without the samples a copy of which was read
        self._extra = max(0, first.replicas * first.length - self._n)  # padding slots
        marked = self._marked_ranks()
        self._check_replay(marked)
        seen = {r: self._read_marks(r) for r in marked}
        self._marked = set(seen)
        self._consumed = {slot % self._n for marks in seen.values() for slot in marks}
        heads = [
            first.length - first.position - self._dropped(r, seen.get(r, set()))
            for r in range(first.replicas)
        ]
        self._starts = list(itertools.accumulate(heads, initial=0))
        # each later stage's sequence, as ranges of positions in that first rest
        ranges: list[Range] = [(0, self._starts[-1])] if self._starts[-1] else []
        for stage in done[1:]:
            total = self._check(stage, ranges)
            starts = _starts(ranges)
            ranges = [
                piece
                for a, b in _unread(total, stage.replicas, stage.length, stage.position)
                for piece in _take(ranges, a, b, starts)
            ]
        self._ranges, self._range_starts = ranges, _starts(ranges)
        self.total = sum(b - a for a, b in ranges)
        """How many indices the current stage splits over its ranks."""
        if current is None:
            replicas = sampler.num_replicas
            current = _Stage(replicas, _per_rank(self.total, replicas, sampler.drop_last), 0)
        self._check(current, ranges)
        self.stages = (*done, current)
        """Every stage, the current one last."""

    @property
    def stage(self) -> _Stage:
        """The stage being read."""
        return self.stages[-1]

    def _check(self, stage: _Stage, ranges: list[Range]) -> int:
        total = sum(b - a for a, b in ranges)
        if stage.length != _per_rank(total, stage.replicas, self.sampler.drop_last):
            raise SamplerStateError(
                f"sampler state: a resumed stage of {stage.length} indices per rank cannot "
                f"split {total} indices over {stage.replicas} ranks"
            )
        return total

    def at(self, position: int) -> _Resumed:
        """The same stages, the current one read up to ``position``."""
        other = copy.copy(self)
        last = self.stages[-1]
        other.stages = (*self.stages[:-1], dataclasses.replace(last, position=position))
        return other

    def _marks(self, rank: int) -> list[int]:
        """Old ``rank``'s slots that are padding copies or have one (at most ``2 * (R - 1)``)."""
        first, n = self._first, self._n
        a, b = rank * first.length, (rank + 1) * first.length
        return [*range(a, min(b, self._extra, n)), *range(max(a, n), b)]

    def _marked_ranks(self) -> list[int]:
        """The old ranks holding marked slots: the first and the last ones."""
        first = self._first
        return [r for r in range(first.replicas) if self._extra and self._marks(r)]

    def _replays(self) -> bool:
        """Whether finding the read marks replays the old orders (else: arithmetic)."""
        return self.sampler.partition == "block" or self._first.num_workers > 1

    def _check_replay(self, marked: list[int]) -> None:
        """Refuse a state whose marked ranks would take too long to replay (a forged one).

        Each marked rank's order is replayed up to the position; a global order is generated
        from the epoch's start up to that rank's slice. More ranks than samples make most ranks
        marked: work that grows with ranks times samples, not with the job.
        """
        if not self._replays():
            return
        first, n = self._first, self._n
        block = self.sampler.partition == "block"
        cost = 0
        for r in marked:
            cost += _RANK_COST + first.position + (0 if block else min(n, r * first.length))
            if cost > _MAX_REPLAY:
                raise SamplerStateError(
                    f"sampler state: {len(marked)} of its {first.replicas} ranks hold padding "
                    f"copies of {n} samples; replaying them is more than {_MAX_REPLAY} indices "
                    "(a state of far more ranks than samples)"
                )

    def _read_marks(self, rank: int) -> set[int]:
        """The marked slots among old ``rank``'s consumed indices."""
        first = self._first
        if not self._replays():  # a global slice read in order: slot g is at g - rank * length
            start = rank * first.length
            return {g for g in self._marks(rank) if g - start < first.position}
        head = itertools.islice(self._old_order(rank), self._first.position)
        return {i.slot for i in head if type(i) is _Slot}

    def _dropped(self, rank: int, read: set[int]) -> int:
        """How many of old ``rank``'s unread indices the rest leaves out."""
        return sum(1 for slot in self._marks(rank) if slot not in read and self._drops(slot))

    def _drops(self, slot: int) -> bool:
        """Whether the rest leaves out the (unread) index in ``slot``: a copy, or read as one."""
        return slot >= self._n or slot in self._consumed

    def _old_order(self, rank: int, pieces: Iterable[list[int]] | None = None) -> Iterator[int]:
        """Old ``rank``'s order in the first stage, marked slots as :class:`_Slot`.

        ``pieces``: that rank's slice, if already cut from a pass over several ranks.
        """
        first, n = self._first, self._n
        if pieces is None:
            pieces = self._replica(rank)._pieces()
        marks = self._marks(rank) if self._extra else []
        if marks and self.sampler.partition == "block":  # slot g holds index lo + g % n
            lo = self.sampler.span[0]
            by_index = {lo + g % n: g for g in marks}  # a rank's slots hold distinct indices
            pieces = ([_Slot(i, by_index[i]) if i in by_index else i for i in p] for p in pieces)
        elif marks:  # global slices: slot g is position g - rank * length of the slice
            pieces = _marked(pieces, {g - rank * first.length: g for g in marks})
        if first.num_workers > 1:
            return _interleave(pieces, first.num_workers, first.batch_size)
        return itertools.chain.from_iterable(pieces)

    def _replica(self, rank: int) -> Any:
        first = self._first
        return self.sampler._replica(
            first.replicas, rank, self.epoch, self.seed, first.num_workers, first.batch_size
        )

    def _global_orders(self, r0: int, r1: int) -> Iterator[tuple[int, Iterator[int]]]:
        """Old ranks ``r0 .. r1``'s orders (not block), from one pass over the epoch's order.

        Each rank's order alone is made from the epoch's start up to its slice: a new rank
        whose slice spans many old ranks would redo that pass for each of them.
        """
        length = self._first.length
        cut = _cut(self._replica(r0)._pieces(r1 - r0 + 1), length)
        for rank in range(r0, r1 + 1):
            yield rank, self._old_order(rank, next(cut))

    def _first_rest(self, parts: list[Range]) -> Iterator[int]:
        """Positions ``parts`` (increasing ranges) of the first stage's rest.

        Each old rank's order is replayed once for all the parts it holds (a stage of many
        ranks leaves the rest in as many parts), and the orders of consecutive old ranks of a
        global order are cut from one pass over the epoch's order.
        """
        if not parts:
            return
        first, starts = self._first, self._starts
        lo = bisect.bisect_right(starts, parts[0][0]) - 1  # the old rank holding a position
        hi = bisect.bisect_right(starts, parts[-1][1] - 1) - 1
        orders: Iterator[tuple[int, Iterator[int]]]
        if self.sampler.partition != "block" and self._n <= _BIG and lo < hi:
            orders = self._global_orders(lo, hi)
        else:
            orders = ((r, self._old_order(r)) for r in range(lo, hi + 1))
        kept: Iterator[int] = iter(())
        rank, at = -1, 0
        for a, b in parts:
            while a < b:
                r = bisect.bisect_right(starts, a) - 1
                offset, stop = a - starts[r], min(b, starts[r + 1])
                if r != rank or offset < at:  # the ranks in between with nothing left: passed
                    found = None if r <= rank else next((o for q, o in orders if q == r), None)
                    order = self._old_order(r) if found is None else found
                    unread = itertools.islice(order, first.position, None)
                    kept = unread  # a rank without copies or indices that have one
                    if r in self._marked:
                        kept = (
                            int(i)
                            for i in unread
                            if type(i) is not _Slot or not self._drops(i.slot)
                        )
                    rank, at = r, 0
                yield from itertools.islice(kept, offset - at, offset - at + stop - a)
                at, a = offset + stop - a, stop

    def order(self, rank: int, start: int) -> Iterator[int]:
        """``rank``'s indices of the stage being read, from its position ``start``."""
        stage, total = self.stages[-1], self.total
        count = stage.length - start
        if count <= 0 or not total:
            return iter(())
        positions = _cyclic_segments(0, total, rank * stage.length + start, count)
        return itertools.chain.from_iterable(
            self._first_rest(_take(self._ranges, a, b, self._range_starts)) for a, b in positions
        )


def _cut(pieces: Iterable[list[int]], size: int) -> Iterator[list[list[int]]]:
    """``pieces`` as consecutive groups of ``size`` indices, pieces split at the group ends."""
    group: list[list[int]] = []
    filled = 0
    for piece in pieces:
        at = 0
        while at < len(piece):
            part = piece[at : at + size - filled]
            group.append(part)
            filled += len(part)
            at += len(part)
            if filled == size:
                yield group
                group, filled = [], 0
    if group:
        yield group


def _starts(ranges: Sequence[Range]) -> list[int]:
    """Where each of ``ranges`` starts in their concatenation (and its length, last)."""
    return list(itertools.accumulate((b - a for a, b in ranges), initial=0))


def _take(ranges: Sequence[Range], a: int, b: int, starts: Sequence[int]) -> list[Range]:
    """Positions ``[a, b)`` of the concatenation of ``ranges`` (``starts``: theirs), as ranges.

    Found by bisection: a stage of many ranks leaves as many ranges, taken one by one.
    """
    out: list[Range] = []
    k = max(0, bisect.bisect_right(starts, a) - 1)
    while k < len(ranges) and starts[k] < b:
        (lo, hi), pos = ranges[k], starts[k]
        x, y = max(a, pos), min(b, pos + hi - lo)
        if x < y:
            out.append((lo + x - pos, lo + y - pos))
        k += 1
    return out


class _Slot(int):
    """An index of an old rank's order that is a padding copy or has one, with its slot."""

    slot: int

    def __new__(cls, value: int, slot: int) -> _Slot:  # noqa: D102
        self = int.__new__(cls, value)
        self.slot = slot
        return self


def _marked(pieces: Iterable[list[int]], marks: dict[int, int]) -> Iterator[list[int]]:
    """``pieces`` with the index at each position ``p`` of ``marks`` as ``_Slot(i, marks[p])``."""
    todo = sorted(marks)
    k, pos = 0, 0
    for piece in pieces:
        end = pos + len(piece)
        if k < len(todo) and todo[k] < end:
            piece = list(piece)
            while k < len(todo) and todo[k] < end:
                piece[todo[k] - pos] = _Slot(piece[todo[k] - pos], marks[todo[k]])
                k += 1
        yield piece
        pos = end


def _unread(total: int, replicas: int, length: int, position: int) -> list[Range]:
    """The positions of a stage's sequence of ``total`` that its rest keeps, as ranges.

    Each rank's unread part of its slice, without the padding copies (positions past
    ``total``) and without the positions a copy of which was read.
    """
    read = set()
    for g in range(total, replicas * length):  # the copies: at most replicas - 1
        if g % length < position:
            read.add(g % total)
    holes = sorted(read)
    kept: list[Range] = []
    for r in range(replicas):
        a, b = min(total, r * length + position), min(total, (r + 1) * length)
        for q in holes[bisect.bisect_left(holes, a) : bisect.bisect_left(holes, b)]:
            if a < q:
                kept.append((a, q))
            a = q + 1
        if a < b:
            kept.append((a, b))
    return kept


def read_stages(state: dict[str, Any]) -> list[_Stage]:
    """The stages of a sampler state (one for a state of a plain epoch).

    Loading costs work per rank of every stage: a state beyond :data:`_MAX_RANKS` ranks in
    all, :data:`_MAX_STAGES` stages or :data:`_MAX_WORKERS` workers is refused, not worked on.
    """
    stages = state.get("stages")
    if stages is None:
        stages = [state]
    if not isinstance(stages, list) or not 0 < len(stages) <= _MAX_STAGES:
        raise SamplerStateError(f"sampler state: 'stages' must be a list of 1 to {_MAX_STAGES}")
    result = [_Stage.from_dict(s) for s in stages]
    if sum(s.replicas for s in result) > _MAX_RANKS:
        raise SamplerStateError(f"sampler state: more than {_MAX_RANKS} ranks in its stages")
    if any(s.num_workers > _MAX_WORKERS for s in result):
        raise SamplerStateError(f"sampler state: more than {_MAX_WORKERS} workers")
    return result
