"""Smoke runs of the shard-mode figures of tools/bench_cache.py and tools/bench.py (tiny).

Only the instruments are checked, never speed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

pytestmark = pytest.mark.servers


def test_bench_cache_runs_the_modes_asked_for_with_their_cpu_time(capsys):
    import bench_cache

    argv = ["--shards", "2", "--samples", "20", "--jpg-bytes", "1000", "--repeat", "1"]
    assert bench_cache.main([*argv, "--pace", "0", "--modes", "shard"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split()[0] for line in lines if line.startswith("  ") and "epoch" in line]
    assert rows == ["shard"]
    assert "samples/s, CPU" in next(line for line in lines if line.startswith("  shard"))


def test_bench_shows_the_best_of_several_shard_epochs(http_server, tmp_path):
    """The shard row is the best of ``SHARD_EPOCHS`` epochs and says their spread (one
    epoch varied by +-30 % from run to run: a before/after table compared noise)."""
    import bench
    import bench_read

    from wids import build_index

    data, index = bench_read._prepare(
        argparse.Namespace(data=str(tmp_path / "data"), shards=2, samples=20)
    )
    paths = sorted(Path(data).glob("bench-*.tar"))
    urls = [http_server.put(str(p), p.name) for p in paths]
    http_index = str(tmp_path / "http.json")
    build_index(urls, http_index, name="bench")
    table = bench.Table()
    args = argparse.Namespace(samples=20)
    bench.cache_section(
        table, http_server, http_index, paths, bench_read._spans(index), tmp_path, args
    )
    row = table.get('epoch, access="shard", HTTP')
    assert row is not None and row.value > 0
    assert row.note.startswith(f"best of {bench.SHARD_EPOCHS} epochs (")
    assert bench.SHARD_EPOCHS >= 3
    assert not table.get('epoch, access="range", HTTP').note.startswith("best of")
