"""Synthetic SQLite index benchmark: build time and open-to-first-lookup time.

Usage: python tools/bench_sqlite.py [--shards 1000] [--per-shard 1000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from wids import ShardInfo, ShardMembers, SqliteIndex, SqliteIndexWriter

FIELDS = (".cls", ".jpg", ".json")


def synthetic_members(shard: int, per_shard: int) -> ShardMembers:
    """A shard table of ``per_shard`` samples with 3 members each, laid out like a real tar."""
    n, m = per_shard, per_shard * len(FIELDS)
    rng = np.random.default_rng(shard)
    sizes = np.empty(m, dtype=np.int64)
    sizes[0::3] = 1
    sizes[1::3] = rng.integers(5_000, 40_000, n)
    sizes[2::3] = rng.integers(60, 120, n)
    blocks = 1 + (sizes + 511) // 512  # header + data, padded
    offsets = np.cumsum(np.concatenate([[0], blocks[:-1]])) * 512 + 512
    keys = [f"{shard:06d}{i:06d}".encode() for i in range(n)]
    return ShardMembers(
        fields=FIELDS,
        key_blob=b"".join(keys),
        key_offsets=np.arange(n + 1, dtype=np.int64) * 12,
        sample_start=np.arange(n + 1, dtype=np.int64) * 3,
        member_field=np.tile(np.arange(3, dtype=np.uint16), n),
        member_offset=offsets,
        member_size=sizes,
    )


def bench_sqlite(n_shards: int = 1000, per_shard: int = 1000, directory: str | None = None) -> dict:
    """Build a synthetic SQLite index and time it.

    Returns:
        ``{"samples", "members", "build_s", "open_to_first_lookup_s", "file_bytes"}``; the
        build time includes generating nothing (tables are made before the clock starts).
    """
    tables = [synthetic_members(s, per_shard) for s in range(n_shards)]
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = os.path.join(tmp, "bench.sqlite")
        t0 = time.perf_counter()
        with SqliteIndexWriter(path, name="bench") as w:
            for s, table in enumerate(tables):
                w.add(ShardInfo(f"bench-{s:06d}.tar", per_shard, size=10**8), table)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        ix = SqliteIndex(path)
        shards = ix.shards
        table = ix.members(len(shards) // 2)
        assert table is not None
        table.span(per_shard // 2)
        first = time.perf_counter() - t0
        ix.close()
        size = os.path.getsize(path)
    return {
        "samples": n_shards * per_shard,
        "members": n_shards * per_shard * len(FIELDS),
        "build_s": build,
        "open_to_first_lookup_s": first,
        "file_bytes": size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--per-shard", type=int, default=1000)
    args = ap.parse_args()
    r = bench_sqlite(args.shards, args.per_shard)
    print(
        f"sqlite index: {r['samples']:,} samples / {r['members']:,} members: "
        f"build {r['build_s']:.2f} s (goal < 30 s), "
        f"open-to-first-lookup {r['open_to_first_lookup_s'] * 1000:.1f} ms (goal < 200 ms), "
        f"{r['file_bytes'] / 1e6:.0f} MB"
    )


if __name__ == "__main__":
    main()
