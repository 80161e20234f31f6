"""A smoke run of tools/bench_bucket.py (tiny), so it cannot rot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))


@pytest.mark.servers
def test_bench_bucket_prints_locality_lengths_and_reads(capsys):
    pytest.importorskip("torch")
    import bench_bucket

    argv = ["--shards", "24", "--per-shard", "300", "--ranks", "1", "3", "--batch", "8"]
    argv += ["--read-shards", "3", "--read-per-shard", "40", "--repeat", "1"]
    assert bench_bucket.main(argv) == 0
    out = capsys.readouterr().out
    assert "goal (locality >= 0.9x chunked, exact lengths, one bucket per batch): met" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["3"])]
    assert len(rows) == 4 and all(row[7] == "yes" for row in rows)
    assert sum(" local       0  bucketed" in line for line in out.splitlines()) == 1
