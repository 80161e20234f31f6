#!/usr/bin/env python
"""Header-hopping remote scans against streaming, over HTTP (nginx, 127.0.0.1).

Writes shards of samples with one large member each (``--member-size``, default 1 MB, plus a
small .json and .cls), serves them with nginx and scans every shard twice with
``wids.index.scan_shard``: as the builder does (it chooses hopping from the first headers)
and forced to stream. Prints bytes read as a share of the shard bytes (goal <= 5% for members
of 1 MB or more), requests, seconds, and whether the member tables are identical. A last row
scans shards of small members (20 KB) to show that they are streamed.

Example:
    python tools/bench_hop.py --shards 4 --samples 50 --member-size 1000000
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from wids.index import scan_shard
from wids.storage import IOStats, Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localservers import Nginx  # noqa: E402


def write_shards(root: Path, shards: int, samples: int, size: int, tag: str) -> list[str]:
    names = []
    for s in range(shards):
        name = f"{tag}-{s:04d}.tar"
        with tarfile.open(root / name, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(samples):
                for ext, n in ((".json", 300), (".mp4", size), (".cls", 2)):
                    ti = tarfile.TarInfo(f"clips/{s:04d}/{i:06d}{ext}")
                    ti.size = n
                    tf.addfile(ti, io.BytesIO(bytes([i % 251]) * n))
        names.append(name)
    return names


def scan_all(urls: list[str], hop: bool | None) -> tuple[float, IOStats, list]:
    stats = IOStats()
    store = Store()
    t0 = time.perf_counter()
    tables = [scan_shard(store.source(u), stats=stats, hop=hop)[1] for u in urls]
    return time.perf_counter() - t0, stats, tables


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--member-size", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wids-bench-hop-") as tmp:
        root = Path(tmp)
        big = write_shards(root, args.shards, args.samples, args.member_size, "big")
        small = write_shards(root, args.shards, args.samples, 20_000, "small")
        server = Nginx(str(root))
        try:
            print(
                f"{args.shards} shards x {args.samples} samples over nginx on 127.0.0.1; "
                f"load {os.getloadavg()[0]:.1f}"
            )
            print(f"{'shards':28} {'scan':8} {'seconds':>8} {'requests':>9} {'read/bytes':>11}")
            for label, names in ((f"members of {args.member_size:,} B", big), ("20 KB", small)):
                urls = [f"{server.base}/{n}" for n in names]
                total = sum((root / n).stat().st_size for n in names)
                chosen = scan_all(urls, None)
                streamed = scan_all(urls, False)
                for what, (t, st, _) in (("auto", chosen), ("stream", streamed)):
                    print(
                        f"{label:28} {what:8} {t:8.3f} {st.requests:9d} "
                        f"{st.bytes_read / total:11.4f}"
                    )
                print(f"{'':28} member tables identical: {chosen[2] == streamed[2]}")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
