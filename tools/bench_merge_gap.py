"""``merge_gap``: bytes read against requests, on loopback and through the latency proxy.

Usage::

    python tools/bench_merge_gap.py                 # 8 shards x 200 samples of ~20 KB
    python tools/bench_merge_gap.py --jpg-bytes 4000 --gaps 0,4096,65536

``access="range"``, no cache, one process reading batches of ``--batch`` in two orders: a
chunked sampler's (one chunk per shard: a batch holds a share of one shard's samples) and a
random permutation. For each ``merge_gap``: requests and bytes per sample (nginx's access log
on loopback; the proxy's counters through ``tools/latencyproxy.py``, 25 ms a request and
50 MB/s a connection by default) and samples/s. Pick the gap where the proxy's samples/s stop
rising while the bytes stay near the samples' own.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latencyproxy import LatencyProxy  # noqa: E402
from localservers import Nginx  # noqa: E402

from wids import ShardListDataset, build_index  # noqa: E402
from wids.sampler import ChunkedSampler  # noqa: E402
from wids.synth import write_dataset  # noqa: E402


def epoch(index: str, gap: int, order: str, batch: int) -> tuple[int, float]:
    ds = ShardListDataset(index, access="range", merge_gap=gap, transformations=[])
    n = len(ds)
    if order == "chunked":
        idx = [int(i) for i in ChunkedSampler(ds, chunksize=n // len(ds.lengths), seed=1)]
    else:
        idx = list(range(n))
        random.Random(1).shuffle(idx)
    t0 = time.perf_counter()
    for k in range(0, n, batch):
        ds.__getitems__(idx[k : k + batch])
    elapsed = time.perf_counter() - t0
    ds.close()
    return n, elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--jpg-bytes", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--gaps", default="0,4096,16384,65536,262144")
    p.add_argument("--delay", type=float, default=0.025)
    p.add_argument("--mbps", type=float, default=50.0)
    args = p.parse_args(argv)
    gaps = [int(g) for g in args.gaps.split(",")]
    root = tempfile.mkdtemp(prefix="wids-bench-gap-")
    try:
        paths = write_dataset(
            os.path.join(root, "data"),
            shards=args.shards,
            samples_per_shard=args.samples,
            real_images=False,
            jpg_bytes=args.jpg_bytes,
            prefix="gap",
        )
        total = sum(os.path.getsize(q) for q in paths)
        nginx = Nginx(root)
        proxy = LatencyProxy(nginx.base, delay=args.delay, mbps=args.mbps).start()
        try:
            print(
                f"{args.shards} shards x {args.samples} samples, {total / 1e6:.1f} MB, batches "
                f"of {args.batch}; proxy: {args.delay * 1e3:.0f} ms a request, "
                f"{args.mbps:g} MB/s a connection"
            )
            print(
                f"{'where':<9} {'order':<8} {'merge_gap':>9} {'req/sample':>10} "
                f"{'bytes/ds':>8} {'samples/s':>9}"
            )
            for where, base in (("loopback", nginx.base), ("proxy", proxy.base)):
                index = os.path.join(root, f"{where}.json")
                urls = [f"{base}/data/{os.path.basename(q)}" for q in paths]
                build_index(urls, index, name="gap")
                for order in ("chunked", "random"):
                    for gap in gaps:
                        nginx.reset()
                        proxy.reset_counts()
                        n, elapsed = epoch(index, gap, order, args.batch)
                        if where == "loopback":
                            requests, served = nginx.counts()
                        else:
                            c = proxy.settled()
                            requests, served = c["requests"], c["bytes_out"]
                        print(
                            f"{where:<9} {order:<8} {gap:>9} {requests / n:>10.3f} "
                            f"{served / total:>8.2f} {n / elapsed:>9.0f}",
                            flush=True,
                        )
        finally:
            proxy.stop()
            nginx.stop()
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
