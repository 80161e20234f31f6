"""Soak test: random reads through a fault-injecting proxy from 2 processes x 2 DataLoader workers.

Usage: python tools/soak.py --minutes 2 [--backend http|s3] [--rate 0.05] [--seed 0]

Builds a synthetic dataset, serves it from nginx (or moto) on 127.0.0.1 behind the fault proxy
(``tests/faultproxy.py``), indexes it, then runs two processes until the time is up: process 0
reads by range requests, process 1 through a small shard cache (so shards are evicted and
downloaded again under faults); ``--access range|shard|auto`` uses one mode in both. Each process
runs a DataLoader with 2 workers over random indices; every sample is compared with what
``tarfile`` says. Prints samples served, faults
injected by kind, retries, errors raised, wrong samples and peak RSS; exits non-zero if any
sample was wrong or any error was raised. Bounded by ``--minutes`` and ``--max-batches``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import queue
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from faultproxy import FAULT_KINDS, FaultPlan, FaultProxy  # noqa: E402
from localservers import Moto, Nginx  # noqa: E402
from tar_oracle import dataset_samples  # noqa: E402

BATCH = 8


def digest(sample: dict[str, Any]) -> str:
    """A digest of a sample's key and fields (bookkeeping keys left out)."""
    h = hashlib.sha256()
    for k in sorted(sample):
        if k.startswith("__") and k != "__key__":
            continue
        v = sample[k]
        h.update(k.encode() + b"\0" + (v if isinstance(v, bytes) else str(v).encode()) + b"\0")
    return h.hexdigest()


class Checked:
    """Wraps the dataset: each batch is read, compared with the oracle, and summarised."""

    def __init__(self, ds: Any, digests: list[str]) -> None:
        self.ds = ds
        self.digests = digests

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.__getitems__([i])

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        from wids.errors import WidsError

        out: dict[str, Any] = {"n": 0, "wrong": 0, "errors": [], "pid": os.getpid()}
        try:
            samples = self.ds.__getitems__(indices)
        except WidsError as exc:  # counted and reported; the soak goes on
            out["errors"].append(f"{type(exc).__name__}: {exc}")
        else:
            out["n"] = len(samples)
            out["wrong"] = sum(
                s["__index__"] != i or digest(s) != self.digests[i]
                for i, s in zip(indices, samples, strict=True)
            )
        st = self.ds.stats
        out["stats"] = {"requests": st.requests, "retries": st.retries, "errors": st.errors}
        out["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return out


def identity(x: Any) -> Any:
    return x


def child(rank: int, cfg: dict[str, Any], results: Any) -> None:
    """One soak process: a DataLoader with 2 workers over random indices until the deadline."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from wids import RetryPolicy, ShardListDataset

    access = cfg["access"][rank]
    ds = ShardListDataset(
        cfg["index"],
        transformations=[],
        access=access,
        cache_dir=cfg["cache_dir"] if access != "range" else None,
        cache_size=cfg["cache_size"] if access != "range" else None,
        lru_size=3 if access != "range" else 10,  # few open shards: evictions, re-downloads
        storage_options=cfg["storage_options"],
        retry=RetryPolicy(**cfg["retry"]),
    )
    digests = json.loads(Path(cfg["digests"]).read_text())
    data = Checked(ds, digests)
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    sampler = RandomSampler(data, replacement=True, num_samples=10**9, generator=gen)
    # process 0's workers are forked, process 1's spawned: both ways users run them
    loader = DataLoader(
        data,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=2,
        collate_fn=identity,
        multiprocessing_context="fork" if rank == 0 else "spawn",
        timeout=cfg["batch_timeout"],
    )
    deadline = float("inf")  # counted from the first batch: start-up is not soak time
    served = wrong = batches = 0
    errors: list[str] = []
    stats: dict[int, dict[str, int]] = {}
    rss = 0
    hung = None
    it = iter(loader)
    while True:
        try:
            out = next(it)
        except StopIteration:
            break
        except RuntimeError as exc:  # DataLoader(timeout=...): a worker is stuck, or died
            hung = f"DataLoader stopped (batch timeout {cfg['batch_timeout']:g} s): {exc}"
            break
        batches += 1
        served += out["n"]
        wrong += out["wrong"]
        errors += out["errors"]
        stats[out["pid"]] = out["stats"]
        rss = max(rss, out["rss"])
        if batches == 1:
            deadline = time.time() + cfg["seconds"]
        if time.time() > deadline or batches >= cfg["max_batches"]:
            break
    del it, loader  # shuts the workers down
    if hung:
        errors.append(hung)
    totals = {
        f"io_{k}": sum(s[k] for s in stats.values()) for k in ("requests", "retries", "errors")
    }
    rss = max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    results.put(
        {
            "rank": rank,
            "access": access,
            "batches": batches,
            "served": served,
            "wrong": wrong,
            "errors": errors,
            "rss_kib": rss,
            **totals,
        }
    )


def start_server(backend: str, work: Path) -> tuple[Nginx | Moto, str]:
    """Start nginx or moto; return (server, upstream base URL)."""
    if backend == "http":
        root = work / "www"
        root.mkdir()
        nginx = Nginx(root, work / "nginx", workers=1)
        return nginx, nginx.base
    moto = Moto("wids-test", work / "moto")
    return moto, moto.endpoint


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--backend", choices=["http", "s3"], default="http")
    ap.add_argument("--rate", type=float, default=0.05, help="share of requests given a fault")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--samples", type=int, default=200, help="samples per shard")
    ap.add_argument("--max-batches", type=int, default=200_000, help="per process")
    ap.add_argument(
        "--access",
        choices=["mixed", "range", "shard", "auto"],
        default="mixed",
        help="mixed: process 0 reads by range, process 1 through the shard cache; auto: both "
        "through a small cache with promotion",
    )
    ap.add_argument(
        "--batch-timeout", type=float, default=120.0, help="a batch slower than this is a hang"
    )
    args = ap.parse_args(argv)

    from wids import build_index
    from wids.synth import write_dataset

    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="wids-soak-") as tmp:
        work = Path(tmp)
        paths = write_dataset(
            str(work / "shards"),
            shards=args.shards,
            samples_per_shard=args.samples,
            real_images=False,
            jpg_bytes=8000,
            extra_fields=True,
            seed=args.seed,
        )
        digests = [digest(s) for s in dataset_samples(paths)]
        (work / "digests.json").write_text(json.dumps(digests))
        server, upstream = start_server(args.backend, work)
        proxy = FaultProxy(upstream).start()
        try:
            for p in paths:
                server.put(p, f"soak/{os.path.basename(p)}")
            if args.backend == "http":
                urls = [proxy.url(f"soak/{os.path.basename(p)}") for p in paths]
                options: dict[str, Any] = {}
            else:
                urls = [server.url(f"soak/{os.path.basename(p)}") for p in paths]
                options = {
                    **server.storage_options,
                    "client_kwargs": {"endpoint_url": proxy.base, "region_name": "us-east-1"},
                }
            kinds = {k: 1.0 for k in FAULT_KINDS}
            kinds["stall"] = 0.1  # each one costs a full timeout
            proxy.set_plan(
                FaultPlan(kinds, rate=args.rate, only="/soak/", delay=0.05, seed=args.seed)
            )
            index = str(work / "index.json")
            build_index(urls, index, storage_options=options, name="soak", jobs=4)
            shard_size = max(os.path.getsize(p) for p in paths)
            cfg = {
                "index": index,
                "digests": str(work / "digests.json"),
                "storage_options": options,
                "cache_dir": str(work / "cache"),
                "cache_size": 4 * shard_size,  # smaller than the dataset: evictions happen
                "retry": {"attempts": 8, "max_time": 60.0, "backoff": 0.02, "timeout": 2.0},
                "seed": args.seed,
                "access": {"mixed": ["range", "shard"]}.get(args.access, [args.access] * 2),
                "seconds": args.minutes * 60,
                "batch_timeout": args.batch_timeout,
                "max_batches": args.max_batches,
            }
            ctx = multiprocessing.get_context("spawn")
            results = ctx.Queue()
            procs = [ctx.Process(target=child, args=(r, cfg, results)) for r in range(2)]
            for p in procs:
                p.start()
            reports: list[dict[str, Any]] = []
            limit = time.time() + cfg["seconds"] + 300  # a hard bound even if a child hangs
            while len(reports) < len(procs) and time.time() < limit:
                if all(p.exitcode is not None for p in procs) and results.empty():
                    break  # a process died without reporting
                try:
                    reports.append(results.get(timeout=15))
                except queue.Empty:
                    c = proxy.counts()
                    print(
                        f"  ... {time.time() - t_start:.0f}s requests={c['requests']} "
                        f"injected={sum(c['injected'].values())}",
                        flush=True,
                    )
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
            counts = proxy.counts()
        finally:
            proxy.stop()
            server.stop()

    served = sum(r["served"] for r in reports)
    wrong = sum(r["wrong"] for r in reports)
    errors = [e for r in reports for e in r["errors"]]
    retries = sum(r["io_retries"] for r in reports)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak = max([own, kids] + [r["rss_kib"] for r in reports])
    elapsed = time.time() - t_start
    print(
        f"soak: backend={args.backend} access={args.access} minutes={args.minutes} "
        f"rate={args.rate} seed={args.seed}"
    )
    for r in sorted(reports, key=lambda r: r["rank"]):
        print(
            f"  process {r['rank']} ({r['access']}): batches={r['batches']} "
            f"samples={r['served']} requests={r['io_requests']} retries={r['io_retries']} "
            f"errors={len(r['errors'])} wrong={r['wrong']} peak_rss={r['rss_kib'] / 1024:.0f}MiB"
        )
    print(f"samples served:   {served} ({served / max(elapsed, 1e-9):.0f}/s over {elapsed:.0f}s)")
    print(f"proxy requests:   {counts['requests']} (forwarded clean: {counts['forwarded']})")
    injected = counts["injected"]
    print(f"faults injected:  {sum(injected.values())} {dict(sorted(injected.items()))}")
    print(f"retries:          {retries}")
    print(f"errors raised:    {len(errors)}")
    for e in errors[:10]:
        print(f"    {e}")
    print(f"wrong samples:    {wrong}")
    print(f"peak RSS:         {peak / 1024:.0f} MiB (largest single process)")
    missing = 2 - len(reports)
    if missing:
        print(f"processes that did not report: {missing}")
    return 1 if wrong or errors or missing else 0


if __name__ == "__main__":
    sys.exit(main())
