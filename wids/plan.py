"""What comes next in a sampler's order, carried by the indices the sampler hands out.

The owner of the order is the sampler: it knows, while it hands out index ``p`` of an
iteration, the indices that follow. It says so explicitly: each index it hands out is a
:class:`PlannedIndex`, an ``int`` that also carries a :class:`Plan` (a bounded window of the
iteration's order) and its own position in the iteration. A batch of them reaches the dataset
through whatever stands between (torch's ``BatchSampler``, a DataLoader worker under any start
method, ``in_order=False``, persistent workers, a resumed ``StatefulDataLoader``): whichever
process reads the batch learns where it stands in the order and what follows, from the batch
itself. Nothing is predicted from a copy of the sampler, and two samplers over one dataset each
carry their own plan.

A reader may use a plan to read ahead (:mod:`wids.dataset.lookahead`); what it reads early is
checked like any read, and a plan only ever changes when bytes are fetched, never which
samples a batch holds.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["STEP", "Plan", "PlannedIndex", "first_plan", "planned_order", "plan_of", "shard_shares"]

STEP = 2048
"""A plan is made every ``STEP`` positions and covers ``2 * STEP`` of them: every index sees at
least ``STEP`` positions ahead (but at the end of the iteration)."""


class Plan:
    """A window of one sampler iteration's order.

    Args:
        token: Tells iterations apart (a random 62-bit number per iteration).
        start: The position in the iteration of ``order[0]``.
        order: The indices from ``start`` on (int32 or int64; at most ``2 * STEP``).
    """

    __slots__ = ("order", "start", "token")

    def __init__(self, token: int, start: int, order: np.ndarray) -> None:
        self.token = token
        self.start = start
        self.order = order

    def __reduce__(self) -> tuple[Any, ...]:
        return (Plan, (self.token, self.start, self.order))

    @property
    def end(self) -> int:
        """The position after the last one the window holds."""
        return self.start + len(self.order)

    def batch(self, position: int, size: int) -> list[int] | None:
        """The ``size`` indices from ``position`` on, or ``None`` if the window ends earlier."""
        if position < self.start or position + size > self.end:
            return None
        lo = position - self.start
        return self.order[lo : lo + size].tolist()  # type: ignore[no-any-return]

    def ahead(self, position: int, count: int) -> np.ndarray:
        """Up to ``count`` indices from ``position`` on (fewer where the window ends)."""
        lo = max(0, position - self.start)
        return self.order[lo : lo + count]

    def __repr__(self) -> str:
        return f"Plan(token={self.token:#x}, positions={self.start}..{self.end})"


class PlannedIndex(int):
    """A sample index (an ``int`` everywhere) that knows where it is in its sampler's order.

    Attributes:
        plan: The window of the order around it.
        position: Its position in the iteration.
    """

    plan: Plan
    position: int

    def __new__(cls, value: int, plan: Plan, position: int) -> PlannedIndex:  # noqa: D102
        self = int.__new__(cls, value)
        self.plan = plan
        self.position = position
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlannedIndex, (int(self), self.plan, self.position))


def plan_of(batch: Any) -> tuple[Plan, int] | None:
    """``(plan, position of the batch's first index)`` if the batch carries a plan."""
    try:
        first = batch[0]
    except (IndexError, KeyError, TypeError):
        return None
    if type(first) is not PlannedIndex:
        return None
    return first.plan, first.position


def planned_order(indices: Iterator[int], start: int) -> Iterator[int]:
    """``indices`` (an iteration's order from position ``start``) as :class:`PlannedIndex`.

    The order is taken ``STEP`` indices at a time, one window ahead of the indices handed out.
    """
    token = int.from_bytes(os.urandom(8), "little") >> 2
    base = start
    window = np.fromiter(itertools.islice(indices, 2 * STEP), dtype=np.int64)
    while len(window):
        # sent with every batch: half the bytes where the indices allow
        small = int(window.max()) < 1 << 31 and int(window.min()) >= 0
        plan = Plan(token, base, window.astype(np.int32) if small else window)
        values = window[:STEP].tolist()
        for k, value in enumerate(values):
            yield PlannedIndex(value, plan, base + k)
        more = np.fromiter(itertools.islice(indices, STEP), dtype=np.int64)
        window = np.concatenate([window[STEP:], more]) if len(more) else window[STEP:]
        base += len(values)


def first_plan(order: Iterator[int]) -> tuple[Plan | None, Iterator[int]]:
    """The first plan of a :func:`planned_order` iteration, and the iteration, whole.

    The sampler that owns the order tells its dataset, in the process that iterates it, the
    window an iteration begins with (``ShardListDataset._plan_begins``): under a DataLoader that
    is the main process, right after it started its workers.
    """
    first = next(order, None)
    if first is None:
        return None, iter(())
    plan = first.plan if type(first) is PlannedIndex else None
    return plan, itertools.chain((first,), order)


def shard_shares(
    plan: Plan,
    position: int,
    count: int,
    shard_of: Callable[[int], int],
    lengths: Sequence[int],
    least: float,
) -> dict[int, float]:
    """The shards ``count`` positions of ``plan`` from ``position`` read a large part of.

    Returns:
        Shard -> the share of its samples read there, for shares of at least ``least``, in
        the order the shards are first read.
    """
    counts: dict[int, int] = {}
    for i in plan.ahead(position, count).tolist():
        shard = shard_of(i)
        counts[shard] = counts.get(shard, 0) + 1
    return {s: n / lengths[s] for s, n in counts.items() if n >= least * lengths[s]}
