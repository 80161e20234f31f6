#!/usr/bin/env python
"""Lookahead prefetch and ``access="auto"`` behind a latency proxy, before/after in one run.

nginx serves synthetic shards through ``tools/latencyproxy.py`` in its own process (+25 ms to
the first byte of every answer, 50 MB/s per connection, by default). Each row runs a
DataLoader (4 workers, batch 32) over the whole dataset in a fresh subprocess, with the wids
found at ``--wids`` (repeatable: e.g. a checkout of the old code and this tree), and reports
samples/s, the first batch's latency, bytes the proxy sent over the dataset's size and over
the read samples' spans, requests per sample, the requests in flight at the proxy while it
was busy (mean, peak) and the request rate reached over the latency bound of that window
(mean in flight / round trip, the round trip being the delay plus the mean answer's transfer
time). Rows: chunked and fully random orders with
``access="range"`` and with ``access="auto"`` (cache budget a tenth of the dataset for the
random order), webdataset 1.x's streaming pipeline (``--wds-python``) and the floor (every
shard fetched whole, as many connections as workers).

Usage::

    python tools/bench_lookahead.py --wids /tmp/before --wids . \
        --wds-python /tmp/venv-wds/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

_ROW = r"""
import json, sys, time, os, random, tempfile
sys.path.insert(0, {wids!r})
import torch
from torch.utils.data import DataLoader
from wids import ShardListDataset, ChunkedSampler
args = json.loads({args!r})
kw = dict(transformations=[], access=args["access"])
if args["cache"]:
    kw.update(cache_dir=tempfile.mkdtemp(), cache_size=args["budget"])
ds = ShardListDataset(args["index"], **kw)
if args["depth"] is not None:  # the lookahead's window, in batches (a test hook of the pool)
    ds._pool.lookahead_limits = {{"depth": args["depth"]}}
n = len(ds)
if args["order"] == "chunked":
    sampler = ChunkedSampler(ds, chunksize=10**9, seed=0, shufflefirst=True,
                             num_workers=args["workers"], batch_size=args["batch"])
else:
    sampler = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
loader = DataLoader(ds, sampler=sampler, batch_size=args["batch"], num_workers=args["workers"],
                    collate_fn=lambda b: len(b), multiprocessing_context="fork")
t0 = time.perf_counter(); first = None; count = 0
for k in loader:
    if first is None:
        first = time.perf_counter() - t0
    count += k
dt = time.perf_counter() - t0
print(json.dumps({{"samples": count, "seconds": dt, "first": first}}))
"""

_WDS = r"""
import json, sys, time
import webdataset as wds
from torch.utils.data import DataLoader
urls = json.loads(sys.argv[1]); workers = int(sys.argv[2]); batch = int(sys.argv[3])
ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).batched(batch, collation_fn=len)
loader = DataLoader(ds, batch_size=None, num_workers=workers)
t0 = time.perf_counter(); first = None; count = 0
for k in loader:
    if first is None:
        first = time.perf_counter() - t0
    count += k
print(json.dumps({"samples": count, "seconds": time.perf_counter() - t0, "first": first}))
"""

_FLOOR = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import urllib.request
urls = json.loads(sys.argv[1]); workers = int(sys.argv[2])
def get(u):
    with urllib.request.urlopen(u) as r:
        return len(r.read())
t0 = time.perf_counter()
with ThreadPoolExecutor(workers) as ex:
    total = sum(ex.map(get, urls))
dt = time.perf_counter() - t0
print(json.dumps({"samples": 0, "seconds": dt, "first": None, "bytes": total}))
"""


def _run(python: str, code: str, *argv: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [python, "-c", code, *argv], capture_output=True, text=True, timeout=900, env=env
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _window(c: dict, r: dict, delay: float, rate: float) -> tuple[str, str]:
    """The requests in flight at the proxy while busy (mean, peak), and the achieved request
    rate over the latency bound of that window: mean in flight / (delay + mean answer / rate),
    the rate a client keeping that many requests open would reach if only latency limited it.
    """
    if not c["requests"] or not c.get("active_us"):
        return "", ""
    mean = c["in_flight_us"] / c["active_us"]
    rtt = delay + c["bytes_out"] / c["requests"] / rate
    achieved = c["requests"] / r["seconds"]
    return f"{mean:.0f}, {c['in_flight_peak']}", f"{achieved / (mean / rtt):.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wids", action="append", default=[], help="a tree holding wids/ (repeat)")
    p.add_argument("--wds-python", default=None, help="python of a venv with webdataset 1.x")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples", type=int, default=500, help="per shard")
    p.add_argument("--bytes", type=int, default=20_000, help="mean sample payload")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--delay-ms", type=float, default=25.0)
    p.add_argument("--mbps", type=float, default=50.0)
    p.add_argument("--rows", default="range-chunked,auto-chunked,range-random,auto-random")
    p.add_argument(
        "--depth",
        default="",
        help="lookahead depths to compare, in batches (e.g. 1,2,4; default: the dataset's)",
    )
    a = p.parse_args()
    trees = [str(Path(t).resolve()) for t in (a.wids or [str(HERE.parent)])]
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    from latencyproxy import ProxyProcess
    from localservers import Nginx

    from wids import ShardListDataset, build_index
    from wids.synth import write_dataset

    with tempfile.TemporaryDirectory() as tmp:
        www = Path(tmp) / "www"
        paths = write_dataset(
            str(www),
            shards=a.shards,
            samples_per_shard=a.samples,
            real_images=False,
            jpg_bytes=a.bytes,
            prefix="bench",
        )
        size = sum(os.path.getsize(q) for q in paths)
        nginx = Nginx(www, Path(tmp) / "nginx", workers=2)
        try:
            with ProxyProcess(
                f"http://127.0.0.1:{nginx.port}", delay=a.delay_ms / 1000, mbps=a.mbps
            ) as proxy:
                urls = [proxy.url(os.path.basename(q)) for q in paths]
                index = str(Path(tmp) / "train.json")
                build_index(urls, index, name="bench")
                ds = ShardListDataset(index, transformations=[])
                spans = 0
                for i in range(len(ds)):
                    _, shard, local = ds._catalog.locate(i)
                    start, end = ds._catalog.members(shard)[0].span(local)
                    spans += end - start
                print(
                    f"# {a.shards} shards x {a.samples} samples, {size / 1e6:.0f} MB; "
                    f"+{a.delay_ms:.0f} ms, {a.mbps:.0f} MB/s per connection; "
                    f"{a.workers} workers, batch {a.batch}; load {os.getloadavg()[0]:.2f}"
                )
                print(
                    "| row | wids | samples/s | first batch ms | bytes/dataset | "
                    "bytes/spans | requests/sample | in flight (mean, peak) | "
                    "x latency bound |"
                )
                print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

                def show(name: str, tree: str, r: dict) -> None:
                    c = proxy.settled()
                    n = r["samples"] or 1
                    rate = r["samples"] / r["seconds"] if r["samples"] else 0
                    first = f"{r['first'] * 1000:.0f}" if r["first"] is not None else ""
                    flight, ratio = _window(c, r, a.delay_ms / 1000, a.mbps * 1e6)
                    print(
                        f"| {name} | {tree} | {rate:,.0f} | {first} | "
                        f"{c['bytes_out'] / size:.2f} | {c['bytes_out'] / spans:.2f} | "
                        f"{c['requests'] / n:.3f} | {flight} | {ratio} |",
                        flush=True,
                    )

                proxy.reset_counts()
                r = _run(sys.executable, _FLOOR, json.dumps(urls), str(a.workers))
                r["samples"] = len(ds)
                show("floor: whole shards", "-", r)
                if a.wds_python:
                    proxy.reset_counts()
                    r = _run(a.wds_python, _WDS, json.dumps(urls), str(a.workers), str(a.batch))
                    show("webdataset 1.x", "-", r)
                for row in a.rows.split(","):
                    access, order = row.split("-")
                    for tree, depth in [
                        (t, int(d) if d else None) for t in trees for d in a.depth.split(",")
                    ]:
                        args = {
                            "index": index,
                            "access": access,
                            "order": order,
                            "cache": access == "auto",
                            "workers": a.workers,
                            "batch": a.batch,
                            "budget": size // 10 if order == "random" else None,
                            "depth": depth,
                        }
                        proxy.reset_counts()
                        r = _run(sys.executable, _ROW.format(wids=tree, args=json.dumps(args)))
                        label = f"{access} {order}" + (f" depth {depth}" if depth else "")
                        show(label, Path(tree).name, r)
                        time.sleep(0.5)
        finally:
            nginx.stop()


if __name__ == "__main__":
    main()
