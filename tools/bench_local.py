#!/usr/bin/env python
"""Local files: wids against floors and litdata, as ratios measured in the same run.

Rows (raw bytes throughout, ``transformations=[]``; best round of each, rounds alternating):

- ``DataLoader(2 workers, batch 32)`` over local shards, fully random order (torch's
  ``RandomSampler``, one epoch), the dataset at default settings, against
  - a DataLoader over a dataset that only ``os.pread``s the same spans (same order), and
  - litdata's ``StreamingDataLoader`` on its converted copy of the same samples (one epoch,
    ``shuffle=True``), in its own venv (``--litdata VENV``; it returns ``memoryview`` fields,
    made ``bytes`` in its collate);
- random ``ds[i]`` at default settings (``lru_size=10``) against ``os.pread`` of the same
  spans with every shard's file open, over 32 shards and over 4,096 shards.

Each row is timed by the wall clock and, on a second line marked ``(CPU)``, by CPU time: the
reading thread's (``time.thread_time``) for ``ds[i]``, the main process's and its workers' for
a DataLoader (``getrusage``). On a machine other work keeps busy the wall-clock ratios wander
with the load; the CPU ones hold (the cost of a sample, not the share of the cores it got).

``len(ds)`` before each epoch loads the description (and, for a small local index, parses its
member tables, which forked workers then inherit: ~25 ms for 32 x 1,000 samples); it is not
timed, as a sampler calls it before the loader starts any worker.

Datasets are written once under the temp directory and reused (the litdata copy beside).

Usage::

    python tools/bench_local.py                  # 32 x 1000 and 4,096 x 8 samples of ~20 KB
    python tools/bench_local.py --quick          # small, seconds
    python tools/bench_local.py --only random    # just the ds[i] rows
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import bench_read  # noqa: E402

ROUNDS = 3


def _shape(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    shards, samples = (int(x) for x in text.split(","))
    return shards, samples


def prepare(root: str, shards: int, samples: int, jpg_bytes: int) -> str:
    """The index of a dataset of local shards under ``root`` (written once, reused)."""
    from wids import build_index
    from wids.synth import write_dataset

    data = os.path.join(root, f"wids-bench-local-{shards}x{samples}x{jpg_bytes}")
    index = os.path.join(data, "bench.json")
    if not os.path.exists(index):
        print(f"writing {shards} x {samples} samples to {data} ...", file=sys.stderr)
        paths = write_dataset(
            data,
            shards=shards,
            samples_per_shard=samples,
            real_images=False,
            jpg_bytes=jpg_bytes,
            prefix="bench",
        )
        build_index(paths, index, name="bench", jobs=2)
    return index


# -- random ds[i] -------------------------------------------------------------------------------


def random_reads(index: str, n: int, seed: int = 0) -> tuple[float, float]:
    """Random ``ds[i]`` at default settings vs ``os.pread`` with every file open (samples/s)."""
    from wids import ShardListDataset

    urls, cum, starts, ends = bench_read._spans(index)
    rng = random.Random(seed)
    order = [rng.randrange(int(cum[-1])) for _ in range(n)]
    fds = [os.open(u, os.O_RDONLY) for u in urls]
    plan = []
    for i in order:
        s, j = bench_read._locate(cum, i)
        plan.append((fds[s], int(starts[s][j]), int(ends[s][j] - starts[s][j])))
    ds = ShardListDataset(index, transformations=[])  # default settings
    ds[order[0]]  # the index loaded; not part of the timing
    floor = ours = floor_cpu = ours_cpu = 0.0
    try:
        for _ in range(ROUNDS):
            t, c = time.perf_counter(), time.thread_time()
            for fd, start, size in plan:
                os.pread(fd, size, start)
            floor = max(floor, n / (time.perf_counter() - t))
            floor_cpu = max(floor_cpu, n / (time.thread_time() - c))
            t, c = time.perf_counter(), time.thread_time()
            for i in order:
                ds[i]
            ours = max(ours, n / (time.perf_counter() - t))
            ours_cpu = max(ours_cpu, n / (time.thread_time() - c))
    finally:
        for fd in fds:
            os.close(fd)
        ds.close()
    return ours, floor, ours_cpu, floor_cpu


# -- DataLoader ---------------------------------------------------------------------------------


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended (DataLoader workers)."""
    import resource

    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def dataloaders(index: str, seed: int = 0) -> tuple[float, float, float, float]:
    """One random epoch through a DataLoader: wids at defaults vs a pread-only dataset.

    Returns samples/s by the wall clock and by CPU time (this process and its workers), for
    wids and for the floor.
    """
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from wids import ShardListDataset

    spans = bench_read._spans(index)

    def epoch(ds: Any) -> tuple[float, float]:
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
        loader: Any = DataLoader(
            ds, batch_size=32, num_workers=2, sampler=sampler, collate_fn=bench_read._as_list
        )
        t, c = time.perf_counter(), _cpu()
        n = sum(len(b) for b in loader)
        wall = time.perf_counter() - t
        del loader  # its workers end and are counted
        return n / wall, n / (_cpu() - c)

    ours = floor = ours_cpu = floor_cpu = 0.0
    for _ in range(ROUNDS):
        rate, cpu = epoch(bench_read.PreadSpans(*spans))
        floor, floor_cpu = max(floor, rate), max(floor_cpu, cpu)
        ds = ShardListDataset(index, transformations=[])  # as a user makes it
        len(ds)
        rate, cpu = epoch(ds)
        ours, ours_cpu = max(ours, rate), max(ours_cpu, cpu)
        ds.close()
    return ours, floor, ours_cpu, floor_cpu


_LITDATA_CONVERT = textwrap.dedent(
    """
    import json, sys, tarfile
    from litdata import optimize

    def samples(path):
        current, key = {}, None
        with tarfile.open(path) as tar:
            for m in tar:
                if not m.isfile():
                    continue
                base, _, ext = m.name.rpartition("/")[2].partition(".")
                k = m.name.rpartition("/")[0] + "/" + base
                if key is not None and k != key:
                    yield current
                    current = {}
                key = k
                current["__key__"] = k
                current[ext] = tar.extractfile(m).read()
        if current:
            yield current

    if __name__ == "__main__":
        shards, out = json.loads(sys.argv[1]), sys.argv[2]
        optimize(fn=samples, inputs=shards, output_dir=out, chunk_bytes="64MB", num_workers=1,
                 mode="overwrite")
    """
)

_LITDATA_READ = textwrap.dedent(
    """
    import json, sys, time
    from litdata import StreamingDataLoader, StreamingDataset

    def collate(batch):  # memoryview fields cannot be pickled back from the workers
        return [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items()}
                for s in batch]

    if __name__ == "__main__":
        out, rounds = sys.argv[1], int(sys.argv[2])
        best = 0.0
        for r in range(rounds):
            ds = StreamingDataset(out, shuffle=True, seed=r)
            loader = StreamingDataLoader(ds, batch_size=32, num_workers=2, collate_fn=collate)
            t = time.perf_counter()
            n = sum(len(b) for b in loader)
            best = max(best, n / (time.perf_counter() - t))
        print(json.dumps({"rate": best, "n": n}))
    """
)


def litdata_loader(venv: str, index: str) -> float | None:
    """litdata's StreamingDataLoader on its converted copy (made once), samples/s; or None."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"bench_local: no litdata venv at {venv}; skipped", file=sys.stderr)
        return None
    urls = bench_read._spans(index)[0]
    out = os.path.dirname(index) + "-litdata"  # beside the shards, not among them
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    work = tempfile.mkdtemp(prefix="wids-bench-litdata-")
    try:
        if not os.path.exists(os.path.join(out, "index.json")):
            print(f"converting to litdata in {out} ...", file=sys.stderr)
            script = os.path.join(work, "convert.py")  # optimize() pickles fn: a real module
            Path(script).write_text(_LITDATA_CONVERT)
            subprocess.run([python, script, json.dumps(urls), out], env=env, cwd=work, check=True)
        script = os.path.join(work, "read.py")
        Path(script).write_text(_LITDATA_READ)
        proc = subprocess.run(
            [python, script, out, str(ROUNDS)],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        print(f"bench_local: litdata failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    total = int(bench_read._spans(index)[1][-1])
    if got["n"] != total:
        print(f"bench_local: litdata read {got['n']} samples, not {total}", file=sys.stderr)
        return None
    return float(got["rate"])


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small datasets (8 x 200, 512 x 4)")
    p.add_argument("--only", choices=["loader", "random"], help="one group of rows")
    p.add_argument("--n", type=int, help="random ds[i] reads per round (20000; --quick 2000)")
    p.add_argument("--small", help="SHARDS,SAMPLES of the first dataset (32,1000; --quick 8,200)")
    p.add_argument("--many", help="SHARDS,SAMPLES of the many-shard one (4096,8; --quick 512,4)")
    p.add_argument("--root", help="where datasets are written and reused (the temp directory)")
    p.add_argument("--litdata", default="/tmp/venv-litdata", help="venv with litdata and torch")
    args = p.parse_args(argv)
    small = _shape(args.small) or ((8, 200) if args.quick else (32, 1000))
    many = _shape(args.many) or ((512, 4) if args.quick else (4096, 8))
    root = args.root or tempfile.gettempdir()
    n = args.n or (2000 if args.quick else 20000)
    load = os.getloadavg()
    t0 = time.perf_counter()
    rows: list[tuple[str, float, str, float]] = []
    figures: dict[str, float] = {}
    if args.only in (None, "loader"):
        index = prepare(root, *small, 20_000)
        ours, floor, ours_cpu, floor_cpu = dataloaders(index)
        what = f"DataLoader(2 workers, batch 32), {small[0]} shards, random epoch"
        rows.append((what, ours, "DataLoader over an os.pread-only dataset", floor))
        rows.append(("  (CPU)", ours_cpu, "  (CPU)", floor_cpu))
        figures.update(loader=ours, loader_pread=floor)
        figures.update(loader_cpu=ours_cpu, loader_pread_cpu=floor_cpu)
        lit = litdata_loader(args.litdata, index)
        if lit is not None:
            rows.append((what, ours, "litdata StreamingDataLoader (2 workers, 32)", lit))
            figures["litdata"] = lit
    if args.only in (None, "random"):
        for shards, samples in (small, many):
            index = prepare(root, shards, samples, 20_000)
            ours, floor, ours_cpu, floor_cpu = random_reads(index, n)
            what = f"random ds[i], defaults, {shards:,} shards"
            rows.append((what, ours, "os.pread, every file open", floor))
            rows.append(("  (CPU)", ours_cpu, "  (CPU)", floor_cpu))
            figures.update({f"random_{shards}": ours, f"random_{shards}_pread": floor})
            cpu = {f"random_{shards}_cpu": ours_cpu, f"random_{shards}_pread_cpu": floor_cpu}
            figures.update(cpu)
    print(
        f"local files, warm page cache, raw bytes; load average at start {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}, at end {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    print(f"command: python tools/bench_local.py {' '.join(argv or sys.argv[1:])}".rstrip())
    head = (
        f"{'measurement':58} {'samples/s':>10}  {'against (same run)':44} {'samples/s':>10} ratio"
    )
    print(head)
    print("-" * len(head))
    for what, value, against, other in rows:
        print(f"{what:58} {value:10,.0f}  {against:44} {other:10,.0f} {value / other:5.2f}")
    print(
        "goals (issue 12): DataLoader >= 0.9x the pread DataLoader and >= 1.0x litdata; "
        "ds[i] >= 0.5x pread"
    )
    return figures


if __name__ == "__main__":
    main()
    sys.exit(0)
