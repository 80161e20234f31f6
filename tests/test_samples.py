from __future__ import annotations

import pytest

from wids import SampleLayoutError
from wids.samples import group_columns, group_members, split_name
from wids.tar import TarMember


def m(name: str, offset: int, size: int = 10, type: str = "0") -> TarMember:
    return TarMember(name, offset, size, type, offset - 512)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("0001.jpg", ("0001", ".jpg")),
        ("a/b/0001.seg.png", ("a/b/0001", ".seg.png")),
        ("dir.v2/0001.txt.gz", ("dir.v2/0001", ".txt.gz")),
        ("été/日本.json", ("été/日本", ".json")),
        ("0001.", ("0001", ".")),
        ("README", None),
        ("dir/README", None),
        (".hidden", None),
        ("dir/._0001.jpg", None),
    ],
)
def test_split_name(name, expected):
    assert split_name(name) == expected


def test_groups_consecutive_members_into_samples():
    members = [m("a.jpg", 512), m("a.cls", 1536), m("b.jpg", 2560), m("b.cls", 3584)]
    got = group_members(members)
    assert got == [
        ("a", [(".jpg", 512, 10), (".cls", 1536, 10)]),
        ("b", [(".jpg", 2560, 10), (".cls", 3584, 10)]),
    ]


def test_non_regular_and_keyless_members_are_skipped_and_counted():
    members = [m("d", 512, 0, "5"), m("README", 1024), m("a.jpg", 2048), m("l.jpg", 3072, 0, "2")]
    got = group_members(members)
    assert got == [("a", [(".jpg", 2048, 10)])]
    assert got.skipped == ["README"]


def test_reappearing_key_is_an_error_by_default():
    members = [m("a.jpg", 512), m("b.jpg", 1536), m("a.cls", 2560)]
    with pytest.raises(SampleLayoutError, match="'a' reappears") as e:
        group_members(members, shard="s3://b/x.tar")
    assert e.value.shard == "s3://b/x.tar"
    assert isinstance(e.value, ValueError)


def test_duplicate_field_is_an_error_by_default():
    with pytest.raises(SampleLayoutError, match="'.jpg' appears twice"):
        group_members([m("a.jpg", 512), m("a.jpg", 1536)])


def test_split_policy_starts_new_samples_like_webdataset():
    members = [m("a.jpg", 512), m("a.jpg", 1536), m("b.jpg", 2560), m("a.cls", 3584)]
    got = group_members(members, duplicates="split")
    assert [k for k, _ in got] == ["a", "a", "b", "a"]


def test_keep_first_drops_repeated_fields():
    members = [m("a.jpg", 512), m("a.jpg", 1536), m("a.cls", 2560)]
    got = group_members(members, duplicates="keep_first")
    assert got == [("a", [(".jpg", 512, 10), (".cls", 2560, 10)])]
    assert got.dropped == [("a", ".jpg")]


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="duplicates must be one of"):
        group_members([], duplicates="merge")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "names",
    [
        ["a.jpg", "b.jpg", "a.cls"],  # a key reappears
        ["a.jpg", "a.jpg", "a.cls", "b.jpg"],  # a field twice in one sample
        ["a.jpg", "README", "a.cls", "b.jpg", "b.jpg", "a.txt"],  # both, and a keyless member
    ],
)
@pytest.mark.parametrize("policy", ["error", "split", "keep_first"])
def test_group_columns_applies_each_policy_as_group_members(names, policy):
    members = [m(name, 512 + 1024 * k) for k, name in enumerate(names)]
    rows = [(x.name, x.offset, x.size, x.type, x.header_offset) for x in members]

    def outcome(fn):
        try:
            return fn()
        except SampleLayoutError as e:
            return type(e), str(e), e.shard

    samples = outcome(lambda: group_members(members, duplicates=policy, shard="x.tar"))
    columns = outcome(lambda: group_columns(rows, duplicates=policy, shard="x.tar"))
    if policy == "error":
        assert samples[0] is SampleLayoutError and columns == samples
        return
    starts = columns.sample_start
    assert [
        (
            key,
            [
                (columns.fields[columns.member_field[j]], columns.member_offset[j], 10)
                for j in range(starts[i], starts[i + 1])
            ],
        )
        for i, key in enumerate(columns.keys)
    ] == samples
    assert (columns.dropped, columns.skipped) == (samples.dropped, samples.skipped)
