"""Lookahead prefetch (``wids.dataset.lookahead``): the sampler's plan, prefetched reads."""

from __future__ import annotations

import pickle

import pytest

from wids import ChunkedSampler, DistributedChunkedSampler, ShardListDataset, build_index
from wids.synth import write_dataset

NS, NSAMPLES = 4, 25


@pytest.fixture(scope="module")
def local_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("lookahead")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, real_images=False)
    index = str(d / "train.json")
    build_index(paths, index, name="train")
    return index


@pytest.mark.parametrize("cls", [ChunkedSampler, DistributedChunkedSampler])
def test_a_sampler_offers_its_order_to_the_dataset_it_was_built_from(local_index, cls):
    ds = ShardListDataset(local_index, transformations=[])
    sampler = cls(ds, chunksize=10, seed=3)
    assert ds._pool.plan is sampler
    sampler.set_epoch(2)
    assert list(sampler._planned_order()) == list(sampler)
    state = sampler.state_dict(position=17)
    sampler.load_state_dict(state)
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets
    expected = list(sampler)  # the resumed rest of epoch 2
    assert list(copy._pool.plan._planned_order()) == expected
    assert len(expected) == len(ds) - 17
