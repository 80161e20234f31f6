"""Which batches a process will be given: predicted from the sampler's order, checked.

A DataLoader worker holds a copy of the sampler that offered its order to the dataset (see
:mod:`wids.dataset.lookahead`); batch ``k`` of an epoch goes to worker ``k % num_workers``.
:class:`PlannedBatches` predicts this process's batches, compares every batch received with
the prediction, follows persistent workers into later epochs, and turns itself off on a batch
that fits no prediction.
"""

from __future__ import annotations

import itertools
import sys
from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = ["PlannedBatches"]


def _worker() -> tuple[int, int] | None:
    """``(worker id, number of workers)`` in a DataLoader worker, else ``None``."""
    if "torch" not in sys.modules:
        return None
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return None if info is None else (info.id, info.num_workers)


class PlannedBatches:
    """The batches this process will be given, predicted from a sampler and checked.

    Args:
        sampler: A sampler with ``_planned_order(start)`` (the samplers of ``wids.sampler``).
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.ok = callable(getattr(sampler, "_planned_order", None))
        self._batches: Iterator[list[int]] | None = None
        self._ahead: deque[list[int]] = deque()
        self.seen = 0  # batches received so far (the number of the next one)
        self.size = 0  # the batch size (of the first batch)
        self._retry_at: int | None = None  # main process: the sampler position of a mismatch
        self.epoch = int(getattr(sampler, "epoch", 0))  # the epoch predicted (workers)
        self.generation = 0  # how often a worker moved on to another epoch's prediction
        self._early = False  # begun before the first batch, with the sampler's batch size

    def observe(self, batch: list[int]) -> bool:
        """Check ``batch`` against the prediction; ``False`` if it differs.

        In a worker a mismatch turns the prediction off for good (its copy of the sampler is
        stale); in the main process the live sampler is asked again once it has moved on.
        """
        if not self.ok:
            if self._retry_at is None or self._retry_at == self._position():
                return False
            self.ok = True
        if self._batches is None:
            self.size = len(batch)
            self._batches = self._start(self.size)
        expected = self._ahead.popleft() if self._ahead else next(self._batches, None)
        if expected != batch and self._early:  # the loader's batch size is not the sampler's
            self._ahead.clear()
            self.generation += 1  # what was read for the early prediction is dropped
            self.size = len(batch)
            self._batches = self._start(self.size)
            expected = next(self._batches, None)
        self._early = False
        if expected != batch and self._follow(batch):
            expected = batch
        if expected != batch:
            self.ok = False
            self._ahead.clear()
            self._batches = None
            self._retry_at = self._position() if _worker() is None else None
            return False
        self.seen += 1
        return True

    def begin(self, size: int) -> list[int] | None:
        """A worker, before its first batch: predict its batches of ``size`` (the sampler's).

        Returns:
            The predicted first batch, or ``None`` (not a worker, or nothing to predict). If
            the first batch received differs, :meth:`observe` predicts again from it.
        """
        if not self.ok or self._batches is not None or size < 1 or _worker() is None:
            return None
        self.size, self._batches, self._early = size, self._start(size), True
        first = self.upcoming(1)
        return first[0] if first else None

    def _follow(self, batch: list[int]) -> bool:
        """A worker: predict from the epoch whose first batch for this worker is ``batch``.

        Tries the next epochs of the sampler and the same epoch again (persistent workers keep
        a copy of the sampler from the epoch they started in).
        """
        where = _worker()
        if where is None:
            return False
        for epoch in (self.epoch + 1, self.epoch, self.epoch + 2, self.epoch + 3):
            order = self.sampler._planned_order(0, epoch=epoch)
            batches = _batches_of(order, self.size, where[0], where[1])
            if next(batches, None) == batch:
                self.epoch, self._batches = epoch, batches
                self._ahead.clear()
                self.generation += 1
                return True
        return False

    def _position(self) -> int:
        return int(getattr(self.sampler, "_position", 0))

    def upcoming(self, n: int) -> list[list[int]]:
        """The next ``n`` predicted batches (fewer at the end of the epoch)."""
        if not self.ok or self._batches is None:
            return []
        while len(self._ahead) < n:
            nxt = next(self._batches, None)
            if nxt is None:
                break
            self._ahead.append(nxt)
        return list(itertools.islice(self._ahead, n))

    def _start(self, size: int) -> Iterator[list[int]]:
        where = _worker()
        if where is None:  # the main process: the live sampler has just handed out this batch
            worker, workers = 0, 1
            start = self._position() - size
            if start < 0:  # not a batch this sampler handed out
                return iter(())
        else:  # a worker's copy of the sampler, as it was when the workers started
            worker, workers, start = where[0], where[1], None
        order = self.sampler._planned_order(start)
        return _batches_of(order, size, worker, workers)


def _batches_of(order: Iterator[int], size: int, worker: int, workers: int) -> Iterator[list[int]]:
    """Batches ``worker, worker + workers, ...`` of ``order`` cut into batches of ``size``."""
    for k in itertools.count():
        batch = list(itertools.islice(order, size))
        if not batch:
            return
        if k % workers == worker:
            yield batch
