"""The reference wids' public API as its users' code and tests use it; only the import changed.

Written from the reference's documented API (``docs/compat.md``), in the shape its own test
suite has (a dataset of three shards of 100, 100 and 3 samples, the last with gzipped text
under ``compressed/`` keys): annotations, the constructor's keywords, ``len``, ``ds[i]`` and its
metadata keys, ``get_shard``, ``get_stats``, ``close``, and the samplers over that dataset in a
DataLoader. Details held elsewhere (every sampler's exact order, each constructor keyword's
effect, reading side by side with the reference) stay in ``test_compat.py``,
``test_sampler.py`` and ``test_dataset.py``.

The one import line that changes: ``from wids.wids import ...`` (or webdataset's ``wids``)
becomes ``from wids import ...``.
"""

# No ``from __future__ import annotations``: the signatures' annotations (the reference's
# ``ShardListDataset[list[dict[str, str | int]]]``) are evaluated when this module is imported.
import gzip
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
msgpack = pytest.importorskip("msgpack")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from wids import (  # noqa: E402  (the reference: from wids.wids import ...)
    ChunkedSampler,
    DistributedChunkedSampler,
    ShardedSampler,
    ShardListDataset,
    TarWriter,
)

META = {"__key__", "__index__", "__shard__", "__shardindex__", "__dataset__"}


def _write(path: Path, n: int, fields: Any, key: Any) -> str:
    with TarWriter(str(path), encoder=False) as w:
        for i in range(n):
            w.write({"__key__": key(i), **fields(i)})
    return str(path)


@pytest.fixture(scope="module")
def testdata(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    d = tmp_path_factory.mktemp("testdata")
    numbered = "{:06d}".format
    mp = _write(d / "mpdata.tar", 100, lambda i: {"mp": msgpack.packb({"i": i})}, numbered)
    ten = _write(d / "tendata.tar", 100, lambda i: {"ten": b"t%d" % i}, numbered)
    gz = _write(
        d / "compressed.tar",
        3,
        lambda i: {"txt.gz": gzip.compress(b"line %d" % i, mtime=0)},
        lambda i: f"compressed/{i + 1:04d}",
    )
    return [
        {"url": mp, "nsamples": 100},
        {"url": ten, "nsamples": 100},
        {"url": gz, "nsamples": 3},
    ]


@pytest.fixture
def shard_list_dataset(testdata, tmp_path) -> ShardListDataset[dict[str, Any]]:
    dataset: ShardListDataset[dict[str, Any]] = ShardListDataset(
        testdata, lru_size=2, cache_dir=str(tmp_path / "cache")
    )
    yield dataset
    dataset.close()


class TestShardListDataset:
    def test_initialization(
        self, shard_list_dataset: ShardListDataset[list[dict[str, str | int]]]
    ) -> None:
        assert len(shard_list_dataset.shards) == 3
        assert shard_list_dataset.lengths == [100, 100, 3]
        assert shard_list_dataset.total_length == 203
        assert list(shard_list_dataset.cum_lengths) == [100, 200, 203]

    def test_is_a_torch_dataset(self, shard_list_dataset: ShardListDataset[dict]) -> None:
        assert isinstance(shard_list_dataset, Dataset)
        assert len(shard_list_dataset) == 203

    def test_getitem(self, shard_list_dataset: ShardListDataset[dict[str, Any]], testdata) -> None:
        sample = shard_list_dataset[17]
        assert isinstance(sample, dict) and set(sample) == META | {".mp"}
        assert sample["__key__"] == "000017" and sample[".mp"] == {"i": 17}
        assert sample["__index__"] == 17 and sample["__shardindex__"] == 17
        assert sample["__shard__"] == testdata[0]["url"]
        sample = shard_list_dataset[190]
        assert sample["__key__"] == "000090" and ".ten" in sample
        assert sample["__shardindex__"] == 90 and sample["__shard__"] == testdata[1]["url"]
        sample = shard_list_dataset[200]
        assert sample["__key__"] == "compressed/0001"
        assert sample[".txt.gz"] == "line 0"  # gunzipped and decoded; the key keeps ".gz"
        assert shard_list_dataset[201]["__key__"] == "compressed/0002"
        assert shard_list_dataset[0]["__key__"] == "000000"
        accesses, misses = shard_list_dataset.get_stats()
        # Local shards stay open (a descriptor pool, not lru_size): each was opened once.
        assert (accesses, misses) == (5, 3)
        with pytest.raises(IndexError):
            shard_list_dataset[203]

    def test_get_shard_and_close(self, shard_list_dataset: ShardListDataset[dict]) -> None:
        shard, inner, desc = shard_list_dataset.get_shard(150)
        assert inner == 50 and desc["nsamples"] == 100 and len(shard) == 100
        assert desc["url"].endswith("tendata.tar")
        shard_list_dataset.close()
        assert shard_list_dataset[150]["__key__"] == "000050"  # usable after close

    def test_the_reference_keywords(self, testdata, tmp_path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cache_size/keep/localname: accepted, and warn
            ds = ShardListDataset(
                testdata,
                cache_size=int(1e12),
                cache_dir=str(tmp_path),
                lru_size=10,
                dataset_name="ref",
                localname=None,
                transformations="PIL",
                keep=False,
                base=None,
                options=None,
            )
        assert len(ds) == 203 and ds[5]["__dataset__"] == "ref"


class TestSamplersOverTheDataset:
    def test_sharded_sampler(self, shard_list_dataset: ShardListDataset[dict]) -> None:
        sampler = ShardedSampler(shard_list_dataset)
        assert sampler.ranges == [(0, 100), (100, 200), (200, 203)]
        indexes = list(sampler)
        assert len(indexes) == 203 and len(set(indexes)) == 203
        assert min(indexes) == 0 and max(indexes) == 202
        sampler.set_epoch(1)  # the reference bumped the epoch itself; here set_epoch does
        assert list(sampler) != indexes

    def test_chunked_sampler_in_a_dataloader(
        self, shard_list_dataset: ShardListDataset[dict]
    ) -> None:
        def sampler_() -> ChunkedSampler:
            return ChunkedSampler(shard_list_dataset, num_samples=(10, 150), chunksize=25, seed=0)

        sampler = sampler_()
        loader = DataLoader(
            shard_list_dataset, sampler=sampler, batch_size=8, num_workers=2, collate_fn=list
        )
        got = [s["__index__"] for batch in loader for s in batch]
        assert got == list(sampler_())  # samples arrive in the sampler's order
        assert sorted(got) == list(range(10, 150))

    def test_distributed_chunked_sampler_with_a_patched_process_group(
        self, shard_list_dataset: ShardListDataset[dict], monkeypatch
    ) -> None:
        import torch.distributed as dist

        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_world_size", lambda: 2)
        seen = []
        for rank in (0, 1):
            monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
            sampler = DistributedChunkedSampler(shard_list_dataset, chunksize=50, seed=0)
            assert len(sampler) == 102  # ceil(203 / 2), the same on both ranks
            loader = DataLoader(shard_list_dataset, sampler=sampler, batch_size=16, collate_fn=list)
            seen.append([s["__index__"] for batch in loader for s in batch])
        assert seen[0] != list(range(102))  # shuffled
        assert set(seen[0]) == set(range(102))  # rank 0 owns the first block
        assert set(seen[0]) | set(seen[1]) == set(range(203))
        assert len(seen[1]) == 102  # padded by wrapping around, as torch's DistributedSampler
