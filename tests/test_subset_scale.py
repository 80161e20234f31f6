"""``wids subset`` of a few shards of a 10^5-shard index decodes only the chosen records."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import fsspec
import numpy as np
import pytest
from bigindex import SAMPLES, shard_name, write_big_index

from wids import ShardListDataset
from wids.subset import make_subset, select_shards

N = 100_000
PICK = (50_000, 50_001)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_big_index(tmp_path_factory.mktemp("big") / "big.widx", N, real=PICK)


def _subset_peak(index: str, to: Path, **kwargs: object) -> tuple[object, int]:
    tracemalloc.start()
    try:
        report = make_subset(index, to, shards=slice(*PICK[:1], PICK[-1] + 1), jobs=2, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return report, peak


def _check(report: object, to: Path) -> None:
    assert report.shards == 2 and report.samples == 2 * SAMPLES  # type: ignore[attr-defined]
    # a subset keeps its source's format: a .widx index gives a .widx index
    ds = ShardListDataset(str(to / "big.widx"), transformations=[])
    assert len(ds) == 2 * SAMPLES
    assert ds[SAMPLES]["__key__"] == "000000" and ds[SAMPLES][".cls"] == b"0"
    urls = [os.path.basename(shard["url"]) for shard in ds.shards]
    ds.close()
    assert urls == [shard_name(k) for k in PICK]


def test_two_shards_of_a_big_local_table(big: Path, tmp_path: Path) -> None:
    report, peak = _subset_peak(str(big), tmp_path / "sub")
    _check(report, tmp_path / "sub")
    # One ShardInfo per shard (the old path) is ~100 bytes each plus its URL: > 15 MB here.
    assert peak < 3_000_000, peak


def test_two_shards_of_a_big_remote_table(big: Path, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = "memory://wids-subset-scale"
    for name in ["big.widx", *(shard_name(k) for k in PICK)]:
        with open(big.parent / name, "rb") as f:
            fs.pipe_file(f"{root}/{name}", f.read())
    try:
        report, peak = _subset_peak(f"{root}/big.widx", tmp_path / "sub")
    finally:
        fs.rm(root.removeprefix("memory://"), recursive=True)
    _check(report, tmp_path / "sub")
    assert peak < 3_000_000 + os.path.getsize(big), peak  # the columns are read, not records


def test_select_shards_from_a_count_column() -> None:
    counts = np.array([3, 0, 2, 5, 1], dtype=np.int64)
    for samples, want in [(1, 1), (3, 1), (4, 3), (5, 3), (6, 4), (10, 4), (11, 5), (99, 5)]:
        assert select_shards(counts, samples=samples) == list(range(want))
        assert select_shards(counts.tolist(), samples=samples) == list(range(want))
    assert select_shards(counts, shards=slice(1, None, 2)) == [1, 3]
