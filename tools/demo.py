#!/usr/bin/env python
"""The wids demo: real JPEG shards, an index, a server on 127.0.0.1, one epoch, a grid image.

1. writes a small dataset of WebDataset shards (real JPEGs with labels, ``wids.synth``);
2. serves them from nginx (HTTP) or moto_server (S3) on 127.0.0.1, whichever is installed
   (else reads the local files, and says so);
3. builds the member-offset index with a progress bar (one pass over each shard);
4. runs one epoch through a DataLoader (2 workers) with ``DistributedChunkedSampler``
   (``num_replicas=1, rank=0``), decoding the images to uint8 tensors, reading each sample
   with a range request and moving shards into a local cache once they are being read
   (``access="auto"``);
5. prints samples/s, requests per sample, bytes read and cache hits (from the workers'
   ``ds.stats``, and from nginx's access log), then draws a grid with ``wids show``.

Servers are stopped by their pid and the temporary directory removed at the end, whatever
happens. Nothing leaves 127.0.0.1.

Usage::

    python tools/demo.py                      # grid written to ./wids-demo-grid.png
    python tools/demo.py --server s3 --grid /tmp/grid.png
    python tools/demo.py --server local --shards 4 --samples 50
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localservers import Moto, Nginx, which  # noqa: E402

# s3fs must never look for credentials or instance metadata off this machine.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

BATCH = 32
WORKERS = 2


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


# -- servers on 127.0.0.1 ---------------------------------------------------------------------


def start_server(
    kind: str, shards: list[Path], work: Path
) -> tuple[Nginx | Moto | None, list[str]]:
    """Start the server (``auto``: nginx, else moto); return it and the shards' URLs."""
    root = shards[0].parent
    nginx = which("nginx", "/usr/sbin/nginx")
    moto = which("moto_server")
    if kind in ("auto", "http") and nginx:
        server: Nginx | Moto = Nginx(root.parent, work / "nginx")
        return server, [server.url(p) for p in shards]
    if kind in ("auto", "s3") and moto:
        try:
            import s3fs  # noqa: F401
        except ImportError:
            moto = None
        if moto:
            s3 = Moto("wids-demo", work / "moto")
            try:
                return s3, [s3.upload(p) for p in shards]
            except BaseException:
                s3.stop()
                raise
    if kind != "local":
        print(
            f"  no {'nginx or moto_server' if kind == 'auto' else kind + ' server'} found: "
            "reading the local files instead (install nginx to see remote reads)"
        )
    return None, [str(p) for p in shards]


# -- the epoch ----------------------------------------------------------------------------------


def to_pair(sample: dict[str, Any]) -> tuple[Any, int]:
    """Sample dict -> (uint8 CHW image tensor, label)."""
    return sample[".jpg"], sample[".cls"]


def run_epoch(index: str, storage_options: dict[str, Any], cache_dir: Path) -> dict[str, Any]:
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    from wids import DistributedChunkedSampler, ShardListDataset, WorkerStats

    ds = ShardListDataset(
        index,
        transformations="torchrgb8",
        storage_options=storage_options,
        cache_dir=cache_dir,
        access="auto",
    ).add_transform(to_pair)
    sampler = DistributedChunkedSampler(
        ds, num_replicas=1, rank=0, seed=0, num_workers=WORKERS, batch_size=BATCH
    )
    sampler.set_epoch(0)
    stats = WorkerStats()  # each worker's ds.stats, carried by the batches it sends
    loader = DataLoader(
        ds, batch_size=BATCH, sampler=sampler, num_workers=WORKERS, collate_fn=stats.collate()
    )
    labels: list[int] = []
    shape = None
    t0 = time.perf_counter()
    with tqdm(total=len(sampler), unit="sample", desc="epoch 0", leave=True) as bar:
        for images, batch_labels in stats.batches(loader):
            shape = shape or tuple(images.shape)
            labels += batch_labels.tolist()
            bar.update(len(batch_labels))
    seconds = time.perf_counter() - t0
    total = stats.total()
    return {"seconds": seconds, "labels": labels, "stats": total, "shape": shape, "len": len(ds)}


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--server",
        choices=["auto", "http", "s3", "local"],
        default="auto",
        help="where the shards are read from (auto: nginx, else moto_server, else local files)",
    )
    p.add_argument("--shards", type=int, default=8, help="number of shards (8)")
    p.add_argument("--samples", type=int, default=125, help="samples per shard (125)")
    p.add_argument("--image-size", type=int, default=96, help="side of the JPEGs (96)")
    p.add_argument("--grid", default="wids-demo-grid.png", help="grid image to write")
    args = p.parse_args(argv)

    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr] # keep order with tqdm
    import wids
    from wids import ShardCache, build_index
    from wids.synth import CLASS_NAMES, write_dataset

    # SIGTERM unwinds like Ctrl-C, so the servers and the temp dir are cleaned up either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="wids-demo-"))
    server: Nginx | Moto | None = None
    try:
        n = args.shards * args.samples
        print(f"wids demo (wids from {os.path.dirname(wids.__file__)})")
        t = time.perf_counter()
        paths = [
            Path(q)
            for q in write_dataset(
                str(work / "data"),
                shards=args.shards,
                samples_per_shard=args.samples,
                image_size=args.image_size,
                prefix="demo",
            )
        ]
        size = sum(q.stat().st_size for q in paths)
        print(
            f"[1/5] wrote {args.shards} shards of {args.samples} samples (real "
            f"{args.image_size}x{args.image_size} JPEGs, .cls labels of {len(CLASS_NAMES)} "
            f"classes, .json), {_mb(size)}, in {time.perf_counter() - t:.1f} s"
        )

        server, urls = start_server(args.server, paths, work)
        if isinstance(server, Nginx):
            where = f"served by nginx (HTTP) at {server.base}/ (pid {server.proc.pid})"
        elif isinstance(server, Moto):
            where = (
                f"served by moto_server (S3) at 127.0.0.1:{server.port}, bucket "
                f"s3://{server.bucket} (pid {server.proc.pid})"
            )
        else:
            where = f"read from local files in {paths[0].parent} (no server)"
        print(f"[2/5] shards {where}")
        options = server.storage_options if server else {}

        index = str(work / "index" / "demo.json")
        how = "its tar headers" if server is None else "a single stream of it"
        print(f"[3/5] building the index: one pass over each shard, reading {how}")
        report = build_index(urls, index, storage_options=options, name="demo", progress=True)
        index_bytes = sum(f.stat().st_size for f in Path(index).parent.rglob("*") if f.is_file())
        print(
            f"      {os.path.relpath(index, work)}: {report.shards} shards, {report.samples} "
            f"samples, {index_bytes / 1e3:.0f} KB of index in {report.seconds:.2f} s"
        )

        print(
            f"[4/5] one epoch: DataLoader(num_workers={WORKERS}, batch_size={BATCH}) with "
            "DistributedChunkedSampler(num_replicas=1, rank=0), JPEG -> uint8 tensor, "
            'access="auto" (range reads; shards being read move into a local cache)'
        )
        counted = isinstance(server, Nginx)
        before = server.counts() if isinstance(server, Nginx) else None
        cache_dir = work / "cache"
        epoch = run_epoch(index, options, cache_dir)
        served = server.counts() if isinstance(server, Nginx) else None
        _summary(epoch, n, size, served, before if counted else None, cache_dir)
        cached = ShardCache(str(cache_dir)).entries()
        if server is None:
            print("      cache: not used, local shards are read in place")
        else:
            requests = served[0] - before[0] if served and before else None
            if requests is not None and requests <= len(cached):  # no range request at all
                how = (
                    "each shard was fetched whole once in the background, ahead of its batches, "
                    "and read from local disk"
                )
            else:
                how = (
                    "each shard's first batch came by range requests (nearby samples merged "
                    "into one), then the whole shard was fetched once in the background and the "
                    "rest read from local disk"
                )
            print(
                f"      cache: {len(cached)} of {args.shards} shards now in {cache_dir.name}/ "
                f"({_mb(sum(e.size for e in cached))}): {how}"
            )

        print(f"[5/5] wids show {os.path.basename(index)} --grid {args.grid} -n 16")
        cmd = [sys.executable, "-m", "wids", "show", index, "--grid", args.grid, "-n", "16"]
        cmd += _option_flags(options)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            print(out.stderr.strip(), file=sys.stderr)
            return 1
        print(f"      {out.stdout.strip()}")
        return 0
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
        stopped = f"{server.protocol} server (pid {server.proc.pid}) stopped, " if server else ""
        print(f"done in {time.perf_counter() - t_start:.1f} s; {stopped}{work} removed")


def _option_flags(options: dict[str, Any], prefix: str = "") -> list[str]:
    """Storage options as ``wids -s key=value`` flags (dotted keys for nested dicts)."""
    flags: list[str] = []
    for key, value in options.items():
        if isinstance(value, dict):
            flags += _option_flags(value, f"{prefix}{key}.")
        else:
            flags += ["-s", f"{prefix}{key}={value}"]
    return flags


def _summary(
    epoch: dict[str, Any],
    n: int,
    size: int,
    served: tuple[int, int] | None,
    before: tuple[int, int] | None,
    cache_dir: Path,
) -> None:
    stats = epoch["stats"]  # every worker's ds.stats added up (wids.WorkerStats)
    samples, requests, nbytes, hits = (
        stats.samples,
        stats.requests,
        stats.bytes_read,
        stats.cache_hits,
    )
    seconds = epoch["seconds"]
    got = len(epoch["labels"])
    print(
        f"      {got} samples ({epoch['len']} in the dataset) in {seconds:.2f} s: "
        f"{got / seconds:,.0f} samples/s, batches of {epoch['shape']} uint8"
    )
    print(
        f"      workers' ds.stats: {requests} requests ({requests / max(samples, 1):.3f} per "
        f"sample), {_mb(nbytes)} read from storage ({nbytes / size:.2f}x the shards), "
        f"{hits} of {samples} samples from the cache"
    )
    if served is not None and before is not None:
        reqs, body = served[0] - before[0], served[1] - before[1]
        print(
            f"      nginx access log: {reqs} requests ({reqs / max(got, 1):.3f} per sample), "
            f"{_mb(body)} sent ({body / size:.2f}x the shards)"
        )


if __name__ == "__main__":
    sys.exit(main())
