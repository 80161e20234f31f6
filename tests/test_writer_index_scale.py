"""A ShardWriter's index of many shards: a shard-table checkpoint streams the old records."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from bigindex import write_tar

from wids.index import open_index, scan_shard
from wids.storage import Source
from wids.writer_index import IndexKeeper

N = 2_000


def test_a_table_checkpoint_reads_the_old_shards_one_at_a_time(tmp_path: Path) -> None:
    write_tar(tmp_path / "proto.tar")
    stat, members, _ = scan_shard(Source(str(tmp_path / "proto.tar")))
    path = tmp_path / "out" / "train.widx"
    keeper = IndexKeeper(str(path))
    for k in range(N):
        keeper.add(str(tmp_path / "out" / f"s-{k}.tar"), stat, members, checkpoint=False)
    keeper.checkpoint()  # the first checkpoint: N pending shards written
    keeper.add(str(tmp_path / "out" / f"s-{N}.tar"), stat, members, checkpoint=False)
    tracemalloc.start()
    try:
        keeper.checkpoint()  # the old N shards read back and written again, with one more
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    keeper.close()
    idx = open_index(str(path))
    assert idx.nshards == N + 1  # type: ignore[attr-defined]
    assert idx.shard(N).url == str(tmp_path / "out" / f"s-{N}.tar")  # type: ignore[attr-defined]
    assert len(idx.members(N - 1)) == len(members)  # type: ignore[arg-type]
    idx.close()
    # A record per old shard held at once (the old path): ~0.75 MB here.
    assert peak < 440_000, peak
