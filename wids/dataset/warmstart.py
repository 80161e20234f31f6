"""A DataLoader's start, made shorter: what the main process and each worker do before batch 0.

The DataLoader forks its workers and hands each its first batch only once all have started;
each then reads. Two things are done ahead of that, from the sampler's plan (the sampler that
offered its order, :mod:`wids.dataset.lookahead`):

- :func:`fetch_first_tables`: when the sampler offers its order (main process, before any
  worker exists), the member tables of the shards its plan starts with are fetched at once,
  so forked workers inherit them parsed instead of each fetching its first sidecars.
- :func:`watch_forks`: a forked worker starts its lookahead on its predicted first batches
  as soon as it knows it is a worker, while the other workers start.

Both are only predictions: every batch received is checked against the plan as always, and
everything read early passes the same checks as any read.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
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

    Called when a sampler offers its order, before any DataLoader worker exists: workers forked
    later inherit the parsed tables instead of each fetching its first shards' sidecars on the
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
    """Main process: DataLoader workers forked from now on read their first batches early.

    The DataLoader hands a worker its first batch only once every worker has started (tens of
    ms each). A worker knows that batch before: it is in the sampler's plan (the sampler's
    ``batch_size``, the worker's id). So each forked child of this process starts a thread
    that waits (at most :data:`EARLY_WAIT` s) to learn it is a DataLoader worker of this
    dataset, then starts its lookahead on the predicted first batches, which read while the
    other workers start. The batches received are checked as always: a batch size other than
    the sampler's drops what was read early and predicts again from the batch received.
    Spawned workers start as before (at their first batch). Registered once per pool.
    """
    register = getattr(os, "register_at_fork", None)
    if register is None or pool.__dict__.get("_watching_forks"):
        return
    pool._watching_forks = True
    register(after_in_child=functools.partial(_forked, weakref.ref(pool)))


def _forked(ref: Callable[[], Any]) -> None:
    pool: Any = ref()
    if pool is None or pool.plan is None or "torch" not in sys.modules:
        return
    threading.Thread(
        target=_start_early, args=(ref,), name="wids-lookahead-early", daemon=True
    ).start()


def _start_early(ref: Callable[[], Any]) -> None:
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
        dataset._check_process()
        size = int(getattr(pool.plan, "batch_size", 0) or 0)
        plan = PlannedBatches(pool.plan)
        first = plan.begin(size) if size > 1 else None
        if not first:
            return
        located = pool.catalog.locate(first[0])
        if is_local(pool.catalog.load().infos[located[1]].url):
            return  # local shards are read in place: nothing to read ahead
        ahead = start_lookahead(pool, [located], plan)
        ahead.merge_gap = dataset.merge_gap
        # the first batch only (the others start once it is read), planned in the lookahead's
        # own thread: the first batch's observe waits for it, so one thread walks the plan
        ahead.schedule_soon(depth=1)
        with pool._lock:
            if pool._lookahead is None:
                pool._lookahead = ahead
        if pool._lookahead is not ahead:  # the first batch came first
            ahead.close()
    except Exception as exc:  # the reads start the lookahead as without this
        log.debug("no early lookahead: %s", exc)


def _holds(dataset: Any, pool: Any) -> bool:
    """Whether ``dataset`` is the ``ShardListDataset`` that owns ``pool``."""
    return getattr(dataset, "_pool", None) is pool
