#!/usr/bin/env python
"""Random access into a local ``.tar.gz``: wids against ratarmount, one run, same file.

One shard of ``--samples`` samples (a ``.txt`` of compressible text, a ``.jpg`` of random
bytes, ``--kb`` KB per sample in all), gzipped by Python's ``tarfile``. Figures:

- **index build**: ``wids index create`` (``build_index``, one process, md5 off) against
  ratarmountcore's ``SQLiteIndexedTar`` (its SQLite index written, one thread), both with
  seek points every ``--spacing`` bytes (ratarmount's default is 16 MiB), wall time each;
  and the size of wids' seek points (their bytes as the index stores them, per GB of tar,
  and the whole sidecar).
- **random member reads**: the same ``--reads`` random samples in the same order, every member
  read: ``ds[i]`` (``access="range"``: one ``pread`` of the compressed bytes from the seek point
  before the sample, decoded) against ratarmount's ``open(fileinfo).read()`` of each member;
  members per second each and their ratio (the goal: wids >= ratarmount), and the compressed
  bytes wids read per random sample.

ratarmount is a peer, not a dependency: it runs in its own virtualenv, given as
``--ratar-python`` (made with ``python -m venv /tmp/venv-ratar && /tmp/venv-ratar/bin/pip
install ratarmountcore indexed_gzip``), in a subprocess. Without it, only wids' figures.

Usage::

    python tools/bench_compressed.py                     # --samples 4000 --kb 64 --reads 2000
    python tools/bench_compressed.py --spacing 262144    # denser seek points
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wids import ShardListDataset, build_index  # noqa: E402
from wids.index import open_index  # noqa: E402

RATAR_SCRIPT = r"""
import json, sys, time
from ratarmountcore.mountsource.archives import SQLiteIndexedTar
path, index, spacing = sys.argv[1], sys.argv[2], int(sys.argv[4])
order = json.loads(open(sys.argv[3]).read())
t = time.perf_counter()
tar = SQLiteIndexedTar(
    path, writeIndex=True, indexFilePath=index, parallelization=1, gzipSeekPointSpacing=spacing
)
build = time.perf_counter() - t
names = []
for key in order:
    for field in (".txt", ".jpg"):
        names.append("/" + key + field)
infos = [tar.lookup(n) for n in names]
t = time.perf_counter()
nbytes = 0
for info in infos:
    with tar.open(info) as f:
        nbytes += len(f.read())
read = time.perf_counter() - t
tar.close()
print(json.dumps({"build": build, "read": read, "members": len(infos), "bytes": nbytes}))
"""


def write_shard(path: Path, samples: int, kb: int, seed: int) -> None:
    rng = random.Random(seed)
    words = [f"w{rng.randrange(2000)}" for _ in range(1000)]
    half = kb * 512
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tf:
        for i in range(samples):
            key = f"{i:08d}"
            text = " ".join(rng.choice(words) for _ in range(half // 4)).encode()[:half]
            for field, data in ((".txt", text), (".jpg", rng.randbytes(half))):
                info = tarfile.TarInfo(key + field)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--kb", type=int, default=64, help="KB per sample (half text, half random)")
    p.add_argument("--reads", type=int, default=2000, help="random samples read")
    p.add_argument("--spacing", type=int, default=1 << 20, help="wids' seek point spacing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ratar-python", default="/tmp/venv-ratar/bin/python")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-compressed-") as tmp:
        root = Path(tmp)
        shard = root / "shard-000000.tar.gz"
        write_shard(shard, args.samples, args.kb, args.seed)
        t = time.perf_counter()
        build_index([str(shard)], str(root / "train.json"), md5=False, seek_spacing=args.spacing)
        wids_build = time.perf_counter() - t
        seek = open_index(str(root / "train.json")).members(0).seek  # type: ignore[union-attr]
        assert seek is not None
        tar_bytes, gz_bytes = seek.uncompressed_size, seek.compressed_size
        seek_bytes = len(seek.to_bytes())
        sidecar = sum(f.stat().st_size for f in (root / "train.members").iterdir())
        ds = ShardListDataset(str(root / "train.json"), transformations=[], access="range")
        order = random.Random(args.seed + 1).sample(range(len(ds)), min(args.reads, len(ds)))
        ds[0]  # open and check the shard first, as ratarmount's index is loaded first
        before, requests = ds.stats.bytes_read, ds.stats.requests
        t = time.perf_counter()
        nbytes = 0
        for i in order:  # ds[i] reads every member of the sample
            s = ds[i]
            nbytes += len(s[".txt"]) + len(s[".jpg"])
        wids_read = time.perf_counter() - t
        read_per_sample = (ds.stats.bytes_read - before) / len(order)
        requests_per_sample = (ds.stats.requests - requests) / len(order)
        table = open_index(str(root / "train.json")).members(0)
        assert table is not None
        keys = [table.key(i) for i in order]
        print(f"tar {tar_bytes / 1e6:.1f} MB, gzip {gz_bytes / 1e6:.1f} MB, {len(ds)} samples")
        print(f"{'':<26} {'wids':>12} {'ratarmount':>12} {'wids/ratar':>11}")
        ratar = None
        if os.path.exists(args.ratar_python):
            (root / "keys.json").write_text(json.dumps(keys))
            out = subprocess.run(
                [args.ratar_python, "-c", RATAR_SCRIPT, str(shard), str(root / "r.sqlite"),
                 str(root / "keys.json"), str(args.spacing)],
                capture_output=True, text=True,
            )  # fmt: skip
            if out.returncode:
                raise SystemExit(f"ratarmount failed:\n{out.stderr[-3000:]}")
            ratar = json.loads(out.stdout.strip().splitlines()[-1])
            if ratar["bytes"] != nbytes:
                raise SystemExit(f"ratarmount read {ratar['bytes']} bytes, wids {nbytes}")
        members = 2 * len(order)
        wids_rate = members / wids_read
        if ratar is not None:
            ratar_rate = ratar["members"] / ratar["read"]
            print(
                f"{'index build (s)':<26} {wids_build:>12.2f} {ratar['build']:>12.2f} "
                f"{wids_build / ratar['build']:>11.2f}"
            )
            print(
                f"{'random members/s':<26} {wids_rate:>12.0f} {ratar_rate:>12.0f} "
                f"{wids_rate / ratar_rate:>11.2f}"
            )
        else:
            print(f"{'index build (s)':<26} {wids_build:>12.2f} {'-':>12}")
            print(f"{'random members/s':<26} {wids_rate:>12.0f} {'-':>12}")
        per_gb = seek_bytes / tar_bytes * 1e9
        print(
            f"seek points: {len(seek)} ({seek_bytes / 1e6:.2f} MB, {per_gb / 1e6:.1f} MB per GB "
            f"of tar); sidecar {sidecar / 1e6:.2f} MB"
        )
        print(
            f"compressed bytes read per random sample: {read_per_sample / 1e3:.0f} KB "
            f"(sample {args.kb} KB of tar, spacing {args.spacing >> 10} KiB), "
            f"{requests_per_sample:.2f} reads per sample"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
