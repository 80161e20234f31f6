#!/usr/bin/env python
"""Remote reading under every DataLoader setting users run: start methods and off-path loaders.

Same set-up as ``tools/bench_latency.py`` (nginx behind ``tools/latencyproxy.py``: by default
+25 ms to each answer's first byte and 50 MB/s per connection; a DataLoader of 4 workers,
batches of 32, raw bytes, one epoch per contender in its own process). Contenders, each
``NAME@CTX`` with ``CTX`` the DataLoader's ``multiprocessing_context`` (``fork``,
``forkserver``, ``spawn``):

- ``webdataset@CTX``: webdataset 1.x's ``WebDataset`` over ``http://`` URLs (its own venv,
  ``--wds-venv``);
- ``auto@CTX`` / ``range@CTX``: wids ``access="auto"`` (with a cache directory) and
  ``access="range"``, ``ChunkedSampler`` (chunk = shard) built with ``num_workers=`` and
  ``batch_size=`` (each worker reads its own chunks): the default row;
- ``auto-natural@CTX`` / ``range-natural@CTX``: the sampler built without them (the natural
  code: ``ChunkedSampler(ds, chunksize=..., seed=...)``);
- ``auto-unordered@CTX`` / ``range-unordered@CTX``: the default row with
  ``DataLoader(in_order=False)``;
- ``auto-second@CTX`` / ``range-second@CTX``: the default row, with a second (validation)
  sampler built over the same dataset after the training one; the training loader is measured.

With ``--before DIR`` (a checkout of another wids, e.g. a ``git worktree`` of an older commit),
each wids contender also runs on that code as ``NAME@CTX+before``: a before/after comparison in
one run, each pair run twice in turn (now, before, before, now) and the faster run of each side
kept (the first of two runs of the same code was slower; a pair of the same code still differs
by about 5%). Then the goals of issue 25 as ratios in this run: per start method, ``auto``
against webdataset (samples/s >= 1.2x, first batch no later), and each off-path row against its
default row (>= 0.9x). Timings on a shared machine are noisy: compare ratios of one run.

Usage::

    python tools/bench_startmethods.py --quick                       # small, a few minutes
    python tools/bench_startmethods.py --contexts fork,forkserver,spawn --offpath fork
    python tools/bench_startmethods.py --contexts forkserver --offpath '' --preload torch
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_latency  # noqa: E402
import bench_latency_scripts as scripts  # noqa: E402
from latencyproxy import ProxyProcess  # noqa: E402
from localservers import Nginx  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONTEXTS = ("fork", "forkserver", "spawn")
OFFPATH = ("natural", "unordered", "second")

PRELOAD = """
if cfg["preload"] and cfg["ctx"] == "forkserver":  # imported once by the forkserver, not per worker
    import multiprocessing
    multiprocessing.get_context("forkserver").set_forkserver_preload(cfg["preload"])
"""

WEBDATASET = """
import webdataset as wds
from torch.utils.data import DataLoader
t0 = start()
ds = wds.WebDataset(cfg["urls"], shardshuffle=False)
loader = DataLoader(ds, batch_size=cfg["batch"], num_workers=cfg["workers"],
                    collate_fn=list, multiprocessing_context=cfg["ctx"])
measure(t0, loader)
"""

WIDS = """
from torch.utils.data import DataLoader
from wids import ChunkedSampler, ShardListDataset
import fsspec.implementations.http  # imported up front, as the peers' modules are
import wids.cache.shards
t0 = start()
kw = {"cache_dir": cfg["cache"]} if cfg["access"] == "auto" else {}
ds = ShardListDataset(cfg["index"], access=cfg["access"], transformations=[], **kw)
variant = cfg["variant"]
aware = {} if variant == "natural" else {"num_workers": cfg["workers"], "batch_size": cfg["batch"]}
sampler = ChunkedSampler(ds, chunksize=cfg["per_shard"], seed=0, shufflefirst=True, **aware)
if variant == "second":  # a validation sampler over the same dataset, built afterwards
    ChunkedSampler(ds, num_samples=(0, cfg["per_shard"]), chunksize=cfg["per_shard"], seed=1,
                   **aware)
loader = DataLoader(ds, batch_size=cfg["batch"], num_workers=cfg["workers"], sampler=sampler,
                    collate_fn=list, multiprocessing_context=cfg["ctx"],
                    in_order=variant != "unordered")
measure(t0, loader)
"""


def contenders(contexts: list[str], offpath: list[str], modes: list[str]) -> list[str]:
    """The contender names of a run: per context webdataset and the default rows, then the
    off-path rows under each context of ``offpath``."""
    names = []
    for ctx in contexts:
        names.append(f"webdataset@{ctx}")
        names += [f"{mode}@{ctx}" for mode in modes]
    for ctx in offpath:
        names += [f"{mode}-{v}@{ctx}" for mode in modes for v in OFFPATH]
    return names


def run_one(name: str, args: argparse.Namespace, base: dict, proxy: Any) -> dict | None:
    """One epoch of contender ``name`` in its own process; its figures, or ``None``."""
    what, ctx = name.split("@")
    ctx, _, before = ctx.partition("+")
    repo = args.before if before else str(REPO)
    work = Path(tempfile.mkdtemp(prefix="wids-sm-"))
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cfg = {**base, "ctx": ctx, "cache": str(work / "cache")}
    if what == "webdataset":
        python = os.path.join(args.wds_venv, "bin", "python")
        if not os.path.exists(python):
            print(f"bench_startmethods: {name}: no {python}; skipped", file=sys.stderr)
            return None
        script, env = WEBDATASET, clean
    else:
        access, _, variant = what.partition("-")
        cfg.update(access=access, variant=variant or "default")
        python, script, env = sys.executable, WIDS, {**clean, "PYTHONPATH": repo}
    try:
        os.sync()
        proxy.reset_counts()
        proxy_cpu = bench_latency._proc_cpu(proxy.proc.pid)
        proc = subprocess.run(
            [python, "-c", scripts.MEASURE + PRELOAD + script, json.dumps(cfg)],
            env=env,
            cwd=str(work),
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
        counts = proxy.settled()
        proxy_cpu = bench_latency._proc_cpu(proxy.proc.pid) - proxy_cpu
    except subprocess.TimeoutExpired:
        print(f"bench_startmethods: {name}: timed out", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        print(f"bench_startmethods: {name} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(counts=counts, proxy_cpu=proxy_cpu)
    return result


def _warm_up(urls: list[str]) -> None:
    """Read every shard once through the proxy, untimed: the first contender after the proxy
    started was slower than the same code run next (0.76x and 0.98x in two runs of a wids row
    against itself), which a before/after pair read as a regression."""
    import urllib.request

    for url in urls:
        with urllib.request.urlopen(url, timeout=60) as answer:  # noqa: S310 - 127.0.0.1
            while answer.read(1 << 20):
                pass


def ratios(results: dict[str, dict], contexts: list[str], offpath: list[str]) -> list[str]:
    """The goals of issue 25 in this run (goal in brackets)."""

    def r(a: str, b: str, key: str = "rate") -> float | None:
        if a in results and b in results and results[a][key] and results[b][key]:
            return float(results[a][key] / results[b][key])
        return None

    checks = []
    for ctx in contexts:
        checks.append(
            (
                f"auto@{ctx} / webdataset@{ctx}, samples/s",
                r(f"auto@{ctx}", f"webdataset@{ctx}"),
                ">= 1.2",
            )
        )
        checks.append(
            (
                f"auto@{ctx} / webdataset@{ctx}, first batch",
                r(f"auto@{ctx}", f"webdataset@{ctx}", "first_ms"),
                "<= 1.0",
            )
        )
    for name in results:
        if name.endswith("+before"):
            now = name[: -len("+before")]
            checks.append((f"{now} / the same before", r(now, name), "> 1 is faster"))
    for ctx in offpath:
        for mode in ("auto", "range"):
            for v in OFFPATH:
                checks.append(
                    (
                        f"{mode}-{v}@{ctx} / {mode}@{ctx}",
                        r(f"{mode}-{v}@{ctx}", f"{mode}@{ctx}"),
                        ">= 0.9",
                    )
                )
    return [
        f"{what:52} {value:6.2f}  (goal {goal})"
        for what, value, goal in checks
        if value is not None
    ]


def main(argv: list[str] | None = None) -> dict[str, dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 shards x 250 samples of 10 kB")
    p.add_argument("--shards", type=int)
    p.add_argument("--samples", type=int)
    p.add_argument("--jpg-bytes", type=int)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--delay-ms", type=float, default=25.0)
    p.add_argument("--mbps", type=float, default=50.0)
    p.add_argument("--contexts", default=",".join(CONTEXTS))
    p.add_argument("--offpath", default="fork", help="contexts of the off-path rows ('' none)")
    p.add_argument("--modes", default="auto,range")
    p.add_argument("--wds-venv", default="/tmp/venv-wds")
    p.add_argument("--before", help="another wids checkout: its contenders run too (+before)")
    p.add_argument(
        "--preload",
        default="",
        help="modules a forkserver imports once before it starts the workers, in every "
        "contender (e.g. 'torch'; set_forkserver_preload); default none",
    )
    p.add_argument("--data")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    args.shards = args.shards or (4 if args.quick else 8)
    args.samples = args.samples or (250 if args.quick else 1000)
    args.jpg_bytes = args.jpg_bytes or (10_000 if args.quick else 20_000)
    contexts = [c for c in args.contexts.split(",") if c]
    offpath = [c for c in args.offpath.split(",") if c]
    names = contenders(contexts, offpath, args.modes.split(","))
    runs = names
    if args.before:
        names = [m for n in names for m in ([n] if n.startswith("web") else [n, n + "+before"])]
        # each pair twice, in turn (now, before, before, now), the faster run of each kept: the
        # first of two runs of the same code was 0.83-0.86x the second in a pair (A/A runs)
        runs = [
            m
            for n in runs
            for m in ([n] if n.startswith("web") else [n, n + "+before", n + "+before", n])
        ]
    data, shard_names, size = bench_latency._prepare(args)
    sample_bytes = bench_latency._sample_bytes(os.path.join(data, "bench.json"))
    args.delay_ms, args.mbps = float(args.delay_ms), float(args.mbps)
    load = os.getloadavg()
    started = time.perf_counter()
    nginx = Nginx(data)
    results: dict[str, dict] = {}
    try:
        with ProxyProcess(nginx.base, delay=args.delay_ms / 1e3, mbps=args.mbps) as proxy:
            base = {
                "urls": [proxy.url(n) for n in shard_names],
                "index": proxy.url("bench.json"),
                "per_shard": args.samples,
                "size": size,
                "workers": args.workers,
                "batch": args.batch,
                "preload": [m for m in args.preload.split(",") if m],
            }
            _warm_up(base["urls"])
            for name in runs:
                print(f"bench_startmethods: {name} ...", file=sys.stderr)
                got = run_one(name, args, base, proxy)
                if got is not None:
                    figures = bench_latency._figures(got, size, sample_bytes, args)
                    if name not in results or figures["rate"] > results[name]["rate"]:
                        results[name] = figures
    finally:
        nginx.stop()
    print(
        f"{args.shards} shards x {args.samples} samples, {size / 1e6:.0f} MB; proxy "
        f"+{args.delay_ms:g} ms, {args.mbps:g} MB/s per connection; DataLoader {args.workers} "
        f"workers, batch {args.batch}; load {load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at "
        f"end; {time.perf_counter() - started:.0f} s"
        + (f"; forkserver preloads {args.preload}" if args.preload else "")
    )
    print(f"command: python tools/bench_startmethods.py {' '.join(argv or sys.argv[1:])}".rstrip())
    head = (
        f"{'contender':26} {'samples/s':>9} {'1st batch':>9} {'req/smp':>7} {'bytes/ds':>8} "
        f"{'cores':>5}"
    )
    print(head)
    print("-" * len(head))
    for name, f in results.items():
        first = "" if f["first_ms"] is None else f"{f['first_ms']:,.0f} ms"
        print(
            f"{name:26} {f['rate']:9,.0f} {first:>9} {f['req_per_sample']:7.3f} "
            f"{f['bytes_x']:7.2f}x {f['cores']:5.2f}"
        )
    print()
    print("\n".join(ratios(results, contexts, offpath)))
    return results


if __name__ == "__main__":
    main()
