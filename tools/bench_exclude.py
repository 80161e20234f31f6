#!/usr/bin/env python
"""Benchmark exclusions: open time and memory of ``ShardListDataset(index, exclude=...)``.

Builds the synthetic dataset of ``tools/bench_scale.py`` (``--shards`` x ``--samples``, 10^10
samples by default: a reference description converted to a shard table, ``*.widx``; only one
shard exists on disk), then, each in a fresh process that has already run ``import torch,
wids``, opens it with ``--exclude`` random global sample numbers (and with none, the baseline
of the same run) and reads one kept sample of the real shard:

- ``open s``: seconds for ``ShardListDataset(index, exclude=numbers)``, ``len(ds)`` (which
  resolves the exclusion) and ``ds[i]``;
- ``rss+ MB`` / ``peak+ MB``: RSS and peak RSS (``VmHWM``) added by that;
- ``lookup us``: ``ds._catalog.locate(i)`` per call over 10^5 random kept indices (the index
  -> shard mapping every read does; with exclusions one more ``searchsorted``).

The ``pairs`` rows exclude ``--pairs`` samples of the real shard as ``shard/key`` pairs
(``s-0500000.tar/00000000`` ...: the shard by its basename), in the ``.widx`` and in each index
of ``--formats`` (converted from the same description; each with its own row without
exclusions): what costs there is finding the shard a name means among 10^6 (and scanning the
real shard, which has no member table in these indexes). Opening a JSON index builds one
record per shard whatever the exclusion.

The numbers are given as a numpy array and as a Python list (made before the clock starts:
they are the caller's). Goal (issue 23): 10^6 exclusions over 10^10 samples open in < 1 s
and add < 100 MB beyond the run without exclusions.

Example:
    python tools/bench_exclude.py                              # 10^10 samples, 10^6 excluded
    python tools/bench_exclude.py --shards 1000 --samples 100 --exclude 1000   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scale import _status, run_child, write_description  # noqa: E402


def child_open(index: str, total: int, n: int, form: str, real: int, per: int) -> dict[str, Any]:
    import numpy as np
    import torch  # noqa: F401  (the process this is about has torch loaded already)

    import wids

    dataset_class = wids.ShardListDataset
    rng = np.random.default_rng(0)
    numbers = np.unique(rng.integers(0, total, size=n, dtype=np.int64)) if n else None
    given: Any = numbers if form == "array" or numbers is None else numbers.tolist()
    if form == "pairs":  # the first n keys of the real shard, named by its basename
        count = min(n, per // 2)  # the shard's middle sample stays: it is the one read
        numbers = real * per + np.arange(count, dtype=np.int64)
        given = [f"s-{real:07d}.tar/{j:08d}" for j in range(count)]
    raw = real * per + per // 2  # a sample of the one real shard, kept or not
    near = set() if numbers is None else set(numbers[abs(numbers - raw) < per // 2].tolist())
    while raw in near:
        raw -= 1
    target = raw - (int(np.searchsorted(numbers, raw)) if numbers is not None else 0)
    before = _status()
    t0 = time.perf_counter()
    ds = dataset_class(index, transformations=[], exclude=given)
    length = len(ds)
    sample = ds[target]
    opened = time.perf_counter() - t0
    after = _status()
    picks = random.Random(1).choices(range(length), k=100_000)
    locate = ds._catalog.locate
    t0 = time.perf_counter()
    for i in picks:
        locate(i)
    lookup = (time.perf_counter() - t0) / len(picks)
    return {
        "open_s": opened,
        "rss_added": after["VmRSS"] - before["VmRSS"],
        "hwm_added": after["VmHWM"] - before["VmHWM"],
        "samples": length,
        "excluded": 0 if numbers is None else len(numbers),
        "key": sample["__key__"],
        "expected_key": f"{raw - real * per:08d}",
        "lookup_us": lookup * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=1_000_000, help="shards in the description")
    p.add_argument("--samples", type=int, default=10_000, help="samples per shard")
    p.add_argument("--exclude", type=int, default=1_000_000, help="sample numbers excluded")
    p.add_argument("--pairs", type=int, default=1000, help="shard/key pairs excluded (0: none)")
    p.add_argument(
        "--formats",
        default="",
        help="other index formats for the pairs row, comma-separated: sqlite,json",
    )
    p.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        index, total, n, form, real, per = args.child
        out = child_open(index, int(total), int(n), form, int(real), int(per))
        print(json.dumps(out))
        return 0
    if args.dir:
        return run(Path(args.dir), args)
    with tempfile.TemporaryDirectory(prefix="wids-bench-exclude-") as d:
        return run(Path(d), args)


def _child(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {args[:4]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(root: Path, args: argparse.Namespace) -> int:
    total = args.shards * args.samples
    real = args.shards // 2
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    desc = write_description(root, args.shards, args.samples, real)
    index = root / "index.widx"
    conv = run_child(["convert", str(desc), str(index)])
    print(
        f"{args.shards} shards x {args.samples} samples = {total} samples; "
        f"shard table converted in {conv['convert_s']:.1f} s"
    )
    others = [f for f in args.formats.split(",") if f]
    for fmt in others:
        conv = run_child(["convert", str(desc), str(root / f"index.{fmt}")])
        print(f"converted to {fmt} in {conv['convert_s']:.1f} s")
    rows: dict[str, dict[str, Any]] = {}
    cases = [("none", 0, "array"), ("array", args.exclude, "array"), ("list", args.exclude, "list")]
    if args.pairs:
        cases.append(("pairs", args.pairs, "pairs"))
        for fmt in others:  # and the baseline of that format
            cases += [(f"none-{fmt}", 0, "array"), (f"pairs-{fmt}", args.pairs, "pairs")]
    print(f"{'exclude':>20s} {'open s':>7s} {'rss+ MB':>8s} {'peak+ MB':>8s} {'lookup us':>9s}")
    for name, n, form in cases:
        fmt = name.partition("-")[2] or "widx"
        where = str(root / f"index.{fmt}")
        got = _child([where, str(total), str(n), form, str(real), str(args.samples)])
        if got["key"] != got["expected_key"] or got["samples"] != total - got["excluded"]:
            raise SystemExit(f"wrong sample or length with {name}: {got}")
        rows[name] = got
        label = "none" if not n else f"{got['excluded']} ({form})"
        label += f" {fmt}" if form == "pairs" or fmt != "widx" else ""
        print(
            f"{label:>20s} {got['open_s']:7.3f} {got['rss_added'] / 1e6:8.1f} "
            f"{got['hwm_added'] / 1e6:8.1f} {got['lookup_us']:9.2f}"
        )
    base = rows["none"]
    for name in ("array", "list"):
        r = rows[name]
        print(
            f"goals ({name}): open {r['open_s']:.3f} s (< 1 s), "
            f"+{(r['rss_added'] - base['rss_added']) / 1e6:.1f} MB RSS over no exclusion "
            f"(< 100 MB), lookup {r['lookup_us'] / base['lookup_us']:.2f}x"
        )
    for name in (n for n, _, form in cases if form == "pairs"):
        r, fmt = rows[name], name.partition("-")[2]
        none = rows[f"none-{fmt}"] if fmt else base
        print(
            f"{name}: open {r['open_s']:.3f} s, {r['open_s'] / none['open_s']:.2f}x no exclusion "
            f"({none['open_s']:.3f} s), +{(r['rss_added'] - none['rss_added']) / 1e6:.1f} MB RSS "
            "over it"
        )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
