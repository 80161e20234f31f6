"""``wids index info`` over a large index: totals from columns, a few member tables read."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from bigindex import SAMPLES, shard_name, write_big_index

from wids import convert_index, open_index
from wids.index import count_shards
from wids.index.summary import FIELDS_FROM_ALL_UP_TO, SAMPLED_SHARDS, index_summary

N = 100_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_big_index(tmp_path_factory.mktemp("big") / "big.widx", N)


def _summary_peak(path: Path, **kwargs: object) -> tuple[dict, int]:
    idx = open_index(str(path))
    count_shards(idx)  # opened (a table's columns are mapped, not allocated) before measuring
    tracemalloc.start()
    try:
        got = index_summary(idx, **kwargs)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        idx.close()
    return got, peak


def test_totals_of_a_big_table_without_a_record_per_shard(big: Path) -> None:
    got, peak = _summary_peak(big, detail=[7, -2])
    assert got["shards"] == N and got["samples"] == N * SAMPLES
    assert got["bytes"] == N * got["shard_detail"][0]["size"] > 0
    assert got["fields_from"] == 2 * SAMPLED_SHARDS
    each = 2 * SAMPLED_SHARDS * SAMPLES
    assert got["fields"] == {".cls": each, ".txt": each}
    assert got["shards_without_offsets"] == N - 2 * SAMPLED_SHARDS  # of the whole index
    listed = [d["shard"] for d in got["shard_detail"]]
    assert listed == [0, 7, N - 2, N - 1]
    assert got["shard_detail"][1]["url"].endswith(shard_name(7))
    # One ShardInfo per shard (the old path) is ~100 bytes each plus its URL: > 15 MB here.
    assert peak < 2_000_000, peak


def test_small_index_counts_every_table(tmp_path: Path) -> None:
    path = write_big_index(tmp_path / "small.widx", 30, ends=2)
    got, _ = _summary_peak(path)
    assert got["fields_from"] == 30 <= FIELDS_FROM_ALL_UP_TO
    assert got["fields"] == {".cls": 4 * SAMPLES, ".txt": 4 * SAMPLES}
    assert got["shards_without_offsets"] == 26
    sql = tmp_path / "small.sqlite"
    convert_index(str(path), str(sql))
    got_sql, _ = _summary_peak(sql, all_shards=True)
    assert {k: v for k, v in got_sql.items() if k != "shard_detail"} == {
        k: v for k, v in got.items() if k != "shard_detail"
    }


def test_cli_info_of_a_big_table(big: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "wids", "index", "info", str(big), "--json", "--shard", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["shards"] == N and [d["shard"] for d in info["shard_detail"]] == [0, 3, N - 1]
    bad = subprocess.run(
        [sys.executable, "-m", "wids", "index", "info", str(big), "--shard", str(N)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "out of range" in bad.stderr


def test_a_big_json_index_does_not_guess_the_shards_without_tables(tmp_path: Path) -> None:
    """A JSON reader cannot count tables from a column: sampled, the count is unknown."""
    n = FIELDS_FROM_ALL_UP_TO + 1
    path = write_big_index(tmp_path / "b.widx", n, ends=1)
    convert_index(str(path), str(tmp_path / "b.json"))
    got, _ = _summary_peak(tmp_path / "b.json")
    assert got["fields_from"] == 2 * SAMPLED_SHARDS and got["shards_without_offsets"] is None
    assert got["samples"] == n * SAMPLES
    every, _ = _summary_peak(tmp_path / "b.json", all_shards=True)
    assert every["shards_without_offsets"] == n - 2 and every["fields_from"] == n
