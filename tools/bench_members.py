#!/usr/bin/env python
"""Large members as files (``ds.open(i, field)``): bytes moved remotely, throughput locally.

One shard holds a sample with a small ``.json`` and one large ``.bin`` member (200 MB by
default). Two figures, each a ratio measured in the same run:

- **remote**: nginx behind ``tools/latencyproxy.py`` (25 ms to the first byte, 50 MB/s per
  connection); a handle reads 3 random 1 MB windows of the member, once with one ``read`` per
  window, once in a decoder's 64 KiB reads and once in 48 KiB reads. The bytes the proxy
  sent (response bodies) over the bytes consumed; the goal is at most 2x. ``ds[i]``
  without ``stream_over`` would move the whole member.
- **local**: a sequential pass over the member through the handle (``read(1 MiB)`` and
  ``readinto`` of a 1 MiB buffer) against ``os.pread`` of the same 1 MiB blocks on the shard,
  page cache warm, best of 3 passes each; the goal is at least 0.8x.

Usage::

    python tools/bench_members.py            # --mb 200 --windows 3 --seed 0
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latencyproxy import ProxyProcess  # noqa: E402
from localservers import Nginx  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wids import ShardListDataset, build_index  # noqa: E402

MB = 1 << 20


class _Repeat(io.RawIOBase):
    """``size`` bytes of a repeated random block, without holding them (for tarfile)."""

    def __init__(self, size: int, seed: int) -> None:
        self.left = size
        self.block = random.Random(seed).randbytes(MB + 7)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        n = min(len(b), self.left, len(self.block))
        b[:n] = self.block[:n]
        self.left -= n
        return n


def write_shard(path: Path, size: int) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in (("clip.json", b'{"fps": 30}'),):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("clip.bin")
        info.size = size
        tf.addfile(info, io.BufferedReader(_Repeat(size, 1), MB))


def remote(root: Path, windows: int, seed: int) -> list[tuple[str, int, int, int]]:
    rows = []
    nginx = Nginx(root, workers=1)
    try:
        with ProxyProcess(nginx.url(""), delay=0.025, mbps=50.0) as proxy:
            ds = ShardListDataset(proxy.url("train.json"), transformations=[])
            patterns = (("one read per window", MB), ("64 KiB reads", 64 << 10))
            for pattern, chunk in (*patterns, ("48 KiB reads", 48 << 10)):
                f = ds.open(0, ".bin")
                rng = random.Random(seed)
                proxy.settled()
                proxy.reset_counts()
                consumed = 0
                for _ in range(windows):
                    f.seek(rng.randrange(f.size - MB))
                    left = MB
                    while left:
                        got = len(f.read(min(chunk, left)))
                        consumed += got
                        left -= got
                counts = proxy.settled()
                rows.append((pattern, consumed, counts["bytes_out"], counts["requests"]))
                f.close()
            ds.close()
    finally:
        nginx.stop()
    return rows


def local(path: Path, rounds: int = 3) -> dict[str, float]:
    ds = ShardListDataset(str(path.parent / "train.json"), transformations=[])
    f = ds.open(0, ".bin")
    offset, size = f.offset, f.size
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(MB)

    def by_pread() -> None:
        for pos in range(0, size, MB):
            os.pread(fd, min(MB, size - pos), offset + pos)

    def by_read() -> None:
        f.seek(0)
        while f.read(MB):
            pass

    def by_readinto() -> None:
        f.seek(0)
        while f.readinto(buf):
            pass

    best = {}
    by_pread()  # warm the page cache
    for name, fn in (("pread", by_pread), ("read", by_read), ("readinto", by_readinto)):
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        best[name] = size / min(times) / 1e6
    os.close(fd)
    f.close()
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=200, help="size of the large member in MB")
    p.add_argument("--windows", type=int, default=3, help="random 1 MB windows read remotely")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-members-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        shard = root / "video-000000.tar"
        write_shard(shard, args.mb * MB)
        build_index([str(shard)], str(root / "train.json"), md5=False)
        print(f"member: {args.mb} MB; {args.windows} random 1 MB windows through the proxy")
        head = f"{'remote pattern':<22} {'consumed':>10} {'moved':>10} {'requests':>9}"
        print(f"{head} {'moved/consumed':>15}")
        for pattern, consumed, moved, requests in remote(root, args.windows, args.seed):
            row = f"{pattern:<22} {consumed:>10,} {moved:>10,} {requests:>9}"
            print(f"{row} {moved / consumed:>15.2f}")
        rates = local(shard)
        print(f"{'local sequential':<22} {'MB/s':>10} {'x pread':>10}")
        for name, rate in rates.items():
            print(f"{name:<22} {rate:>10.0f} {rate / rates['pread']:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
