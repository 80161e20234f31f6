from __future__ import annotations

import pickle

import numpy as np
import pytest

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


# -- a shard's identity: fingerprint and a recorded member's header ----------------------------

from wids.index.model import ShardInfo, header_mismatch_at_spot, shard_mismatch, spot_member  # noqa: E402
from wids.storage.source import FileStat  # noqa: E402


@pytest.mark.parametrize(
    "recorded, now, differs",
    [
        (ShardInfo("s", 1, 100), FileStat(100, None, 5.0), None),
        (ShardInfo("s", 1, 100), FileStat(101, None, 5.0), "size is 101"),
        # etags: compared when both sides have one, quotes and weakness aside
        (ShardInfo("s", 1, 100, etag='"abc"'), FileStat(100, "W/abc", 9.0), None),
        (ShardInfo("s", 1, 100, etag="abc"), FileStat(100, "abd", 1.0), "etag is 'abd'"),
        # mtime: compared when the store gives no etag (local files, HTTP without ETag)
        (ShardInfo("s", 1, 100, mtime=1.5), FileStat(100, None, 1.5), None),
        (ShardInfo("s", 1, 100, mtime=1.5), FileStat(100, None, 1.75), "modified at"),
        (ShardInfo("s", 1, 100, etag="e", mtime=7.0), FileStat(100, None, 8.0), "modified at"),
        # HTTP dates have whole seconds: a file's fraction is compared at that resolution
        (ShardInfo("s", 1, 100, mtime=1700000000.25), FileStat(100, None, 1700000000.0), None),
        (ShardInfo("s", 1, 100, mtime=1700000000.25), FileStat(100, None, 1700000001.0), "at"),
        # a store that issues etags holds a copy made elsewhere: its mtime is its own
        (ShardInfo("s", 1, 100, mtime=1.5), FileStat(100, "e", 99.0), None),
    ],
)
def test_shard_mismatch(recorded, now, differs):
    got = shard_mismatch(recorded, now)
    if differs is None:
        assert got is None
    else:
        assert got is not None and differs in got


def test_shard_mismatch_strict_needs_a_positive_identification():
    assert shard_mismatch(ShardInfo("s", 1, 100), FileStat(100, None, 1.0), strict=True)
    assert shard_mismatch(ShardInfo("s", 1, 100, mtime=1.0), FileStat(100, "e", 1.0), strict=True)
    assert shard_mismatch(ShardInfo("s", 1, None, etag="e"), FileStat(100, "e", 1.0), strict=True)
    assert not shard_mismatch(ShardInfo("s", 1, 100, etag="e"), FileStat(100, "e", 1), strict=True)
    assert not shard_mismatch(
        ShardInfo("s", 1, 100, mtime=1.0), FileStat(100, None, 1.0), strict=True
    )
    got = shard_mismatch(ShardInfo("s", 1, None), FileStat(100, None, 1.0), data_end=200)
    assert got is not None and "up to byte 200" in got


def _shard(path, prefix, n=3):
    from wids.index.build import scan_shard
    from wids.storage.source import Source
    from wids.synth import write_shard

    write_shard(
        str(path), [(f"{prefix}{i:04d}{f}", b"v" * 300) for i in range(n) for f in (".a", ".b")]
    )
    return scan_shard(Source(str(path)))[1]


def test_header_spot_check_catches_another_shard_of_the_same_size(tmp_path):
    members = _shard(tmp_path / "a.tar", "a")
    _shard(tmp_path / "b.tar", "b")
    assert spot_member(members) == ("a0002.a", 4 * 1024 + 512, 300)  # 1 KiB a member
    reads = []

    def read(path):
        def at(start, end):
            reads.append((start, end))
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(end - start)

        return at

    assert header_mismatch_at_spot(members, read(tmp_path / "a.tar")) is None
    assert reads == [(4 * 1024, 4 * 1024 + 512)]  # one 512-byte read
    got = header_mismatch_at_spot(members, read(tmp_path / "b.tar"))
    assert got is not None and "'b0002.a'" in got
    assert header_mismatch_at_spot(ShardMembers.from_samples([]), read("unused")) is None


# -- wids index verify ---------------------------------------------------------------------


def _verify(capsys, *argv):
    from wids.cli import main

    code = main(["index", "verify", *map(str, argv)])
    return code, capsys.readouterr().out


def _indexed(tmp_path, suffix=".json", n=3):
    import os
    import time

    from wids import build_index

    paths = [tmp_path / f"s{k}.tar" for k in range(n)]
    for k, p in enumerate(paths):
        _shard(p, f"s{k}-")
    out = tmp_path / f"i{suffix}"
    build_index([str(p) for p in paths], str(out))
    time.sleep(0.05)  # later changes get later mtimes
    assert all(os.path.exists(p) for p in paths)
    return paths, out


def test_verify_catches_a_same_size_rewrite(tmp_path, capsys):
    paths, out = _indexed(tmp_path)
    assert _verify(capsys, out)[0] == 0
    data = paths[1].read_bytes()
    paths[1].write_bytes(data.replace(b"v" * 300, b"w" * 300, 1))  # same size, other bytes
    code, text = _verify(capsys, out)
    assert code == 1 and f"CHANGED {paths[1]}: " in text and "modified at" in text
    assert "2 of 3 shards match" in text and "--full" in text


def test_verify_catches_a_swap_with_restored_mtime(tmp_path, capsys):
    import os
    import shutil

    paths, out = _indexed(tmp_path)
    st = os.stat(paths[2])
    shutil.copyfile(paths[0], paths[2])
    os.utime(paths[2], ns=(st.st_atime_ns, st.st_mtime_ns))
    code, text = _verify(capsys, out)
    assert code == 1 and f"CHANGED {paths[2]}: " in text and "the header names 's0-0002.a'" in text


@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_verify_loads_every_member_table(tmp_path, capsys, suffix):
    import json
    import sqlite3

    paths, out = _indexed(tmp_path, suffix)
    if suffix == ".json":
        sidecar = tmp_path / json.loads(out.read_text())["shardlist"][1]["members"]
        sidecar.write_text(sidecar.read_text().replace('"member_offset":[', '"member_offset":[-5,'))
    else:
        with sqlite3.connect(out) as db:
            db.execute("DELETE FROM members WHERE shard_id = 1 AND sample_idx = 2")
    code, text = _verify(capsys, out)  # no --deep: the member tables are read anyway
    assert code == 1 and f"DAMAGED {paths[1]}: its member table:" in text
    assert "2 of 3 shards match" in text
    assert "to repair, rebuild the index: wids index create" in text and "--full" in text


def test_verify_deep_and_url_map(tmp_path, capsys):
    import shutil

    paths, out = _indexed(tmp_path)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for p in paths:
        shutil.copyfile(p, mirror / p.name)
    assert _verify(capsys, out, "--deep")[0] == 0
    code, text = _verify(capsys, out, "--deep", "--url-map", f"{tmp_path}/={mirror}/")
    assert code == 0 and "3 of 3 shards match" in text
    shutil.copyfile(paths[0], mirror / paths[1].name)
    code, text = _verify(capsys, out, "--url-map", f"{tmp_path}/={mirror}/")
    assert code == 1 and f"CHANGED {mirror / paths[1].name}" in text


def test_damaged_index_errors_say_how_to_repair(tmp_path, capsys):
    from wids.cli import main

    _, out = _indexed(tmp_path)
    out.write_text(out.read_text()[:-10])
    assert main(["show", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "wids index create" in err and "--full" in err


def test_show_reads_a_mirror_through_url_map(tmp_path, capsys):
    import shutil

    from wids.cli import main

    paths, out = _indexed(tmp_path)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for p in paths:
        shutil.move(p, mirror / p.name)
    assert main(["show", str(out), "-n", "4"]) == 2  # the shards are gone from where indexed
    capsys.readouterr()
    assert main(["show", str(out), "-n", "4", "--url-map", f"{tmp_path}/={mirror}/"]) == 0
    assert "s1-0000" in capsys.readouterr().out
    assert main(["show", str(out), "--url-map", "relative=/x"]) == 2
    assert "absolute" in capsys.readouterr().err
