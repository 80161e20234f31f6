#!/usr/bin/env python
"""Benchmark index builds on a Dask cluster against one process, over HTTP (nginx, 127.0.0.1).

Serves a generated dataset (``bench_index.generate_dataset``: jpg ~20 KB + cls + json) with
nginx and builds its JSON index three ways, interleaved, best of ``--repeat``:

- one process: ``build_index(urls, ...)`` here (remote shards: streams in threads);
- ``LocalCluster(n_workers=1)``: the same jobs on one worker process;
- ``LocalCluster(n_workers=2)``: two worker processes (goal: >= 1.6x the members/s of one
  process), with the bytes read equal to the one-process build's.

Every run is a full build (``incremental=False``) into a fresh directory; the sidecars of the
cluster builds are compared byte for byte with the one-process build's.

Dask starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also pins glibc's mmap
threshold at 128 KiB: every 1 MiB chunk a stream reads is then mmap'ed and unmapped, and
scans run about 2x slower than in a plain process. The benchmark starts its workers with
``MALLOC_MMAP_THRESHOLD_=33554432`` as well (``--dask-malloc`` keeps Dask's settings); a
cluster indexing shards wants the same (``distributed.nanny.pre-spawn-environ``).

Example:
    python tools/bench_dask.py --shards 16 --samples 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from wids import build_index

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_index import generate_dataset  # noqa: E402
from localservers import Nginx  # noqa: E402


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((directory / "idx.members").iterdir())}


def _warm(client) -> None:
    """Import wids on every worker before timing (a cold worker pays it once)."""

    def imp() -> int:
        import wids.index.jobs  # noqa: F401

        return 1

    client.run(imp)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="dataset directory (created or reused)")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--jpg-size", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="threads per worker (4)")
    parser.add_argument(
        "--dask-malloc",
        action="store_true",
        help="keep Dask's worker malloc settings (MALLOC_TRIM_THRESHOLD_=65536 alone, which "
        "also fixes the mmap threshold at 128 KiB: every 1 MiB chunk of a stream is then "
        "mmap'ed and unmapped, about 2x slower scans)",
    )
    args = parser.parse_args(argv)

    import dask
    import distributed

    if not args.dask_malloc:  # allocations of stream chunks from the heap, as in one process
        dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 1 << 25})

    tmp = None
    root = args.data
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="wids-bench-dask-")
        root = Path(tmp.name)
    paths = generate_dataset(root, args.shards, args.samples, args.jpg_size)
    total = sum(p.stat().st_size for p in paths)
    server = Nginx(str(paths[0].parent))
    clusters: list = []
    try:
        urls = [f"{server.base}/{p.name}" for p in paths]
        for n in (1, 2):
            lc = distributed.LocalCluster(
                n_workers=n,
                threads_per_worker=args.threads,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",  # loopback, any free port (8787 may be taken)
                silence_logs=50,
            )
            client = distributed.Client(lc)
            _warm(client)
            clusters.append((lc, client))
        runs: dict[str, Callable[[Path], object]] = {
            "one process": lambda out: build_index(urls, str(out), incremental=False),
            "LocalCluster, 1 worker": lambda out: build_index(
                urls, str(out), incremental=False, executor=clusters[0][1].get_executor()
            ),
            "LocalCluster, 2 workers": lambda out: build_index(
                urls, str(out), incremental=False, executor=clusters[1][1].get_executor()
            ),
        }
        best: dict[str, float] = {}
        reports: dict[str, object] = {}
        trees: dict[str, dict[str, bytes]] = {}
        with tempfile.TemporaryDirectory(prefix="wids-bench-dask-out-") as work:
            for r in range(args.repeat):
                for name, run in runs.items():
                    out = Path(work) / f"{r}-{name.replace(' ', '_').replace(',', '')}"
                    out.mkdir()
                    t0 = time.perf_counter()
                    reports[name] = run(out / "idx.json")
                    dt = time.perf_counter() - t0
                    best[name] = min(best.get(name, dt), dt)
                    trees[name] = _tree(out)
        members = args.shards * args.samples * 3
        ref = "one process"
        print(
            f"dataset: {args.shards} shards x {args.samples} samples, {total / 1e6:.0f} MB over "
            f"nginx on 127.0.0.1; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
            f"best of {args.repeat}; {args.threads} threads per worker; worker malloc: "
            f"{'Dask defaults' if args.dask_malloc else 'MALLOC_MMAP_THRESHOLD_=32 MiB'}"
        )
        head = ("what", "seconds", "members/s", "vs one process", "bytes read")
        print(f"{head[0]:26} {head[1]:>8} {head[2]:>11} {head[3]:>15} {head[4]:>12}")
        for name, t in best.items():
            rep = reports[name]
            print(
                f"{name:26} {t:8.2f} {members / t:11,.0f} {best[ref] / t:14.2f}x "
                f"{rep.bytes_read:12,d}"  # type: ignore[attr-defined]
            )
        same_bytes = len({rep.bytes_read for rep in reports.values()}) == 1  # type: ignore[attr-defined]
        same_tables = all(t == trees[ref] for t in trees.values())
        print(
            f"2 workers vs one process: {best[ref] / best['LocalCluster, 2 workers']:.2f}x "
            f"members/s [goal >= 1.6]; bytes read identical: {same_bytes}; "
            f"member tables byte-identical: {same_tables}"
        )
    finally:
        for lc, client in clusters:
            client.close()
            lc.close()
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
