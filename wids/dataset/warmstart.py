"""A DataLoader's start, made shorter: what the main process and each worker do before batch 0.

The DataLoader forks its workers and hands each its first batch only once all have started;
each then reads. When a DataLoader iterating the sampler's plan (the sampler that offered its
order, :mod:`wids.dataset.lookahead`) forks its workers (:func:`watch_forks`), two things are
done ahead of that:

- :func:`fetch_first_tables`: before the first worker is forked (main process), the member
  tables of the shards the plan starts with, from the sampler's state then, are fetched at
  once, so forked workers inherit them parsed instead of each fetching its first sidecars.
- :func:`_start_early`: a forked worker starts its lookahead on its predicted first batch as
  soon as it knows it is a worker, while the other workers start.

Both are only predictions: every batch received is checked against the plan as always, and
everything read early passes the same checks as any read.
"""

from __future__ import annotations

# Imported here, before this module registers its at-fork hook: before-fork hooks run last
# registered first, and the tables are fetched in one with a thread pool, whose module's own
# before-fork hook takes the lock that submitting a task needs. Registered after ours, it
# would hold that lock while ours submits, and the fork would hang.
import concurrent.futures.thread  # noqa: F401
import functools
import itertools
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..storage import is_local
from .lookahead import start_lookahead
from .prediction import PlannedBatches

if TYPE_CHECKING:
    from .catalog import Catalog

__all__ = ["fetch_first_tables", "watch_forks"]

log = logging.getLogger(__name__)


FIRST_ROUNDS = 2
"""Batches per worker that the DataLoader asks for at once when it starts (its
``prefetch_factor``'s default): the plan's first ``workers * FIRST_ROUNDS`` batches."""
FIRST_SHARDS = 32
"""Member tables fetched at most before the workers start (bounded for millions of shards)."""


def fetch_first_tables(catalog: Catalog, sampler: Any) -> None:
    """Main process: fetch the member tables of the shards the sampler's plan starts with.

    Called before a DataLoader over the sampler forks its first worker: the workers
    inherit the parsed tables instead of each fetching its first shards' sidecars on the
    way to its first batch (a round trip to the store and the client's set-up, on every worker
    at once). Tables come from the loaded index as any table does; the per-process first-touch
    checks of each shard are not affected (spawned workers, whose copy drops tables read from
    an index, fetch their own). At most :data:`FIRST_SHARDS` tables, all at once; only for a
    remote index with member tables. A plan that cannot be replayed, or a failed fetch, is
    left for the reads to meet.
    """
    order = getattr(sampler, "_planned_order", None)
    if not callable(order) or not catalog.remote_tables:
        return
    try:
        loaded = catalog.load()
        if loaded.indexed is None:
            return
        workers = max(1, int(getattr(sampler, "num_workers", 0) or 0))
        batch = max(1, int(getattr(sampler, "batch_size", 1) or 1))
        count = min(max(workers * batch * FIRST_ROUNDS, 256), 1 << 16)
        shards: dict[int, None] = {}
        for i in itertools.islice(order(), count):
            shards[loaded.locate(i)] = None
            if len(shards) >= FIRST_SHARDS:
                break
    except Exception as exc:  # the reads report what is wrong with the dataset
        log.debug("no member tables fetched ahead: %s", exc)
        return
    catalog.prefetch_members(shards, at_least=1)


EARLY_WAIT = 2.0
"""Seconds a forked child waits to learn whether it is a DataLoader worker."""


def watch_forks(pool: Any) -> None:
    """Main process: each DataLoader iteration over the pool's sampler starts early.

    Registered once per pool (``os.register_at_fork``). Before each fork of this process,
    :func:`_forking_loader` finds the DataLoader iterator that forks (its ``__init__`` starting
    its workers, in the caller's frames). Only if that loader iterates the sampler that offered
    its order (``pool.plan``):

    - before its first worker is forked, :func:`fetch_first_tables` fetches the member tables
      of the shards the sampler's plan starts with, from the sampler's state at that moment
      (its epoch, a loaded state's position): every forked worker inherits them parsed;
    - each forked worker starts a thread that waits (at most :data:`EARLY_WAIT` s) to learn
      it is a DataLoader worker of this dataset, then starts its lookahead on its predicted
      first batch, which reads while the other workers start (see :func:`_start_early`).

    A loader over another sampler (or none found: torch's internals changed, another
    framework's fork) gets neither: reads happen as without this. Spawned workers fork
    nothing: they start at their first batch.
    """
    register = getattr(os, "register_at_fork", None)
    if register is None or pool.__dict__.get("_watching_forks"):
        return
    pool._watching_forks = True
    state = _Forks(weakref.ref(pool))
    register(
        before=functools.partial(_before_fork, state),
        after_in_parent=functools.partial(_after_fork, state),
        after_in_child=functools.partial(_forked, state),
    )


class _Forks:
    """What the fork handlers of one pool know (kept beside the pool: never pickled with it)."""

    __slots__ = ("early", "fetched_for", "pool")

    def __init__(self, pool: Callable[[], Any]) -> None:
        self.pool = pool
        self.early = False  # the fork under way is a worker of a loader over the pool's plan
        self.fetched_for: Callable[[], Any] | None = None  # the loader iterator fetched for


def _forking_loader() -> Any:
    """The torch DataLoader iterator whose ``__init__`` is forking a worker now, or ``None``."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(32):  # iterator.__init__ -> Process.start -> ... -> os.fork -> the hook
        if frame is None:
            return None
        if frame.f_code.co_name == "__init__":
            it = frame.f_locals.get("self")
            if type(it).__name__.endswith("DataLoaderIter"):
                return it
        frame = frame.f_back
    return None


def _before_fork(state: _Forks) -> None:
    pool: Any = state.pool()
    state.early = False
    if pool is None or pool.plan is None or "torch" not in sys.modules:
        return
    try:
        it = _forking_loader()
        index_sampler = getattr(it, "_index_sampler", None)
        if getattr(index_sampler, "sampler", index_sampler) is not pool.plan:
            return  # not a DataLoader, or one over another sampler: nothing is predicted
        state.early = True
        if state.fetched_for is not None and state.fetched_for() is it:
            return  # fetched before this iteration's first worker was forked
        state.fetched_for = weakref.ref(it)
        fetch_first_tables(pool.catalog, pool.plan)
    except Exception as exc:  # the reads do it as without this
        log.debug("no early start: %s", exc)


def _after_fork(state: _Forks) -> None:
    state.early = False  # the next fork decides again


def _forked(state: _Forks) -> None:
    if not state.early:
        return
    state.early = False
    threading.Thread(
        target=_start_early, args=(state.pool,), name="wids-lookahead-early", daemon=True
    ).start()


def _start_early(ref: Callable[[], Any]) -> None:
    """In a forked worker: start the lookahead on the predicted first batch, unless it exists.

    torch sets the worker's info before it calls the loader's ``worker_init_fn``, so this
    runs beside that function (torch tells no end of it): the early reads use the dataset as
    the parent forked it, whatever that function changes meanwhile (a ``worker_init_fn`` that
    changes how shards are read should build the sampler after it, or use spawned workers).
    """
    from torch.utils.data import get_worker_info

    deadline = time.monotonic() + EARLY_WAIT
    while (info := get_worker_info()) is None:
        if time.monotonic() > deadline:
            return  # not a DataLoader worker
        time.sleep(0.001)
    pool: Any = ref()
    dataset: Any = info.dataset
    if pool is None or not _holds(dataset, pool):
        return  # a worker of another dataset (or of a wrapper of this one)
    try:
        dataset._check_process()  # under a lock: the worker's first batch checks too
        size = int(getattr(pool.plan, "batch_size", 0) or 0)
        plan = PlannedBatches(pool.plan)
        first = plan.begin(size) if size > 1 else None
        if not first:
            return
        located = pool.catalog.locate(first[0])
        if is_local(pool.catalog.load().infos[located[1]].url):
            return  # local shards are read in place: nothing to read ahead
        with pool._lock:  # the first batch's read makes its own under it (ReaderPool._ahead)
            if pool._lookahead is not None:
                return  # the first batch came first: nothing was started here
            ahead = start_lookahead(pool, [located], plan)
            ahead.merge_gap = dataset.merge_gap
            # the first batch only (the others start once it is read), planned in the
            # lookahead's own thread; scheduled before it is seen, so the first batch's
            # observe waits for that planning: one thread walks the plan at a time
            ahead.schedule_soon(depth=1)
            pool._lookahead = ahead
    except Exception as exc:  # the reads start the lookahead as without this
        log.debug("no early lookahead: %s", exc)


def _holds(dataset: Any, pool: Any) -> bool:
    """Whether ``dataset`` is the ``ShardListDataset`` that owns ``pool``."""
    return getattr(dataset, "_pool", None) is pool
