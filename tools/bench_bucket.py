#!/usr/bin/env python
"""Bucketing against plain chunked reading: locality of the reads, exact per-rank lengths, speed.

Issue 23's goal: batches of one bucket (aspect ratio, length) while keeping at least 0.9x the
locality of the chunked sampler without bucketing, and the same number of batches on every
rank. In one run:

1. *Orders* (no I/O): a layout of ``--shards`` shards of about ``--per-shard`` samples, each
   sample's aspect ratio drawn from common photo ratios. For each world size in ``--ranks``,
   every rank's order from :class:`wids.BucketBatchSampler` and from the chunked sampler
   without bucketing (``ChunkedSampler`` / ``DistributedChunkedSampler``, same chunk size):
   *locality* is the fraction of reads that stay in the shard of the read before (averaged
   over ranks), printed with the ratio bucketed / chunked. The row "by hand" is what a
   training script does without it: every bucket's samples shuffled globally and cut into
   batches. Lengths: ``len(sampler)`` on every rank against the batches it yields; samples
   seen once, left out (each bucket's last partial batch; ``drop_last`` tails) and repeated
   (padding batches).
2. *Reads* (torch): one epoch with each sampler through a DataLoader over real local shards,
   in-process (samples per CPU second, which other load does not move) and with 2 workers
   (fork, wall time), and over nginx when it is installed (``access="range"``, 2 workers):
   samples/s (best of ``--repeat``, the samplers alternating) and requests per sample.

Usage: python tools/bench_bucket.py [--shards 512] [--per-shard 1000] [--ranks 1 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from wids import (  # noqa: E402
    BucketBatchSampler,
    ChunkedSampler,
    DistributedChunkedSampler,
    ShardListDataset,
    build_index,
)

# common photo aspect ratios (w / h) and how often they occur
RATIOS = [0.5625, 0.667, 0.75, 0.8, 1.0, 1.25, 1.333, 1.5, 1.778]
WEIGHTS = [0.05, 0.08, 0.12, 0.05, 0.2, 0.05, 0.25, 0.12, 0.08]


class Layout:
    """Shard lengths, as the samplers read them from a dataset."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return sum(self.lengths)


def locality(cuts: np.ndarray, order: list[int]) -> float:
    """The fraction of reads in the shard of the read before."""
    shards = np.searchsorted(cuts, np.asarray(order), "right")
    return float(np.mean(shards[1:] == shards[:-1])) if len(order) > 1 else 1.0


def by_hand(keys: np.ndarray, batch: int, seed: int) -> list[int]:
    """Every bucket shuffled over the whole dataset, cut into batches, batches shuffled."""
    rng = np.random.default_rng(seed)
    batches = []
    for value in np.unique(keys):
        members = rng.permutation(np.flatnonzero(keys == value))
        batches += [members[i : i + batch] for i in range(0, len(members) - batch + 1, batch)]
    return [int(i) for k in rng.permutation(len(batches)) for i in batches[k]]


def orders(args: argparse.Namespace) -> bool:
    rng = np.random.default_rng(0)
    lengths = [
        int(x) for x in rng.integers(args.per_shard // 2, args.per_shard * 3 // 2, args.shards)
    ]
    layout = Layout(lengths)
    n = len(layout)
    cuts = np.cumsum(lengths)
    keys = rng.choice(RATIOS, size=n, p=WEIGHTS)
    print(
        f"orders: {args.shards} shards, {n} samples, {len(RATIOS)} aspect ratios, "
        f"batch {args.batch}, chunksize {args.chunksize}"
    )
    header = (
        f"{'ranks':>5} {'drop_last':>9} {'bucketed':>9} {'chunked':>8} {'ratio':>6} "
        f"{'by hand':>8} {'len/rank':>9} {'exact':>6} {'left out':>9} {'repeated':>9} "
        f"{'epoch s':>8}"
    )
    print(header)
    ok = True
    hand = locality(np.concatenate([[0], cuts])[1:], by_hand(keys, args.batch, 0))
    for replicas in args.ranks:
        for drop_last in (False, True):
            t0 = time.perf_counter()
            samplers = [
                BucketBatchSampler(
                    layout,
                    keys,
                    batch_size=args.batch,
                    num_buckets=len(RATIOS),
                    num_replicas=replicas,
                    rank=r,
                    chunksize=args.chunksize,
                    drop_last=drop_last,
                )
                for r in range(replicas)
            ]
            got = [list(s) for s in samplers]
            seconds = (time.perf_counter() - t0) / replicas
            if replicas == 1:
                plain = [list(ChunkedSampler(layout, chunksize=args.chunksize))]
            else:
                plain = [
                    list(
                        DistributedChunkedSampler(
                            layout,
                            num_replicas=replicas,
                            rank=r,
                            chunksize=args.chunksize,
                            drop_last=drop_last,
                        )
                    )
                    for r in range(replicas)
                ]
            bucketed = float(np.mean([locality(cuts, [i for b in g for i in b]) for g in got]))
            chunked = float(np.mean([locality(cuts, p) for p in plain]))
            exact = len({len(s) for s in samplers}) == 1 and all(
                len(s) == len(g) for s, g in zip(samplers, got, strict=True)
            )
            homogeneous = all(len(set(keys[b])) == 1 for g in got for b in g)
            seen = Counter(i for g in got for b in g for i in b)
            repeated = sum(c - 1 for c in seen.values())
            ok = ok and exact and homogeneous and bucketed >= 0.9 * chunked
            print(
                f"{replicas:>5} {drop_last!s:>9} {bucketed:>9.4f} {chunked:>8.4f} "
                f"{bucketed / chunked:>6.3f} {hand:>8.4f} {len(samplers[0]):>9} "
                f"{'yes' if exact and homogeneous else 'NO':>6} {n - len(seen):>9} {repeated:>9} "
                f"{seconds:>8.2f}"
            )
    return ok


def _collate(batch: list) -> int:
    return len(batch)


def _epoch(ds, workers: int, **kw) -> float:
    """Samples/s of one epoch: wall time with DataLoader workers, CPU time in-process."""
    import torch

    context = "fork" if workers else None
    loader = torch.utils.data.DataLoader(
        ds, num_workers=workers, multiprocessing_context=context, collate_fn=_collate, **kw
    )
    clock = time.perf_counter if workers else time.process_time
    t0 = clock()
    count = sum(loader)
    return count / (clock() - t0)


def reads(args: argparse.Namespace) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("reads: torch is not installed, skipped")
        return
    from wids.synth import write_dataset

    with tempfile.TemporaryDirectory() as tmp:
        paths = write_dataset(
            tmp,
            shards=args.read_shards,
            samples_per_shard=args.read_per_shard,
            real_images=False,
            jpg_bytes=4000,
        )
        index = os.path.join(tmp, "train.json")
        build_index(paths, index)
        rng = np.random.default_rng(1)
        n = args.read_shards * args.read_per_shard
        keys = rng.choice(RATIOS, size=n, p=WEIGHTS)
        # local: in-process by CPU time (which other load does not move), and with 2 workers
        places = [("local", index, {}, 0), ("local", index, {}, 2)]
        server = _nginx(tmp)
        if server is not None:
            places.append(("nginx", server.url("train.json"), {"access": "range"}, 2))
        print(
            f"reads: {n} samples in {args.read_shards} shards, batch {args.batch}, "
            f"best of {args.repeat}; workers 0: samples per CPU second, 2: per second (fork)"
        )
        print(
            f"{'where':>6} {'workers':>7} {'sampler':>9} {'samples/s':>10} {'ratio':>6} "
            f"{'req/sample':>11}"
        )
        try:
            for where, url, kw, workers in places:
                ds = ShardListDataset(url, transformations=[], **kw)
                best = {"chunked": 0.0, "bucketed": 0.0}
                requests = {"chunked": 0, "bucketed": 0}
                for k in range(args.repeat):  # alternating, so a busy spell hits both
                    names = ["chunked", "bucketed"] if k % 2 == 0 else ["bucketed", "chunked"]
                    for name in names:
                        if server is not None:
                            server.reset()
                        if name == "chunked":
                            sampler = ChunkedSampler(ds, chunksize=args.chunksize)
                            rate = _epoch(ds, workers, sampler=sampler, batch_size=args.batch)
                        else:
                            bucket = BucketBatchSampler(
                                ds,
                                keys,
                                batch_size=args.batch,
                                num_buckets=len(RATIOS),
                                chunksize=args.chunksize,
                            )
                            rate = _epoch(ds, workers, batch_sampler=bucket)
                        best[name] = max(best[name], rate)
                        if server is not None and where == "nginx":
                            requests[name] = server.counts()[0]
                for name in ("chunked", "bucketed"):
                    per = f"{requests[name] / n:>11.3f}" if where == "nginx" else f"{'':>11}"
                    ratio = best[name] / best["chunked"]
                    print(
                        f"{where:>6} {workers:>7} {name:>9} {best[name]:>10.0f} {ratio:>6.2f} {per}"
                    )
                ds.close()
        finally:
            if server is not None:
                server.stop()


def _nginx(root: str):
    sys.path.insert(0, str(HERE))
    try:
        from localservers import Nginx

        return Nginx(root, workers=1)
    except (RuntimeError, OSError) as e:
        print(f"reads over nginx skipped: {e}")
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--shards", type=int, default=512)
    p.add_argument("--per-shard", type=int, default=1000)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 8])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--chunksize", type=int, default=2000)
    p.add_argument("--read-shards", type=int, default=32)
    p.add_argument("--read-per-shard", type=int, default=250)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--no-reads", action="store_true", help="orders only (no torch needed)")
    args = p.parse_args(argv)
    ok = orders(args)
    if not args.no_reads:
        reads(args)
    print(
        "goal (locality >= 0.9x chunked, exact lengths, one bucket per batch):",
        "met" if ok else "NOT met",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
