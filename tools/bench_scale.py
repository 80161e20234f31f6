#!/usr/bin/env python
"""Benchmark opening a dataset of many shards: the index formats at 10^6 shards x 10^4 samples.

Generates a reference ``wids-shard-index-v1`` description of ``--shards`` local shard URLs of
``--samples`` samples each (10^10 samples by default). Only one shard exists on disk, the one
holding the index that is read; the others are never opened. It converts the description with
``wids.convert_index`` to a JSON index, an SQLite index and a shard table (``*.widx``), timing
each conversion in a fresh process, then, for each of the four (the description itself too),
in a fresh process that has already run ``import torch, wids`` (and resolved
``wids.ShardListDataset``, which wids imports lazily):

- ``open``: seconds for ``ShardListDataset(index)`` and reading ``ds[i]`` at one random index
  (a description has no member tables: that first read scans its shard, in every format);
- ``rss+``: RSS added by that (MB), and the peak (``VmHWM``) added;
- ``worker``: private memory (USS: ``Private_Clean + Private_Dirty`` from
  ``/proc/PID/smaps_rollup``) of each of ``--workers`` DataLoader workers (fork) after each
  read a batch of the real shard and ran a full garbage collection: what every worker adds to
  the machine.

Then, per format, ``wids index info`` and ``wids subset`` of 2 (real, neighbouring) shards,
each in a fresh process that has imported wids: seconds and the peak RSS (``VmHWM``) added.

Conversion is timed against ``json.load`` of the description in a fresh process. The floor of
opening is the same fresh process without the dataset (its import time and RSS, and its
workers' USS over a plain list, printed: a worker's collection copies the pages of what
``import torch`` made too, whatever the dataset);
ratios are against the description's figures from the same run. Goals (issue 14, shard
table): open < 1 s, < 150 MB added, workers < 50 MB each, conversion < 30 s.

Example:
    python tools/bench_scale.py                         # 10^6 shards: a few minutes
    python tools/bench_scale.py --shards 1000 --samples 100   # smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

FORMATS = ("description", "json", "sqlite", "widx")
SUFFIX = {"json": ".json", "sqlite": ".sqlite", "widx": ".widx"}


def shard_name(k: int) -> str:
    return f"shards/s-{k:07d}.tar"


def write_real_shard(path: Path, samples: int) -> int:
    """A real tar of ``samples`` samples (one small ``.cls`` member each); its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    import io

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for j in range(samples):
            data = str(j).encode()
            info = tarfile.TarInfo(f"{j:08d}.cls")
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))
    return path.stat().st_size


def pair_of(real: int, shards: int) -> tuple[int, int]:
    """The two neighbouring real shards ``wids subset`` copies."""
    return (real, real + 1) if real + 1 < shards else (real - 1, real)


def write_description(root: Path, shards: int, samples: int, real: int) -> Path:
    """The reference description; every shard has the real shard's size.

    Shards ``real`` and ``real + 1`` (or ``real - 1`` at the end) exist: the subset copies them.
    """
    size = write_real_shard(root / shard_name(real), samples)
    if shards > 1:
        write_real_shard(root / shard_name(pair_of(real, shards)[1]), samples)
    path = root / "description.json"
    with open(path, "w") as f:
        f.write('{"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "scale",\n')
        f.write(' "shardlist": [\n')
        for k in range(shards):
            sep = ",\n" if k + 1 < shards else "\n"
            f.write(f'  {{"url": "{shard_name(k)}", "nsamples": {samples}, "filesize": {size}}}')
            f.write(sep)
        f.write("]}\n")
    return path


# -- children (fresh processes) ------------------------------------------------------------------


def _status(pid: int | str = "self") -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _uss(pid: int) -> int:
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def child_parse(src: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    with open(src, "rb") as f:
        json.load(f)
    return {"parse_s": time.perf_counter() - t0}


def child_convert(src: str, dst: str) -> dict[str, Any]:
    import wids

    t0 = time.perf_counter()
    wids.convert_index(src, dst)
    return {"convert_s": time.perf_counter() - t0, "bytes": os.path.getsize(dst)}


def child_info(index: str) -> dict[str, Any]:
    """``wids index info`` in a fresh process that has imported wids."""
    import contextlib
    import io

    from wids.cli import main as cli

    before = _status()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = cli(["index", "info", index, "--json"])
    took = time.perf_counter() - t0
    after = _status()
    if code:
        raise SystemExit(f"wids index info failed: {code}")
    shards = json.loads(out.getvalue())["shards"]
    return {"s": took, "hwm_added": after["VmHWM"] - before["VmHWM"], "shards": shards}


def child_subset(index: str, dest: str, first: int) -> dict[str, Any]:
    """``make_subset`` of 2 shards (``wids subset --shards first:first+2``), fresh process."""
    from wids.subset import make_subset

    before = _status()
    t0 = time.perf_counter()
    report = make_subset(index, dest, shards=slice(first, first + 2), jobs=2)
    took = time.perf_counter() - t0
    after = _status()
    return {"s": took, "hwm_added": after["VmHWM"] - before["VmHWM"], "shards": report.shards}


def _collate(batch: list[Any]) -> list[Any]:
    # A full collection in the worker, as happens sooner or later in every long-lived one: it
    # writes to every tracked object's header, so pages of Python objects inherited from the
    # parent are copied (the cost this benchmark is about); numpy arrays and maps are not.
    gc.collect()
    return [s["__key__"] if isinstance(s, dict) else s for s in batch]


def worker_uss(ds: Any, indices: list[int], workers: int) -> list[int]:
    """Private memory of each DataLoader worker (fork) after it read a batch of ``indices``."""
    import torch

    batches = [indices[i : i + 8] for i in range(0, len(indices), 8)]
    loader = torch.utils.data.DataLoader(
        ds,
        batch_sampler=batches,
        num_workers=workers,
        multiprocessing_context="fork",
        collate_fn=_collate,
        prefetch_factor=1,
    )
    it = iter(loader)
    for _ in range(min(workers, len(batches))):
        next(it)
    time.sleep(0.5)  # let every worker finish its batch
    uss = [_uss(w.pid) for w in it._workers]  # type: ignore[attr-defined]
    del it
    return uss


def child_floor(workers: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    import torch  # noqa: F401

    import wids

    _ = wids.ShardListDataset
    out: dict[str, Any] = {"import_s": time.perf_counter() - t0, "base_rss": _status()["VmRSS"]}
    if workers:
        out["worker_uss"] = worker_uss(list(range(8 * workers)), list(range(8 * workers)), workers)
    return out


def child_open(index: str, target: int, workers: int, first: int, count: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    import torch  # noqa: F401  (the process this is about has torch loaded already)

    import wids

    dataset_class = wids.ShardListDataset  # resolves wids' lazy import of its dataset module
    imported = time.perf_counter() - t0
    before = _status()
    t0 = time.perf_counter()
    ds = dataset_class(index, transformations=[])
    sample = ds[target]
    opened = time.perf_counter() - t0
    after = _status()
    out: dict[str, Any] = {
        "import_s": imported,
        "base_rss": before["VmRSS"],
        "open_s": opened,
        "rss_added": after["VmRSS"] - before["VmRSS"],
        "hwm_added": after["VmHWM"] - before["VmHWM"],
        "key": sample["__key__"],
        "samples": len(ds),
    }
    if workers:
        indices = list(range(first, first + count))
        out["worker_uss"] = worker_uss(ds, indices, workers)
    return out


def run_child(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- the run ---------------------------------------------------------------------------------------


def mb(n: float) -> str:
    return f"{n / 1e6:7.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=1_000_000, help="shards in the description")
    p.add_argument("--samples", type=int, default=10_000, help="samples per shard")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers (0: none)")
    p.add_argument("--formats", default=",".join(FORMATS), help="which of " + ",".join(FORMATS))
    p.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "convert":
            result = child_convert(*rest)
        elif kind == "parse":
            result = child_parse(*rest)
        elif kind == "floor":
            result = child_floor(int(rest[0]))
        elif kind == "info":
            result = child_info(rest[0])
        elif kind == "subset":
            result = child_subset(rest[0], rest[1], int(rest[2]))
        else:
            result = child_open(rest[0], *(int(x) for x in rest[1:]))
        print(json.dumps(result))
        return 0
    formats = [f for f in args.formats.split(",") if f]
    if unknown := set(formats) - set(FORMATS):
        p.error(f"unknown formats {sorted(unknown)}")
    tmp = None if args.dir else tempfile.TemporaryDirectory(prefix="wids-scale-")
    root = Path(args.dir or tmp.name)  # type: ignore[union-attr]
    root.mkdir(parents=True, exist_ok=True)
    try:
        return run(root, args, formats)
    finally:
        if tmp is not None:
            tmp.cleanup()


def run(root: Path, args: argparse.Namespace, formats: list[str]) -> int:
    rng = random.Random(args.seed)
    total = args.shards * args.samples
    target = rng.randrange(total)
    real = target // args.samples
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    t0 = time.perf_counter()
    desc = write_description(root, args.shards, args.samples, real)
    print(
        f"description: {args.shards} shards x {args.samples} samples = {total} samples, "
        f"{os.path.getsize(desc) / 1e6:.1f} MB, written in {time.perf_counter() - t0:.1f} s; "
        f"reading index {target} (shard {real})"
    )
    parse = run_child(["parse", str(desc)])["parse_s"]
    print(f"conversion floor: json.load of the description in a fresh process: {parse:.2f} s")
    paths = {"description": str(desc)}
    converted: dict[str, dict[str, Any]] = {}
    for fmt in formats:
        if fmt == "description":
            continue
        dst = root / f"index{SUFFIX[fmt]}"
        converted[fmt] = run_child(["convert", str(desc), str(dst)])
        paths[fmt] = str(dst)
        print(
            f"convert description -> {fmt:7s}: {converted[fmt]['convert_s']:6.1f} s, "
            f"{converted[fmt]['bytes'] / 1e6:8.1f} MB, "
            f"{converted[fmt]['convert_s'] / parse:5.1f}x the floor"
        )
    first = real * args.samples
    count = min(args.samples, 8 * args.workers)
    floor = run_child(["floor", str(args.workers)])
    fw = " ".join(f"{w / 1e6:.0f}" for w in floor.get("worker_uss", [])) or "-"
    print(
        f"floor (import torch, wids): {floor['import_s']:.2f} s, RSS {mb(floor['base_rss'])} MB; "
        f"workers over a list: {fw} MB each"
    )
    worker_floor = max(floor.get("worker_uss", [0]), default=0)
    results: dict[str, dict[str, Any]] = {}
    header = f"{'format':12s} {'open s':>7s} {'rss+ MB':>8s} {'peak+ MB':>8s} {'worker MB':>22s}"
    print(header)
    for fmt in formats:
        r = run_child(["open", paths[fmt], str(target), str(args.workers), str(first), str(count)])
        results[fmt] = r
        workers = " ".join(f"{w / 1e6:.0f}" for w in r.get("worker_uss", [])) or "-"
        print(
            f"{fmt:12s} {r['open_s']:7.2f} {mb(r['rss_added'])} {mb(r['hwm_added'])} {workers:>22s}"
        )
    keys = {r["key"] for r in results.values()}
    if len(keys) != 1:
        raise SystemExit(f"formats disagree about sample {target}: {keys}")
    base = results.get("description")
    if base is not None and "widx" in results:
        w = results["widx"]
        print(
            f"widx vs description: open {w['open_s'] / base['open_s']:.3f}x, "
            f"rss+ {w['rss_added'] / max(base['rss_added'], 1):.3f}x"
        )
    if "widx" in results:
        w = results["widx"]
        worst = max(w.get("worker_uss", [0]), default=0) - worker_floor
        goals = [
            ("open < 1 s", w["open_s"] < 1.0),
            ("rss+ < 150 MB", w["rss_added"] < 150e6),
            ("workers < 50 MB each (over the floor's)", worst < 50e6),
        ]
        if "widx" in converted:
            goals.append(("conversion < 30 s", converted["widx"]["convert_s"] < 30))
        print("goals (widx): " + ", ".join(f"{g}: {'met' if ok else 'NOT met'}" for g, ok in goals))
    tools = run_tools(root, paths, formats, pair_of(real, args.shards)[0])
    if args.json:
        print(json.dumps({"floor": floor, "convert": converted, "open": results, "tools": tools}))
    return 0


def run_tools(
    root: Path, paths: dict[str, str], formats: list[str], first: int
) -> dict[str, dict[str, Any]]:
    """``wids index info`` and ``wids subset`` of 2 shards per format, each in a fresh process."""
    print(f"{'tool':12s} {'info s':>7s} {'peak+ MB':>8s} {'subset2 s':>9s} {'peak+ MB':>8s}")
    tools: dict[str, dict[str, Any]] = {}
    for fmt in formats:
        info = run_child(["info", paths[fmt]])
        sub = run_child(["subset", paths[fmt], str(root / f"subset-{fmt}"), str(first)])
        tools[fmt] = {"info": info, "subset": sub}
        print(
            f"{fmt:12s} {info['s']:7.2f} {mb(info['hwm_added'])} {sub['s']:9.2f} "
            f"{mb(sub['hwm_added'])}"
        )
    base = tools.get("description")
    if base is not None and "widx" in tools:
        w = tools["widx"]
        ratios = [
            f"{what} {w[what]['s'] / max(base[what]['s'], 1e-9):.3f}x time, "
            f"{w[what]['hwm_added'] / max(base[what]['hwm_added'], 1):.3f}x peak"
            for what in ("info", "subset")
        ]
        print("widx vs description: " + "; ".join(ratios))
    return tools


if __name__ == "__main__":
    sys.exit(main())
