"""Member tables of a small local index parsed when it loads (``wids.dataset.localtables``).

Forked workers inherit them; what each process checks on a shard's first touch is unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from forked import in_fork
from tar_oracle import dataset_samples, strip_meta

import wids.dataset.localtables
from wids import IndexFormatError, IndexMismatchError, ShardListDataset, build_index
from wids.synth import write_dataset

NS, NSAMPLES = 3, 6


@pytest.fixture
def local(tmp_path: Path) -> dict:
    paths = write_dataset(str(tmp_path), shards=NS, samples_per_shard=NSAMPLES, real_images=False)
    index = tmp_path / "train.json"
    build_index(paths, str(index), name="train")
    return {"paths": paths, "index": index, "members": tmp_path / "train.members"}


def _read_every_shard(ds: ShardListDataset) -> str:
    return ",".join(ds[s * NSAMPLES + 1]["__key__"] for s in range(NS))


def test_a_forked_worker_inherits_the_tables_parsed_when_the_index_loaded(local) -> None:
    """Before, each forked worker read every sidecar again (here: gone, so it failed)."""
    ds = ShardListDataset(str(local["index"]), transformations=[])
    assert len(ds) == NS * NSAMPLES  # loads the description: the tables with it
    shutil.rmtree(local["members"])
    got = in_fork(lambda: _read_every_shard(ds))
    oracle = dataset_samples(local["paths"])
    assert got == ",".join(oracle[s * NSAMPLES + 1]["__key__"] for s in range(NS))
    assert [strip_meta(ds[i]) for i in range(len(ds))] == oracle
    ds.close()


def test_above_the_bounds_tables_are_parsed_on_first_use(local, monkeypatch) -> None:
    monkeypatch.setattr(wids.dataset.localtables, "MAX_SHARDS", NS - 1)
    ds = ShardListDataset(str(local["index"]), transformations=[])
    assert len(ds) == NS * NSAMPLES
    shutil.rmtree(local["members"])
    assert "ShardNotFoundError" in in_fork(lambda: _read_every_shard(ds))
    ds.close()


def test_a_bad_table_is_left_for_its_shards_first_read(local) -> None:
    doc = json.loads(local["index"].read_text())
    sidecar = local["index"].parent / doc["shardlist"][1]["members"]
    sidecar.write_text('{"format": "wids-index-json')
    ds = ShardListDataset(str(local["index"]), transformations=[])
    assert len(ds) == NS * NSAMPLES  # no error here
    assert ds[0]["__key__"] and ds[2 * NSAMPLES]["__key__"]
    with pytest.raises(IndexFormatError, match="not valid JSON") as err:
        ds[NSAMPLES]
    assert sidecar.name in str(err.value)
    ds.close()


def test_a_shard_changed_after_the_tables_were_parsed_is_refused_in_a_worker(local) -> None:
    ds = ShardListDataset(str(local["index"]), transformations=[])
    assert len(ds) == NS * NSAMPLES
    shard = local["paths"][1]
    data = Path(shard).read_bytes()
    Path(shard).write_bytes(data[:1024] + b"x" * 512 + data[1536:])  # same size, new bytes
    st = os.stat(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    got = in_fork(lambda: _read_every_shard(ds))
    assert got.startswith("error: IndexMismatchError") and "000001" in got
    with pytest.raises(IndexMismatchError):
        ds[NSAMPLES]
    ds.close()


def test_a_worker_that_loads_the_index_itself_parses_only_what_it_reads(local) -> None:
    """No description loaded before the fork (no ``len``): the worker loads it and parses one
    table, not all (it forks nothing; spawned workers load it the same way)."""
    from torch.utils.data import DataLoader

    def tables(sample: dict) -> dict:
        return {"key": sample["__key__"], "tables": len(ds._catalog._members)}

    ds = ShardListDataset(str(local["index"]), transformations=[tables])
    loader = DataLoader(ds, sampler=[1, 2], batch_size=None, num_workers=1)
    got = list(loader)
    assert [s["tables"] for s in got] == [1, 1] and not ds._catalog.loaded
    ds.close()
