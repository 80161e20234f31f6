#!/usr/bin/env python
"""What recording md5s costs, and what reading a copied dataset (``cp -r``) costs once.

Generates local shards (or reuses ``--data``), then prints, each measured in this one run:

- ``wids index create`` (``build_index(..., md5=...)``, rescanning every shard) with md5s and
  with ``--no-md5``, and their ratio: the scan reads only tar headers, the md5 every byte;
- ``TarWriter`` writing the same amount of already-encoded bytes with and without the md5 it
  computes as it writes (what ``ShardWriter`` records);
- reading one sample in every ``--stride`` from a fresh process: the original dataset, a copy
  made without its timestamps (``shutil.copytree`` with ``copyfile``: what ``cp -r`` does) the
  first time (each shard's bytes are read once to compare their md5), and the copy again (the
  verdicts are remembered in the index's members directory), as ratios of the original's.

Timings are single runs on a warm page cache; on a shared machine compare the ratios.

Example:
    python tools/bench_copies.py                            # 16 shards x 1000 x 60 KB, ~1 GB
    python tools/bench_copies.py --shards 4 --data /tmp/wids-copies
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wids import build_index
from wids.synth import write_dataset

_READ = """
import sys, time, wids
t = time.perf_counter()
ds = wids.ShardListDataset(sys.argv[1], transformations=[])
for i in range(0, len(ds), int(sys.argv[2])):
    ds[i]
print(time.perf_counter() - t)
"""


def _read(index: Path, stride: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _READ, str(index), str(stride)],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.split()[-1])


def _write(directory: Path, shards: int, samples: int, nbytes: int, md5: bool) -> float:
    import os

    from wids import TarWriter

    data = os.urandom(nbytes)
    t = time.perf_counter()
    for k in range(shards):
        with TarWriter(str(directory / f"w-{k}.tar"), encoder=False, md5=md5) as w:
            for i in range(samples):
                w.write({"__key__": f"{i:06d}", "jpg": data, "cls": b"1"})
    return time.perf_counter() - t


def _build(shards: list[str], out: Path, md5: bool) -> float:
    t = time.perf_counter()
    build_index(shards, str(out), md5=md5, incremental=False)
    return time.perf_counter() - t


def main() -> None:
    """Run the benchmark and print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--samples", type=int, default=1000, help="samples per shard")
    p.add_argument("--bytes", type=int, default=60000, help="bytes of each sample's .jpg")
    p.add_argument("--stride", type=int, default=97, help="read every STRIDE-th sample")
    p.add_argument("--data", help="a directory for the dataset (default: a temporary one)")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="wids-copies-") if args.data is None else None
    root = Path(args.data or tmp or ".")
    try:
        src = root / "src"
        shards = sorted(str(s) for s in src.glob("*.tar")) if src.is_dir() else []
        if len(shards) != args.shards:
            shutil.rmtree(src, ignore_errors=True)
            shards = write_dataset(
                str(src),
                shards=args.shards,
                samples_per_shard=args.samples,
                real_images=False,
                jpg_bytes=args.bytes,
            )
        total = sum(Path(s).stat().st_size for s in shards)
        for s in shards:  # a warm page cache for both builds
            Path(s).read_bytes()
        with_md5 = _build(shards, src / "train.json", md5=True)
        without = _build(shards, src / "bare.json", md5=False)
        written = root / "written"
        written.mkdir(exist_ok=True)
        wrote = [
            _write(written, args.shards, args.samples, args.bytes, md5) for md5 in (True, False)
        ]
        shutil.rmtree(written)
        copy = root / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(src, copy, copy_function=shutil.copyfile)  # new timestamps
        original = _read(src / "train.json", args.stride)
        first = _read(copy / "train.json", args.stride)
        again = _read(copy / "train.json", args.stride)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.shards} shards, {total / 1e6:.0f} MB")
    print(f"index create, md5      {with_md5:7.2f} s  {with_md5 / without:5.2f}x --no-md5")
    print(f"index create, --no-md5 {without:7.2f} s")
    print(f"TarWriter, md5         {wrote[0]:7.2f} s  {wrote[0] / wrote[1]:5.2f}x md5=False")
    print(f"TarWriter, md5=False   {wrote[1]:7.2f} s")
    print(f"read the original      {original:7.2f} s")
    print(f"read a copy, first     {first:7.2f} s  {first / original:5.2f}x the original")
    print(f"read a copy, again     {again:7.2f} s  {again / original:5.2f}x the original")


if __name__ == "__main__":
    main()
