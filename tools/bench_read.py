"""Read throughput of ShardListDataset against floors measured in the same run.

Usage::

    python tools/bench_read.py                       # 32 shards x 1000 samples (~700 MB)
    python tools/bench_read.py --shards 8 --samples 500 --n 5000
    python tools/bench_read.py --reference /tmp/wids-refvenv   # also the reference wids

Measurements (all on raw samples, ``transformations=[]``, random order):

- local ``ds[i]`` vs a floor of ``os.pread`` of the same byte spans (goal >= 0.6x);
- ``DataLoader(num_workers=2, batch_size=32)`` over the local shards;
- HTTP (nginx on 127.0.0.1, started here) ``__getitems__`` batches of 32 vs raw
  ``fs.cat_ranges`` of the same spans (goal >= 0.8x), with requests per sample from nginx's
  access log;
- with ``--reference VENV``: the reference wids (webdataset 0.2.x) in its own venv, in a
  subprocess, on the same index and order, as ratios against the same floors.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localservers import Nginx  # noqa: E402

from wids import (
    ShardListDataset,  # noqa: E402
    build_index,  # noqa: E402
    open_index,  # noqa: E402
)
from wids.synth import write_dataset  # noqa: E402


def _prepare(args: argparse.Namespace) -> tuple[str, str]:
    data = args.data or os.path.join(
        tempfile.gettempdir(), f"wids-bench-{args.shards}x{args.samples}"
    )
    index = os.path.join(data, "bench.json")
    if not os.path.exists(index):
        print(f"writing {args.shards} x {args.samples} samples to {data} ...", file=sys.stderr)
        write_dataset(
            data,
            shards=args.shards,
            samples_per_shard=args.samples,
            real_images=False,
            jpg_bytes=20_000,
            prefix="bench",
        )
        build_index(
            [os.path.join(data, f"bench-{s:06d}.tar") for s in range(args.shards)],
            index,
            name="bench",
        )
    return data, index


ROUNDS = 3


def _spans(index: str) -> tuple[list[str], np.ndarray, list[np.ndarray], list[np.ndarray]]:
    reader = open_index(index)
    urls = [s.url for s in reader.shards]
    starts, ends = [], []
    for i in range(len(urls)):
        members = reader.members(i)
        assert members is not None
        a, b = members.spans()
        starts.append(a)
        ends.append(b)
    cum = np.cumsum([len(a) for a in starts])
    reader.close()
    return urls, cum, starts, ends


def _locate(cum: np.ndarray, i: int) -> tuple[int, int]:
    shard = int(np.searchsorted(cum, i, side="right"))
    return shard, i - (int(cum[shard - 1]) if shard else 0)


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("nan")


# -- local ----------------------------------------------------------------------------------


def bench_local(
    index: str, order: list[int], spans: tuple, lru_size: int | None = None
) -> tuple[float, float]:
    """Random ``ds[i]`` vs ``os.pread`` of the same spans (samples/s, best round of each).

    ``lru_size=None`` keeps every shard open (the floor's situation); the dataset's default
    (10) with more shards than that reopens shards as random access moves between them.
    """
    urls, cum, starts, ends = spans
    fds = [os.open(u, os.O_RDONLY) for u in urls]
    plan = []
    for i in order:
        s, j = _locate(cum, i)
        plan.append((fds[s], int(starts[s][j]), int(ends[s][j] - starts[s][j])))
    ds = ShardListDataset(index, transformations=[], lru_size=lru_size or len(urls))
    ds[0]
    floor = ours = 0.0
    for _ in range(ROUNDS):  # alternate, keep the best round of each
        t = time.perf_counter()
        for fd, start, size in plan:
            os.pread(fd, size, start)
        floor = max(floor, _rate(len(plan), time.perf_counter() - t))
        t = time.perf_counter()
        for i in order:
            ds[i]
        ours = max(ours, _rate(len(order), time.perf_counter() - t))
    for fd in fds:
        os.close(fd)
    return ours, floor


def _as_list(batch):  # module level: picklable for worker processes
    return batch


class PreadSpans:
    """The DataLoader floor: a map-style dataset that only ``os.pread``s each sample's span."""

    def __init__(self, urls: list[str], cum: np.ndarray, starts: list, ends: list) -> None:
        self.urls, self.cum = urls, cum.tolist()
        self.starts = [a.tolist() for a in starts]
        self.ends = [b.tolist() for b in ends]
        self.fds: dict[int, int] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "fds": {}}

    def __len__(self) -> int:
        return self.cum[-1]

    def __getitem__(self, i: int) -> bytes:
        import bisect

        s = bisect.bisect_right(self.cum, i)
        j = i - (self.cum[s - 1] if s else 0)
        fd = self.fds.get(s)
        if fd is None:
            fd = self.fds[s] = os.open(self.urls[s], os.O_RDONLY)
        start = self.starts[s][j]
        return os.pread(fd, self.ends[s][j] - start, start)

    def __getitems__(self, idxs: list[int]) -> list[bytes]:
        return [self[i] for i in idxs]


def bench_dataloader(index: str, order: list[int], spans: tuple) -> tuple[float, float]:
    from torch.utils.data import DataLoader

    def run(ds: object) -> float:
        loader: Any = DataLoader(
            ds,  # type: ignore[arg-type]
            batch_size=32,
            num_workers=2,
            sampler=order,
            collate_fn=_as_list,
            prefetch_factor=4,
        )
        t = time.perf_counter()
        n = sum(len(b) for b in loader)
        return _rate(n, time.perf_counter() - t)

    # Both datasets are set up in the parent (as after a first epoch): fork workers inherit the
    # loaded member tables, so the rounds time reading, not index loading.
    ds = ShardListDataset(index, transformations=[], lru_size=len(spans[0]))
    ds.__getitems__([int(c) - 1 for c in spans[1]])
    floor = ours = 0.0
    for _ in range(ROUNDS):
        floor = max(floor, run(PreadSpans(*spans)))
        ours = max(ours, run(ds))
    return ours, floor


# -- HTTP -------------------------------------------------------------------------------------


def bench_http(
    server: Nginx, order: list[int], spans: tuple, data: str
) -> tuple[float, float, float, float]:
    import fsspec

    urls, cum, starts, ends = spans
    http_urls = [f"{server.base}/{os.path.relpath(u, data)}" for u in urls]
    batches = [order[k : k + 32] for k in range(0, len(order), 32)]
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    plans = []
    for b in batches:
        paths, st, en = [], [], []
        for i in b:
            s, j = _locate(cum, i)
            paths.append(http_urls[s])
            st.append(int(starts[s][j]))
            en.append(int(ends[s][j]))
        plans.append((paths, st, en))
    ds = ShardListDataset(f"{server.base}/bench.json", transformations=[], lru_size=len(urls))
    for k in range(min(10, len(plans))):  # warm both connection pools; index loaded
        fs.cat_ranges(*plans[k])
        ds.__getitems__(batches[k])
    floor = ours = 0.0
    floor_rps = rps = 0.0
    for _ in range(ROUNDS):  # alternate, keep the best round of each
        server.reset()
        t = time.perf_counter()
        for p in plans:
            fs.cat_ranges(*p)
        floor = max(floor, _rate(len(order), time.perf_counter() - t))
        floor_rps = server.requests() / len(order)
        server.reset()
        t = time.perf_counter()
        for b in batches:
            ds.__getitems__(b)
        ours = max(ours, _rate(len(order), time.perf_counter() - t))
        rps = server.requests() / len(order)
    return ours, floor, rps, floor_rps


def bench_verify(server: Nginx, order: list[int]) -> tuple[float, float, float]:
    """The cost of verified remote reads: random ``ds[i]`` over nginx, checked and not.

    Verification (the first member's tar header read and checked with each sample) has no
    switch in the API; the benchmark turns it off on the open readers (``reader.verifies``)
    and alternates sample by sample, so both see the same server, cache and load.

    Returns:
        ``(verified samples/s, unverified samples/s, extra bytes per sample)``, the rates
        from the median latency of each.
    """
    ds = ShardListDataset(f"{server.base}/bench.json", transformations=[], access="range")
    nshards = len(ds.shards)
    ds.lru_size = nshards  # every reader stays open: no reopen costs in either half
    cum = ds.cum_lengths
    for s in range(nshards):  # open every reader
        ds[int(cum[s - 1]) if s else 0]
    times: dict[bool, list[float]] = {True: [], False: []}
    nbytes: dict[tuple[int, bool], int] = {}
    for rep in range(2 * ROUNDS):  # each sample read as often verified as not
        for n, i in enumerate(order):
            on = (n + rep) % 2 == 0
            for reader in ds._pool.readers.values():
                reader.verifies = on
            before = ds.stats.bytes_read
            t = time.perf_counter()
            ds[i]
            times[on].append(time.perf_counter() - t)
            nbytes[i, on] = ds.stats.bytes_read - before
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    extra = sum(nbytes[i, True] - nbytes[i, False] for i in order) / max(1, len(order))
    ds.close()
    return 1.0 / med[True], 1.0 / med[False], extra


# -- the reference, in its own venv ------------------------------------------------------------

_REF = textwrap.dedent(
    """
    import json, sys, time
    from wids import ShardListDataset
    index, cache = sys.argv[1], sys.argv[2]
    with open(sys.argv[3]) as f:
        order = json.load(f)
    seconds = float(sys.argv[4])
    ds = ShardListDataset(index, cache_dir=cache, transformations=[])
    ds[order[0]]
    n, t = 0, time.perf_counter()
    for i in order:
        ds[i]
        n += 1
        if time.perf_counter() - t > seconds:
            break
    print(json.dumps({"rate": n / (time.perf_counter() - t), "n": n}))
    """
)


def run_reference(venv: str, script: str, argv: list[str], cwd: str, timeout: float) -> dict | None:
    """Run ``script`` with the reference venv's Python in ``cwd`` (removed afterwards).

    ``cwd`` is a fresh directory so that the reference's ``wids`` is imported, not this
    checkout's. The script's last stdout line is JSON; ``None`` (with a message) on failure.
    """
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"reference venv {venv} not found; skipped", file=sys.stderr)
        shutil.rmtree(cwd, ignore_errors=True)
        return None
    try:
        proc = subprocess.run(
            [python, "-c", script, *argv],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=timeout,
            # this checkout's wids may be on PYTHONPATH; the reference's must win
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
    except subprocess.TimeoutExpired:
        print("reference run timed out; skipped", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    if proc.returncode != 0:
        print(f"reference run failed; skipped:\n{proc.stderr[-800:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_reference(venv: str, index: str, order: list[int], seconds: float) -> float | None:
    cache = tempfile.mkdtemp(prefix="wids-bench-ref-")
    order_file = os.path.join(cache, "order.json")
    with open(order_file, "w") as f:
        json.dump(order, f)
    argv = [index, cache, order_file, str(seconds)]
    result = run_reference(venv, _REF, argv, cache, timeout=seconds * 20 + 300)
    return None if result is None else float(result["rate"])


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--samples", type=int, default=1000, help="samples per shard")
    p.add_argument("--n", type=int, default=20000, help="random samples per measurement")
    p.add_argument("--data", help="dataset directory (generated if it has no bench.json)")
    p.add_argument("--reference", metavar="VENV", help="venv with webdataset==0.2.111")
    p.add_argument("--ref-seconds", type=float, default=20.0, help="time budget per reference run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    data, index = _prepare(args)
    spans = _spans(index)
    total = int(spans[1][-1])
    rng = random.Random(args.seed)
    order = [rng.randrange(total) for _ in range(min(args.n, total))]
    rows: list[tuple[str, float, str, float | None, str]] = []

    ours, floor = bench_local(index, order, spans)
    rows.append(("local ds[i], raw", ours, "os.pread of spans", floor, ">= 0.6"))
    dl, dlfloor = bench_dataloader(index, order, spans)
    rows.append(("DataLoader(workers=2, batch=32)", dl, "same, pread dataset", dlfloor, ""))

    server = Nginx(data)
    try:
        hours, hfloor, rps, floor_rps = bench_http(server, order, spans, data)
        rows.append(("HTTP __getitems__(32)", hours, "fs.cat_ranges(32)", hfloor, ">= 0.8"))
        ref_local = ref_http = None
        if args.reference:
            ref_local = bench_reference(args.reference, index, order, args.ref_seconds)
            if ref_local is not None:
                rows.append(("reference local ds[i]", ref_local, "os.pread of spans", floor, ""))
            ref_http = bench_reference(
                args.reference, f"{server.base}/bench.json", order, args.ref_seconds
            )
            if ref_http is not None:
                rows.append(("reference HTTP ds[i]", ref_http, "fs.cat_ranges(32)", hfloor, ""))
    finally:
        server.stop()

    print(f"\n{args.shards} shards x {args.samples} samples, {len(order)} random reads, {data}")
    print(f"{'measurement':34} {'samples/s':>10}  {'floor':20} {'floor/s':>10} {'ratio':>6}  goal")
    for name, rate, fname, frate, goal in rows:
        ratio = f"{rate / frate:6.3g}" if frate else "     -"
        print(f"{name:34} {rate:10.0f}  {fname:20} {frate or 0:10.0f} {ratio}  {goal}")
    print(f"HTTP requests per sample: ours {rps:.3f}, floor {floor_rps:.3f}")
    if ref_local is not None or ref_http is not None:
        local_x = f"{ours / ref_local:.0f}x" if ref_local else "-"
        http_x = f"{hours / ref_http:.0f}x" if ref_http else "-"
        print(f"ours vs reference wids (random access): local {local_x}, HTTP {http_x}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
