#!/usr/bin/env python
"""Seekable ``.tar.zst`` over a distant store: bytes moved per random sample.

Shards written by ``ShardWriter(compress="zstd")`` (one zstd frame per ``--per-frame``
samples) are served by nginx behind ``tools/latencyproxy.py`` (25 ms to the first byte,
50 MB/s per connection). ``ds[i]`` of ``--reads`` random samples, one at a time; the proxy
counts the bytes it sent (response bodies) and the requests. Two floors, per sample read:

- **frame**: the compressed bytes of the frames holding the sample (what one range request
  of them moves; with one sample per frame, the sample's compressed size with its headers);
- **goal floor**: the sample's compressed size plus its tar header: its members' data
  compressed alone (zstd, the same level; no tar headers or padding inside) plus 512 bytes
  (the issue's goal is moved <= 1.2x this).

Also printed: the shard's compression ratio, the seek table's size, ``build_index`` time
against the same samples as plain ``.tar`` shards, and locally (page cache
warm, one process, best of 3 passes) random ``ds[i]`` per second on the ``.tar.zst`` shards
against a floor measured in the same run: ``os.pread`` of each sample's frames and one zstd
decode of them with a reused context (and the same samples as plain ``.tar`` shards, which
need no decoding). Samples are text-like
(compressible) payloads of 2-60 KB with a small label.

Usage::

    python tools/bench_zstd.py           # --samples 2000 --reads 300 --per-frame 1 --seed 0
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latencyproxy import ProxyProcess  # noqa: E402
from localservers import Nginx  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wids import ShardListDataset, ShardWriter  # noqa: E402
from wids.index import open_index  # noqa: E402

WORDS = [w.encode() for w in "the a of shard sample zstd frame seek table tar read".split()]


def payload(rng: random.Random) -> bytes:
    n = rng.randrange(2_000, 60_000)
    text = b" ".join(rng.choice(WORDS) for _ in range(n // 5))[:n]
    return text + rng.randbytes(n // 10)  # a tenth incompressible


def write_plain(root: Path, samples: int, seed: int) -> None:
    rng = random.Random(seed)
    with ShardWriter(str(root / "plain-%06d.tar"), maxcount=max(1, samples // 4), md5=False) as w:
        for i in range(samples):
            w.write({"__key__": f"{i:08d}", "txt": payload(rng), "cls": str(i % 10).encode()})


def index_times(root: Path, rounds: int = 3) -> dict[str, float]:
    """Seconds of ``build_index`` (one job, no md5, not incremental) over each kind of shard,
    alternated, best of ``rounds``."""
    import time

    from wids import build_index

    kinds = {"zst": sorted(root.glob("train-*.tar.zst")), "tar": sorted(root.glob("plain-*.tar"))}
    best = dict.fromkeys(kinds, float("inf"))
    for r in range(rounds):
        for kind, paths in kinds.items():
            out = root / f"built-{kind}-{r}.json"
            t = time.perf_counter()
            build_index([str(p) for p in paths], str(out), md5=False, jobs=1, incremental=False)
            best[kind] = min(best[kind], time.perf_counter() - t)
    return best


def frame_spans(root: Path, picks: list[int]) -> list[tuple[int, int, int]]:
    """Per pick: (shard, start, stop) of the compressed frame holding the sample."""
    reader = open_index(str(root / "train.json"))
    spans = []
    for i in picks:
        shard, left = 0, i
        while left >= len(reader.members(shard)):
            left -= len(reader.members(shard))
            shard += 1
        members = reader.members(shard)
        pts = members.seek
        start, stop = members.span(left)
        k, j = pts.cover(start - 512, stop)
        c1 = int(pts.compressed[j]) if j < len(pts) else pts.compressed_size
        spans.append((shard, int(pts.compressed[k]), c1))
    reader.close()
    return spans


def local_rates(root: Path, reads: int, seed: int, rounds: int = 5) -> dict[str, float]:
    """Random ``ds[i]`` per second on each index, and the floor: ``pread`` + decode of each
    sample's frame. Passes alternate (this machine's load varies); best of ``rounds`` each."""
    import time

    import zstandard

    zst = ShardListDataset(str(root / "train.json"), transformations=[])
    plain = ShardListDataset(str(root / "plain.json"), transformations=[])
    rng = random.Random(seed)
    picks = [rng.randrange(len(zst)) for _ in range(reads)]
    spans = frame_spans(root, picks)
    fds = [os.open(p, os.O_RDONLY) for p in sorted(root.glob("train-*.tar.zst"))]
    dctx = zstandard.ZstdDecompressor()

    def floor() -> None:
        for shard, c0, c1 in spans:
            dctx.decompressobj().decompress(os.pread(fds[shard], c1 - c0, c0))  # one frame

    passes = {
        "train.json": lambda: [zst[i] for i in picks],
        "plain.json": lambda: [plain[i] for i in picks],
        "floor": floor,
    }
    best = dict.fromkeys(passes, float("inf"))
    for fn in passes.values():  # warm: page cache, open shards
        fn()
    for _ in range(rounds):
        for name, fn in passes.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    for fd in fds:
        os.close(fd)
    zst.close()
    plain.close()
    return {name: reads / t for name, t in best.items()}


def write(root: Path, samples: int, per_frame: int, seed: int) -> list[int]:
    """Write the shards; returns each sample's members compressed alone (the goal's floor)."""
    import zstandard

    cctx = zstandard.ZstdCompressor(level=3)
    floors = []
    rng = random.Random(seed)
    with ShardWriter(
        str(root / "train-%06d.tar.zst"),
        maxcount=max(1, samples // 4),
        compress="zstd",
        samples_per_frame=per_frame,
        md5=False,
    ) as sink:
        for i in range(samples):
            sample = {"__key__": f"{i:08d}", "txt": payload(rng), "cls": str(i % 10).encode()}
            floors.append(len(cctx.compress(sample["txt"] + sample["cls"])) + 512)
            sink.write(sample)
    return floors


def frame_bytes(index: str) -> list[int]:
    """Per global sample: the compressed bytes of the frames covering it."""
    reader = open_index(index)
    out: list[int] = []
    for s in range(len(reader.shards)):
        members = reader.members(s)
        points = members.seek
        bounds = list(points.compressed) + [points.compressed_size]
        ustarts = list(points.uncompressed)
        import bisect

        for i in range(len(members)):
            start, stop = members.span(i)
            start -= 512  # the first member's header, which the read checks
            k = bisect.bisect_right(ustarts, start) - 1
            j = bisect.bisect_left(ustarts, stop)
            out.append(int(bounds[j] - bounds[k]))
    reader.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--reads", type=int, default=300)
    p.add_argument("--per-frame", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-zstd-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        floors = write(root, args.samples, args.per_frame, args.seed)
        shards = sorted(root.glob("*.tar.zst"))
        zbytes = sum(p.stat().st_size for p in shards)
        frames = frame_bytes(str(root / "train.json"))
        reader = open_index(str(root / "train.json"))
        tbytes = sum(reader.members(s).seek.uncompressed_size for s in range(len(shards)))
        npoints = sum(len(reader.members(s).seek) for s in range(len(shards)))
        reader.close()
        print(
            f"{len(shards)} shards, {args.samples} samples, {args.per_frame} per frame: "
            f"tar {tbytes:,} B -> zst {zbytes:,} B ({tbytes / zbytes:.2f}x), "
            f"{npoints} frames, seek table {8 + 12 * npoints + 9 * len(shards):,} B"
        )
        write_plain(root, args.samples, args.seed)
        builds = index_times(root)
        rates = local_rates(root, args.reads, args.seed + 2)
        nginx = Nginx(root, workers=1)
        try:
            with ProxyProcess(nginx.url(""), delay=0.025, mbps=50.0) as proxy:
                ds = ShardListDataset(proxy.url("train.json"), transformations=[])
                rng = random.Random(args.seed + 1)
                picks = [rng.randrange(len(ds)) for _ in range(args.reads)]
                ds[picks[0]]  # first touch of that shard outside the count
                proxy.settled()
                proxy.reset_counts()
                for i in picks:
                    ds[i]
                counts = proxy.settled()
                ds.close()
        finally:
            nginx.stop()
    floor = sum(frames[i] for i in picks)
    goal = sum(floors[i] for i in picks)
    moved, requests = counts["bytes_out"], counts["requests"]
    print(f"{'reads':>6} {'requests':>9} {'moved':>12} {'frames':>12} {'moved/frames':>13}")
    print(f"{len(picks):>6} {requests:>9} {moved:>12,} {floor:>12,} {moved / floor:>13.3f}")
    print(f"moved / (compressed sample + its tar header) = {moved / goal:.3f} (goal <= 1.2)")
    print(
        f"index create (build_index, 1 job): .tar.zst {builds['zst']:.3f} s, the same "
        f"samples as .tar {builds['tar']:.3f} s ({builds['zst'] / builds['tar']:.1f}x)"
    )
    zst, plain = rates["train.json"], rates["plain.json"]
    floor_rate = rates["floor"]
    print(
        f"local random ds[i]/s: .tar.zst {zst:,.0f} = {zst / floor_rate:.2f}x pread + zstd decode "
        f"of its frames alone ({floor_rate:,.0f}/s); the same samples as .tar {plain:,.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
