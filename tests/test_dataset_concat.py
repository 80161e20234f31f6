"""``ds1 + ds2``: a torch ``ConcatDataset`` whose shards and sub-datasets the samplers see."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tar_oracle import dataset_samples, strip_meta  # noqa: E402
from tarfixtures import make_samples, write_shard  # noqa: E402
from torch.utils.data import ConcatDataset, DataLoader, Dataset  # noqa: E402

from wids import (  # noqa: E402
    ChunkedSampler,
    DistributedChunkedSampler,
    ShardedSampler,
    ShardListDataset,
    build_index,
)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Path], Path]:
    """An index of two shards (5 + 4 samples) and a third shard (3 samples) listed by hand."""
    d = tmp_path_factory.mktemp("concat")
    shards = [
        write_shard(d / "a-000.tar", make_samples(5)),
        write_shard(d / "a-001.tar", make_samples(4, start=5, prefix="x/")),
        write_shard(d / "b-000.tar", make_samples(3, start=100)),
    ]
    index = str(d / "a.json")
    build_index([str(p) for p in shards[:2]], index, name="a")
    return index, shards, d


def _both(parts):
    index, shards, _ = parts
    a = ShardListDataset(index, transformations=[])
    b = ShardListDataset([{"url": str(shards[2]), "nsamples": 3}], transformations=[])
    return a, b


def test_plus_keeps_the_parts_shards_and_sub_datasets(parts):
    a, b = _both(parts)
    both = a + b
    assert isinstance(both, ConcatDataset) and len(both) == 12
    assert both.lengths == [5, 4, 3]
    assert [(c.name, c.start, c.stop) for c in both.components] == [("a", 0, 9), ("", 9, 12)]
    three = a + b + a
    assert [len(p) for p in three.datasets] == [9, 3, 9]  # flat, not nested
    assert three.lengths == [5, 4, 3, 5, 4]
    assert three.components[-1].start == 12 and three.components[-1].stop == 21


def test_the_samplers_keep_their_shard_aware_order(parts):
    a, b = _both(parts)
    both = a + b
    assert ChunkedSampler(both, chunksize=100).ranges == [(0, 5), (5, 9), (9, 12)]
    shard_of = {i: s for s, (lo, hi) in enumerate([(0, 5), (5, 9), (9, 12)]) for i in range(lo, hi)}
    order = list(ShardedSampler(both, shufflefirst=True, seed=3))
    runs = [shard for shard, _ in itertools.groupby(order, key=shard_of.get)]
    assert sorted(runs) == [0, 1, 2]  # each shard served in one run, in some order
    assert sorted(order) == list(range(12))
    ranks = [DistributedChunkedSampler(both, num_replicas=2, rank=r, chunksize=100) for r in (0, 1)]
    assert sorted(i for s in ranks for i in s) == list(range(12))
    for s in ranks:
        for lo, hi in s.ranges:  # no chunk crosses a shard boundary
            assert len({shard_of[i] for i in range(lo, hi)}) == 1
    mixed = ChunkedSampler(both, mix=True, chunksize=2)
    assert len(list(mixed)) == 12


def test_a_dataloader_reads_the_concatenation_in_batches(parts):
    index, shards, _ = parts
    a, b = _both(parts)
    both = a + b
    expected = dataset_samples([str(p) for p in shards[:2]]) + dataset_samples([str(shards[2])])
    assert [strip_meta(s) for s in both.__getitems__([11, 0, 9, 5, -1])] == [
        expected[i] for i in (11, 0, 9, 5, 11)
    ]
    with pytest.raises(IndexError):
        both.__getitems__([12])
    loader = DataLoader(
        both,
        sampler=ChunkedSampler(both, chunksize=4, seed=1),
        batch_size=4,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=list,
    )
    got = [strip_meta(s) for batch in loader for s in batch]
    assert sorted(got, key=lambda s: s["__key__"]) == sorted(expected, key=lambda s: s["__key__"])
    a.close()
    b.close()


class _Plain(Dataset[int]):
    """A torch dataset with no shards: one shard to the samplers."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


def test_a_part_without_shards_counts_as_one(parts):
    a, _ = _both(parts)
    mixed = a + _Plain()
    assert mixed.lengths == [5, 4, 4]
    assert mixed.__getitems__([9, 12]) == [0, 3]
    assert ChunkedSampler(mixed, chunksize=100).ranges == [(0, 5), (5, 9), (9, 13)]
