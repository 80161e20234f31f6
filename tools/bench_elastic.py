"""Cost of resuming an epoch on another world size, against a plain resume in the same run.

Usage: python tools/bench_elastic.py [--samples N] [--shards S] [--old R1] [--new R2]

A checkpoint halfway through epoch 1 on R1 ranks; the time for one rank to load the state and
yield the rest of its epoch: on R1 ranks (a plain resume), on R2 ranks (elastic), and a fresh
R2-rank epoch, for ``partition="block"`` and ``"global"``. Prints seconds and ratios per index.
"""

from __future__ import annotations

import argparse
import time

from wids import DistributedChunkedSampler


class _Lengths:
    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return sum(self.lengths)


def _timed(make, state=None) -> tuple[float, int]:
    start = time.perf_counter()
    sampler = make()
    if state is not None:
        sampler.load_state_dict(state)
    count = sum(1 for _ in sampler)
    return time.perf_counter() - start, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10**6)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--old", type=int, default=8)
    parser.add_argument("--new", type=int, default=6)
    args = parser.parse_args()
    ds = _Lengths([args.samples // args.shards] * args.shards)
    for partition in ("block", "global"):

        def make(replicas: int, rank: int, partition: str = partition) -> DistributedChunkedSampler:
            s = DistributedChunkedSampler(
                ds, num_replicas=replicas, rank=rank, seed=1, chunksize=500, partition=partition
            )
            s.set_epoch(1)
            return s

        old = make(args.old, 0)
        state = old.state_dict(position=len(old) // 2)
        rank = args.new // 2  # a middle rank: its slice starts inside an old rank's rest
        plain, n_plain = _timed(lambda: make(args.old, rank), state)  # noqa: B023
        elastic, n_elastic = _timed(lambda: make(args.new, rank), state)  # noqa: B023
        fresh, n_fresh = _timed(lambda: make(args.new, rank))  # noqa: B023 - called at once
        print(
            f"{partition:6s} plain resume {plain:.3f}s ({n_plain} indices), elastic "
            f"{args.old}->{args.new} {elastic:.3f}s ({n_elastic}), fresh epoch {fresh:.3f}s "
            f"({n_fresh}); per index: elastic/plain "
            f"{(elastic / n_elastic) / (plain / n_plain):.2f}x, elastic/fresh "
            f"{(elastic / n_elastic) / (fresh / n_fresh):.2f}x"
        )


if __name__ == "__main__":
    main()
