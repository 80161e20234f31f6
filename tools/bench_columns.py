#!/usr/bin/env python
"""Benchmark metadata columns: what an index with columns costs when they are unused, and used.

Writes a synthetic index (``--shards`` x ``--samples``, each sample a ``.jpg`` and a ``.json``
member at made-up offsets; no shard exists: nothing here reads samples) in JSON, SQLite and
``.widx``, once without columns and once with three (``width``, ``height``: small ints;
``score``: float64, 1% missing), with ``wids.write_index``. Then, each in a fresh process that
has already imported ``wids.ShardListDataset`` (and so torch):

- ``open s``: ``ShardListDataset(index)`` and ``len(ds)`` (the description loads), wall
  time and this process's CPU time (which other load on the machine moves less);
- ``column s``: then ``ds.column("width")`` (every shard's entry read and decoded);
- ``where s``: then ``ds.where("width >= 256 and height >= 256")``;
- ``file MB``: the index's size (a JSON index: its description only).

The figures to read are the ratios "with / without" of ``open s`` in the same run.

``--remote N``: instead, ``ds.column`` over a JSON index of ``N`` shards served by nginx
behind ``tools/latencyproxy.py`` (25 ms per request): its sidecars read one at a time
against 16 at once (what ``ds.column`` does for a remote JSON index).

Example:
    python tools/bench_columns.py                      # 2,000 shards x 1,000 samples
    python tools/bench_columns.py --shards 100 --samples 100   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

FORMATS = ("json", "sqlite", "widx")


def write(path: str, shards: int, samples: int, columns: bool, seed: int) -> None:
    import numpy as np

    from wids import ShardInfo, ShardMembers, write_index
    from wids.index.columns import EXTRA_KEY, ShardColumn, encode_columns

    rng = np.random.default_rng(seed)
    # one member table shape for every shard: .jpg then .json, 4 KB apart
    rows = []
    for j in range(samples):
        base = 512 + j * 4096
        rows.append((f"{j:08d}", [(".jpg", base, 2000), (".json", base + 2560, 40)]))
    members = ShardMembers.from_samples(rows)
    size = 512 + samples * 4096 + 1024
    with write_index(path) as w:
        for k in range(shards):
            extra = None
            if columns:
                width = rng.integers(64, 1024, size=samples).astype(np.int64)
                height = rng.integers(64, 1024, size=samples).astype(np.int64)
                score = rng.random(samples)
                score[rng.random(samples) < 0.01] = np.nan
                cols = {
                    "width": ShardColumn("int64", width, None),
                    "height": ShardColumn("int64", height, None),
                    "score": ShardColumn("float64", score, np.isnan(score)),
                }
                extra = {EXTRA_KEY: encode_columns(cols, samples)}
            w.add(ShardInfo(f"shard-{k:07d}.tar", samples, size=size), members, extra)


def child(index: str) -> dict[str, Any]:
    import numpy  # noqa: F401

    import wids

    dataset_class = wids.ShardListDataset  # imported (with torch) before the clock starts
    t0, c0 = time.perf_counter(), time.process_time()
    ds = dataset_class(index, transformations=[])
    n = len(ds)
    t1, c1 = time.perf_counter(), time.process_time()
    out: dict[str, Any] = {"samples": n, "open": t1 - t0, "open_cpu": c1 - c0}
    try:
        width = ds.column("width")
    except wids.ColumnError:
        return out
    t2 = time.perf_counter()
    excluded = ds.where("width >= 256 and height >= 256")
    t3 = time.perf_counter()
    assert len(width) == n
    out.update(column=t2 - t1, where=t3 - t2, excluded=len(excluded))
    return out


def remote(shards: int) -> None:
    """``ds.column`` over a remote JSON index, sidecars read one at a time and 16 at once."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from latencyproxy import LatencyProxy
    from localservers import Nginx

    import wids.dataset.columns as dataset_columns
    from wids import ShardListDataset

    with tempfile.TemporaryDirectory(prefix="wids-bench-columns-") as d:
        write(os.path.join(d, "i.json"), shards, 100, True, seed=0)
        server = Nginx(d)
        try:
            with LatencyProxy(server.base, delay=0.025, mbps=50) as proxy:
                times = {}
                for threads in (1, dataset_columns._THREADS):
                    dataset_columns._THREADS = threads
                    ds = ShardListDataset(proxy.url("i.json"), transformations=[])
                    len(ds)
                    t0 = time.perf_counter()
                    assert len(ds.column("width")) == shards * 100
                    times[threads] = time.perf_counter() - t0
                    took = times[threads]
                    print(f"{threads:>2} at once: ds.column over {shards} shards {took:.2f} s")
                one, many = times.values()
                print(f"{one / many:.1f}x faster with {max(times)} at once (25 ms per request)")
        finally:
            server.stop()


def run_child(index: str) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", index]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {index} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=2000)
    p.add_argument("--samples", type=int, default=1000, help="samples per shard")
    p.add_argument("--repeat", type=int, default=3, help="opens per index (the best is shown)")
    p.add_argument("--formats", default=",".join(FORMATS), help="which of " + ",".join(FORMATS))
    p.add_argument("--keep", action="store_true", help="keep the indexes (with --dir)")
    p.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    p.add_argument("--remote", type=int, metavar="N", help="the remote JSON run, N shards")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    if args.remote:
        remote(args.remote)
        return 0
    formats = [f for f in args.formats.split(",") if f]
    with tempfile.TemporaryDirectory(prefix="wids-bench-columns-", dir=args.dir) as tmp:
        d = args.dir if args.keep and args.dir else tmp
        rows: dict[str, Any] = {}
        for fmt in formats:
            for cols in (False, True):
                path = os.path.join(d, f"{'cols' if cols else 'plain'}.{fmt}")
                if not (args.keep and os.path.exists(path)):
                    write(path, args.shards, args.samples, cols, seed=0)
                runs = [run_child(path) for _ in range(args.repeat)]
                best = {
                    k: min(r[k] for r in runs)
                    for k in runs[0]
                    if k in ("open", "open_cpu", "column", "where")
                }
                best["file_mb"] = os.path.getsize(path) / 1e6
                best["excluded"] = runs[0].get("excluded")
                rows[f"{fmt}-{'cols' if cols else 'plain'}"] = best
        total = args.shards * args.samples
        print(
            f"{args.shards} shards x {args.samples} samples = {total:,} samples; "
            f"best of {args.repeat}"
        )
        print(
            f"{'index':<14} {'file MB':>8} {'open s':>8} {'open cpu s':>10} {'column s':>9} "
            f"{'where s':>8}"
        )
        for name, r in rows.items():
            col = f"{r['column']:9.3f}" if "column" in r else f"{'-':>9}"
            wh = f"{r['where']:8.3f}" if "where" in r else f"{'-':>8}"
            print(
                f"{name:<14} {r['file_mb']:8.1f} {r['open']:8.3f} {r['open_cpu']:10.3f} {col} {wh}"
            )
        for fmt in formats:
            a, b = rows[f"{fmt}-plain"], rows[f"{fmt}-cols"]
            print(
                f"{fmt}: open with columns / without = {b['open'] / a['open']:.2f}x wall, "
                f"{b['open_cpu'] / a['open_cpu']:.2f}x CPU"
            )
        if args.json:
            print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
