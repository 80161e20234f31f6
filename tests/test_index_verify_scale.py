"""``wids index verify`` over a large index: one record at a time, a bounded executor window."""

from __future__ import annotations

import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bigindex import write_big_index

from wids.index import verify_index

N = 10_000


def test_verify_a_big_table_on_an_executor_in_bounded_memory(tmp_path: Path) -> None:
    path = write_big_index(tmp_path / "big.widx", N, same=True)
    with ThreadPoolExecutor(2) as pool:
        tracemalloc.start()
        try:
            total, problems = verify_index(str(path), executor=pool)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (total, problems) == (N, [])
    assert peak < 4_000_000, peak  # 21 MB before (every record, a future per shard)


def test_verify_reports_every_changed_shard_of_a_window(tmp_path: Path) -> None:
    path = write_big_index(tmp_path / "big.widx", 600, ends=3, same=True)
    with open(tmp_path / "s-0000000.tar", "ab") as f:
        f.write(b"\0" * 512)
    with ThreadPoolExecutor(2) as pool:
        total, problems = verify_index(str(path), executor=pool)
    assert total == 600 and len(problems) == 600
    assert [p.kind for p in problems] == ["CHANGED"] * 600
    assert all(p.url.endswith("s-0000000.tar") for p in problems)
