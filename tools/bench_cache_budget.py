"""The budget table of issue 26: a cache budget at 10-100 % of the dataset.

Used by ``python tools/bench_cache.py --budgets`` (see there). For each budget (a share of the
dataset) x access mode (``shard``, ``auto``; ``range`` as the yardstick) x order (chunked: a
chunked sampler, one chunk per shard, with its plan; random: a shuffled ``DataLoader``) x
topology (one process with 2 DataLoader workers; two processes, each one rank of a
``DistributedChunkedSampler`` or half of a permutation, without workers), one epoch on a fresh
cache directory against nginx on 127.0.0.1:

- peak bytes on disk: ``data/`` plus ``tmp/`` of the cache, sampled every 2 ms;
- bytes at exit: the same, once every process has exited;
- bytes downloaded / dataset: nginx's access log (body bytes sent);
- samples/s over the epoch (wall time, this loaded machine: compare within one run).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import threading
import time
import warnings
from typing import Any

ACCESS = ("shard", "auto")
ORDERS = ("chunked", "random")
TOPOLOGIES = ("1p x 2w", "2p")


def _count(batch: list[Any]) -> int:
    return len(batch)


def _disk(cache_dir: str) -> int:
    total = 0
    for sub in ("data", "tmp"):
        d = os.path.join(cache_dir, sub)
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for n in names:
            try:
                total += os.lstat(os.path.join(d, n)).st_size
            except FileNotFoundError:
                pass
    return total


def _epoch(cfg: dict[str, Any], rank: int, world: int, workers: int) -> int:
    """One epoch of one process; returns the samples read."""
    import torch.utils.data as tud

    from wids import ShardListDataset
    from wids.dataset.localcache import CacheThrashWarning
    from wids.sampler import ChunkedSampler, DistributedChunkedSampler

    budget = cfg["budget"]
    # shard mode in a random order thrashes by nature: the table shows it, the warning need not
    warnings.simplefilter("ignore", CacheThrashWarning)
    ds = ShardListDataset(
        cfg["index"],
        access=cfg["access"],
        cache_dir=None if cfg["access"] == "range" else cfg["cache_dir"],
        cache_size=None if cfg["access"] == "range" else budget,
        transformations=[],
    )
    n = len(ds)
    batch = cfg["batch"]
    if cfg["order"] == "chunked":
        per = n // len(ds.lengths)
        if world == 1:
            sampler: Any = ChunkedSampler(ds, chunksize=per, seed=1, shufflefirst=True)
        else:
            sampler = DistributedChunkedSampler(
                ds, rank=rank, num_replicas=world, chunksize=per, seed=1, shufflefirst=True
            )
    else:
        perm = list(range(n))
        random.Random(1).shuffle(perm)
        sampler = perm[rank::world]
    loader = tud.DataLoader(
        ds, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=_count
    )
    got = sum(loader)
    ds.close()
    return got


def _child(cfg: dict[str, Any], rank: int, out: Any) -> None:
    out.put(_epoch(cfg, rank, 2, 0))
    out.close()
    out.join_thread()


def run_one(cfg: dict[str, Any], nginx: Any) -> dict[str, float]:
    """One epoch of one configuration; the row's figures."""
    shutil.rmtree(cfg["cache_dir"], ignore_errors=True)
    nginx.reset()
    peak = [0]
    stop = threading.Event()
    ctx = mp.get_context("fork")
    procs = []
    out = ctx.Queue()
    if cfg["topology"] == "2p":  # forked before the sampling thread starts
        procs = [ctx.Process(target=_child, args=(cfg, r, out)) for r in range(2)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _disk(cfg["cache_dir"]))
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        if procs:
            samples = sum(out.get(timeout=600) for _ in procs)
            for p in procs:
                p.join(60)
        else:
            samples = _epoch(cfg, 0, 1, 2)
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        thread.join()
    _, served = nginx.counts()
    return {
        "peak": peak[0],
        "exit": _disk(cfg["cache_dir"]),
        "bytes": served,
        "rate": samples / elapsed,
        "samples": samples,
    }


def table(root: str, index: str, total: int, shard: int, nginx: Any, args: Any) -> bool:
    """Print the table; whether every goal of the issue holds."""
    budgets = [float(b) for b in args.budget_shares.split(",")]
    base = {"index": index, "batch": args.batch, "cache_dir": os.path.join(root, "cache")}
    ok = True
    print(
        f"dataset {total / 1e6:.2f} MB in shards of ~{shard / 1e3:.0f} KB; allowance: one "
        "shard per process downloading; 'fit' = the budget holds 2 shards per reader (2)"
    )
    print(
        f"{'budget':>7} {'access':<6} {'order':<8} {'topology':<8} {'peak MB':>8} "
        f"{'exit MB':>8} {'bytes/ds':>8} {'range':>6} {'samples/s':>9}  goals"
    )
    for order in ORDERS:
        for topo in TOPOLOGIES:
            rng = run_one(
                {**base, "access": "range", "order": order, "topology": topo, "budget": None}, nginx
            )
            for share in budgets:
                budget = int(share * total)
                fits = budget >= 2 * 2 * shard
                for access in ACCESS:
                    cfg = {
                        **base,
                        "access": access,
                        "order": order,
                        "topology": topo,
                        "budget": budget,
                    }
                    r = run_one(cfg, nginx)
                    allowance = budget + 2 * shard
                    goals = [r["peak"] <= allowance, r["exit"] <= budget]
                    if order == "chunked" and fits:
                        goals.append(r["bytes"] <= 1.05 * total)
                    if access == "auto" and (order == "random" or not fits):
                        goals.append(r["bytes"] <= 1.02 * rng["bytes"])
                    ok &= all(goals)
                    print(
                        f"{share:>6.0%} {access:<6} {order:<8} {topo:<8} "
                        f"{r['peak'] / 1e6:>8.2f} {r['exit'] / 1e6:>8.2f} "
                        f"{r['bytes'] / total:>8.2f} {rng['bytes'] / total:>6.2f} "
                        f"{r['rate']:>9.0f}  {'ok' if all(goals) else 'MISS'}"
                        f"{' (fit)' if fits else ''}",
                        flush=True,
                    )
    return ok
