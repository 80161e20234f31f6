"""Gathering ``ds.stats`` from DataLoader workers: :class:`WorkerStats`.

A dataset's counters (:class:`~wids.dataset.stats.DatasetStats`) live in the process that
reads: with ``num_workers > 0``, in each worker's copy of the dataset, which the main process
never sees. :meth:`WorkerStats.collate` wraps the loader's collate function so that every
batch carries its worker's counters as a value; :meth:`WorkerStats.batches` takes them off again
and keeps the latest of each worker (the counters only grow). No hook, no shared state: the
counters travel with the batches the DataLoader already sends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .stats import DatasetStats

__all__ = ["WorkerStats"]

_MAIN = -1  # the worker id of batches collated in the main process (num_workers=0)


class _StatsCollate:
    """A picklable collate function: ``(collate(samples), (worker id, its ds.stats))``."""

    def __init__(self, collate: Callable[[list[Any]], Any] | None) -> None:
        self.collate = collate

    def __call__(self, samples: list[Any]) -> tuple[Any, tuple[int, DatasetStats | None]]:
        from torch.utils.data import default_collate, get_worker_info

        batch = (self.collate or default_collate)(samples)
        info = get_worker_info()
        if info is None:  # the main process: its dataset is the caller's ds (ds.stats)
            return batch, (_MAIN, None)
        return batch, (info.id, getattr(info.dataset, "stats", None))


class WorkerStats:
    """The read counters of a DataLoader's workers, gathered from the batches they send.

    Example:
        >>> stats = WorkerStats()
        >>> loader = DataLoader(ds, batch_size=32, num_workers=4,
        ...                     collate_fn=stats.collate())  # doctest: +SKIP
        >>> for batch in stats.batches(loader):  # doctest: +SKIP
        ...     train(batch)
        >>> stats.total()  # doctest: +SKIP
        DatasetStats(samples=10000, accesses=10000, misses=24, requests=31, ...)

    ``per_worker`` maps each worker id to its latest counters. Persistent workers keep
    counting across epochs; new workers (the default) start from zero each epoch, so
    :meth:`total` after an epoch is that epoch's. With ``num_workers=0`` the counters are the
    dataset's own: pass ``ds`` to :meth:`total`.
    """

    def __init__(self) -> None:
        self.per_worker: dict[int, DatasetStats] = {}

    def collate(
        self, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> Callable[[list[Any]], Any]:
        """A ``collate_fn`` for the DataLoader: ``collate_fn`` (default: torch's) + the counters.

        It is picklable (spawn and forkserver workers) if ``collate_fn`` is.
        """
        return _StatsCollate(collate_fn)

    def take(self, item: tuple[Any, tuple[int, DatasetStats | None]]) -> Any:
        """One loader item: record its counters, return the batch."""
        batch, (worker, stats) = item
        if stats is not None:
            self.per_worker[worker] = stats
        return batch

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The loader's batches, without the counters (recorded on the way)."""
        for item in loader:
            yield self.take(item)

    def total(self, dataset: Any = None) -> DatasetStats:
        """The counters of every worker seen, plus ``dataset.stats`` if a dataset is given."""
        result = DatasetStats(0, 0, 0, 0, 0, 0, 0, 0)
        for stats in self.per_worker.values():
            result = result + stats
        own = getattr(dataset, "stats", None) if dataset is not None else None
        return result + own if isinstance(own, DatasetStats) else result
