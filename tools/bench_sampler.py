"""Time and memory from a dataset's shard lengths to each sampler's first index.

Builds a stand-in for a dataset (what the samplers read: ``.lengths``, and ``.components`` for
mixing) of ``--shards`` shards of about ``--per-shard`` samples (10^6 x 10^4 = 10^10 samples by
default), then, in a fresh process per sampler, measures the wall time and the growth of peak
RSS (``ru_maxrss``) from before the sampler is built to its first index. The goal (issue 14):
every sampler under 1 s and 50 MB at 10^10 samples in 10^6 shards. The floor printed first is
the same measurement for a sampler-free baseline: summing the lengths once.

Usage: python tools/bench_sampler.py [--shards 1000000] [--per-shard 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

SAMPLERS = {
    "floor: sum(lengths)": "sum(ds.lengths)",
    "ChunkedSampler": "ChunkedSampler(ds)",
    "ChunkedSampler(mix=True)": "ChunkedSampler(ds, mix=True)",
    "ChunkedSampler(num_workers=4)": "ChunkedSampler(ds, num_workers=4, batch_size=32)",
    "DistributedChunkedSampler block": "DistributedChunkedSampler(ds, num_replicas=8, rank=3)",
    "DistributedChunkedSampler global": (
        "DistributedChunkedSampler(ds, num_replicas=8, rank=3, partition='global')"
    ),
    "DistributedChunkedSampler(mix=True)": (
        "DistributedChunkedSampler(ds, num_replicas=8, rank=7, mix=True)"
    ),
    "ShardedSampler": "ShardedSampler(ds, shufflefirst=True)",
}


@dataclass
class Component:
    """A sub-dataset as the mixing samplers read it."""

    name: str
    start: int
    stop: int
    weight: float | None


class FakeDataset:
    """Shard lengths like a ShardListDataset's (distinct int objects), three weighted parts."""

    def __init__(self, shards: int, per_shard: int) -> None:
        self.lengths = [per_shard + (i % 7) - 3 for i in range(shards)]
        total, third = sum(self.lengths), sum(self.lengths[: shards // 3])
        self.components = [
            Component("a", 0, third, 3.0),
            Component("b", third, 2 * third, 1.0),
            Component("c", 2 * third, total, 0.5),
        ]

    def __len__(self) -> int:
        return self.components[-1].stop


def measure(expr: str, shards: int, per_shard: int) -> dict[str, float]:
    from wids import ChunkedSampler, ShardedSampler
    from wids.sampler import DistributedChunkedSampler

    ds = FakeDataset(shards, per_shard)
    names = {"ds": ds, "ChunkedSampler": ChunkedSampler, "ShardedSampler": ShardedSampler}
    names["DistributedChunkedSampler"] = DistributedChunkedSampler
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    sampler = eval(expr, names)
    first = next(iter(sampler)) if not isinstance(sampler, int) else sampler
    seconds = time.perf_counter() - t0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    return {"seconds": seconds, "mb": grown / 1024, "first": first, "samples": len(ds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=10**6)
    parser.add_argument("--per-shard", type=int, default=10**4)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(SAMPLERS[args.one], args.shards, args.per_shard)))
        return
    print(f"load {os.getloadavg()[0]:.1f}; {args.shards} shards x ~{args.per_shard} samples")
    floor = None
    for name in SAMPLERS:
        cmd = [sys.executable, __file__, "--shards", str(args.shards)]
        cmd += ["--per-shard", str(args.per_shard), "--one", name]
        try:
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            print(f"{name:38s} more than 60 s")
            continue
        r = json.loads(out.stdout)
        floor = floor or max(r["seconds"], 1e-6)
        print(
            f"{name:38s} {r['seconds']:7.3f} s ({r['seconds'] / floor:6.1f}x floor) "
            f"{r['mb']:7.1f} MB peak RSS growth   samples={r['samples']:.3g}"
        )


if __name__ == "__main__":
    main()
