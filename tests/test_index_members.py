"""The member table of one shard (``wids.index.members``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from indexcontract import tar_table
from tarfixtures import make_samples, write_shard

from wids import ShardMembers
from wids.errors import IndexFormatError

SAMPLES = [
    ("a/0001", [(".jpg", 512, 100), (".cls", 1536, 1)]),
    ("日本", [(".jpg", 2560, 0), (".seg.png", 3584, 512), (".cls", 4608, 2)]),
    ("c", [(".json", 5632, 7)]),
]


def test_from_samples_round_trips_every_member():
    t = ShardMembers.from_samples(SAMPLES)
    assert len(t) == 3 and t.nmembers == 6
    for i, (key, members) in enumerate(SAMPLES):
        assert t.key(i) == key
        assert t.members(i) == members
        assert t.span(i) == (members[0][1], members[-1][1] + members[-1][2])


def test_spans_vectorised_equal_span():
    t = ShardMembers.from_samples(SAMPLES)
    starts, ends = t.spans()
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [
        t.span(i) for i in range(len(t))
    ]


def test_columns_round_trip_and_equality():
    t = ShardMembers.from_samples(SAMPLES)
    assert ShardMembers.from_columns(t.to_columns()) == t
    assert pickle.loads(pickle.dumps(t)) == t


def test_empty_table():
    t = ShardMembers.from_samples([])
    assert len(t) == 0 and t.nmembers == 0
    assert [a.tolist() for a in t.spans()] == [[], []]
    assert ShardMembers.from_columns(t.to_columns()) == t


def test_memory_per_sample_is_compact():
    samples = [
        (f"{i:012d}", [(".jpg", 512 + i * 3072, 1000), (".cls", 2048 + i * 3072, 1)])
        for i in range(10_000)
    ]
    t = ShardMembers.from_samples(samples)
    assert t.nbytes / len(t) < 80  # keys (12 B) + offsets; never dicts


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c.pop("keys"),
        lambda c: c.update(member_field=[0, 9, 0, 0, 0, 0]),
        lambda c: c.update(sample_start=[0, 2, 1, 6]),
        lambda c: c.update(member_size=[1, 2]),
        lambda c: c.update(member_offset=[-1, 0, 0, 0, 0, 0]),
        lambda c: c.update(keys=5),
        lambda c: c.update(keys=["a", "b"]),
    ],
)
def test_malformed_columns_raise_index_format_error(mutate):
    cols = ShardMembers.from_samples(SAMPLES).to_columns()
    mutate(cols)
    with pytest.raises(IndexFormatError):
        ShardMembers.from_columns(cols)


def test_arrays_have_fixed_dtypes():
    t = ShardMembers.from_samples(SAMPLES)
    assert t.member_offset.dtype == np.int64 and t.member_field.dtype == np.uint16


def test_keys_fast_path_equals_per_key_decode():
    ascii_t = ShardMembers.from_samples([(f"k{i}", [(".a", 512 + i * 1024, 1)]) for i in range(50)])
    mixed_t = ShardMembers.from_samples(SAMPLES)
    for t in (ascii_t, mixed_t):
        assert t.keys() == [t.key(i) for i in range(len(t))]


def test_spans_vectorised_match(tmp_path: Path) -> None:
    long_dir = "deep/" + "d" * 120 + "/"
    samples = make_samples(5, prefix=long_dir + "données-", fields=(".seg.png", ".txt", ".json"))
    t = tar_table(write_shard(tmp_path / "s.tar", samples, format="pax"))
    starts, ends = t.spans()
    assert np.array_equal(starts, [t.span(i)[0] for i in range(len(t))])
    assert np.array_equal(ends, [t.span(i)[1] for i in range(len(t))])


def test_field_names_are_one_object_in_every_table():
    """Tables of thousands of shards share their field names (warm when samples are built)."""
    names = ["".join([".jp", "g"]) for _ in range(2)]  # equal, two objects (as two sidecars')
    assert names[0] is not names[1]
    a, b = (ShardMembers.from_samples([("k", [(name, 512, 1)])]) for name in names)
    assert a.fields == b.fields == (".jpg",) and a.fields[0] is b.fields[0]


def test_shared_field_names_are_bounded():
    """A hostile index's field names are not all kept for the life of the process."""
    from wids.index import members

    before = len(members._SHARED_NAMES)
    long = "." + "x" * 100
    t = ShardMembers.from_samples([("k", [(long, 512, 1)])])
    assert t.fields == (long,) and long not in members._SHARED_NAMES  # too long to keep
    for n in range(members._SHARED_MAX + 50):
        ShardMembers.from_samples([("k", [(f".f{n}", 512, 1)])])
    assert before <= len(members._SHARED_NAMES) <= members._SHARED_MAX
