"""The dataset's shard readers: batch planning, the per-read header check, the download check."""

from __future__ import annotations

import shutil

import pytest

from wids.dataset.readers import HEADER, Block, download_check, header_check, plan_batch
from wids.errors import CorruptReadError
from wids.index import scan_shard
from wids.storage import Source
from wids.synth import write_dataset


def test_plan_batch_merges_consecutive_and_near_spans_of_a_shard():
    spans = [
        (0, 1000, 1100, 1),  # consecutive with the next sample of shard 0
        (0, 1612, 1700, 2),
        (1, 0, 100, 0),
        (0, 90000, 90100, 40),  # far: a request of its own
        (1, 0, 100, 0),  # a repeat
    ]
    blocks, where = plan_batch(spans, merge_gap=1000)
    assert blocks == [Block(0, 1000, 1700), Block(0, 90000, 90100), Block(1, 0, 100)]
    assert where == [(0, 0), (0, 612), (2, 0), (1, 0), (2, 0)]


def test_plan_batch_gap_decides_for_non_consecutive_samples():
    spans = [(0, 0, 100, 0), (0, 600, 700, 5)]
    assert len(plan_batch(spans, merge_gap=500)[0]) == 1
    assert len(plan_batch(spans, merge_gap=499)[0]) == 2


@pytest.fixture()
def shard(tmp_path):
    path = write_dataset(str(tmp_path), shards=1, samples_per_shard=5, real_images=False)[0]
    _, members, _ = scan_shard(Source(path))
    return path, members


def test_header_check_accepts_the_right_header_and_names_a_wrong_one(shard):
    path, members = shard
    data = open(path, "rb").read()
    start = int(members.member_offset[0]) - HEADER
    name = members.key(0) + members.fields[int(members.member_field[0])]
    size = int(members.member_size[0])
    assert header_check([(0, name, size)], start)(data[start:]) is None
    problem = header_check([(0, name, size + 1)], start)(data[start:])
    assert problem is not None and f"at byte {start}" in problem and name in problem
    early = header_check([(-1, name, size)], 0)(data)
    assert early is not None and "too early" in early


def test_download_check_passes_a_right_copy_and_rejects_a_wrong_one(shard, tmp_path):
    path, members = shard
    download_check(members, "https://h/a.tar")(path)  # no error
    wrong = tmp_path / "wrong.tar"
    shutil.copy(path, wrong)
    with open(wrong, "r+b") as f:  # the last member's header names another member
        f.seek(int(members.member_offset[-1]) - HEADER)
        f.write(b"x" * 20)
    with pytest.raises(CorruptReadError, match="not what the index records"):
        download_check(members, "https://h/a.tar")(str(wrong))
