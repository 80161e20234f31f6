"""Is this file still the indexed shard? ``wids.index.fingerprint``, and ``wids index verify``."""

from __future__ import annotations

import pytest

from wids import ShardInfo, ShardMembers
from wids.index import Fingerprint, header_mismatch_at_spot, unchanged
from wids.index.fingerprint import spot_member
from wids.storage import FileStat


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
def test_fingerprint_mismatch(recorded, now, differs):
    got = recorded.fingerprint.mismatch(now)
    assert recorded.fingerprint.matches(now) is (got is None)
    if differs is None:
        assert got is None
    else:
        assert got is not None and differs in got


MD5 = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


@pytest.mark.parametrize(
    "recorded, now, differs",
    [
        # md5s decide when both sides know one, whatever the mtime or etag says
        (ShardInfo("s", 1, 100, mtime=1.0, md5sum=MD5), Fingerprint(100, None, 9.0, MD5), None),
        (ShardInfo("s", 1, 100, etag="a", md5sum=MD5), Fingerprint(100, "b", 9.0, MD5), None),
        (
            ShardInfo("s", 1, 100, mtime=1.0, md5sum=MD5),
            Fingerprint(100, None, 1.0, OTHER),
            "contents changed",
        ),
        # an S3 etag that is a plain md5 (one part) is compared with a recorded md5
        (
            ShardInfo("s", 1, 100, mtime=1.0, md5sum=MD5),
            FileStat(100, f'"{MD5.upper()}"', 9.0),
            None,
        ),
        (
            ShardInfo("s", 1, 100, mtime=1.0, md5sum=MD5),
            FileStat(100, f'"{OTHER}"', 9.0),
            "is not the md5",
        ),
        # a multipart etag (-N) or a weak one is no md5: only the size (and a header) then
        (ShardInfo("s", 1, 100, mtime=1.0, md5sum=MD5), FileStat(100, f'"{OTHER}-3"', 9.0), None),
        (ShardInfo("s", 1, 100, mtime=1.0, md5sum=MD5), FileStat(100, f'W/"{OTHER}"', 9.0), None),
        # a recorded etag equal to the store's wins over the md5 rule (SSE-KMS etags)
        (ShardInfo("s", 1, 100, etag=OTHER, md5sum=MD5), FileStat(100, OTHER, 9.0), None),
        # a multipart etag recorded, the same bytes re-uploaded in one part
        (ShardInfo("s", 1, 100, etag=f"{OTHER}-2", md5sum=MD5), FileStat(100, MD5, 9.0), None),
        # GCS's md5Hash (FileStat.md5) against a recorded md5
        (
            ShardInfo("s", 1, 100, etag="CAE=", md5sum=MD5),
            FileStat(100, "CAI=", 9.0, OTHER),
            "contents changed",
        ),
        # a new mtime: with an md5 recorded the bytes can tell, without one the message says so
        (ShardInfo("s", 1, 100, mtime=1.0, md5sum=MD5), FileStat(100, None, 2.0), "not compared"),
        (ShardInfo("s", 1, 100, mtime=1.0), FileStat(100, None, 2.0), "records no md5"),
    ],
)
def test_fingerprint_md5_rules(recorded, now, differs):
    got = recorded.fingerprint.mismatch(now)
    if differs is None:
        assert got is None
    else:
        assert got is not None and differs in got


def test_needs_content_only_when_the_mtime_alone_differs_and_an_md5_is_recorded():
    fp = Fingerprint(100, None, 1.0, MD5)
    assert fp.needs_content(FileStat(100, None, 2.0))
    assert not fp.needs_content(FileStat(100, None, 1.0))  # the same: nothing to read
    assert not fp.needs_content(FileStat(101, None, 2.0))  # another size: changed, no reading
    assert not fp.needs_content(FileStat(100, None, 2.0), data_end=200)  # too short
    assert not fp.needs_content(FileStat(100, "e", 2.0))  # a store: never read whole
    assert not fp.needs_content(Fingerprint(100, None, 2.0, OTHER))  # md5 known already
    assert not Fingerprint(100, None, 1.0).needs_content(FileStat(100, None, 2.0))  # no md5


def test_fingerprint_strict_needs_a_positive_identification():
    def strict(info: ShardInfo, stat: FileStat) -> str | None:
        return info.fingerprint.mismatch(stat, strict=True)

    assert strict(ShardInfo("s", 1, 100), FileStat(100, None, 1.0))
    assert strict(ShardInfo("s", 1, 100, mtime=1.0), FileStat(100, "e", 1.0))
    assert strict(ShardInfo("s", 1, None, etag="e"), FileStat(100, "e", 1.0))
    assert not strict(ShardInfo("s", 1, 100, etag="e"), FileStat(100, "e", 1))
    assert not strict(ShardInfo("s", 1, 100, mtime=1.0), FileStat(100, None, 1.0))
    got = ShardInfo("s", 1, None).fingerprint.mismatch(FileStat(100, None, 1.0), data_end=200)
    assert got is not None and "up to byte 200" in got


def test_fingerprint_is_the_shard_infos_and_compares_md5_when_both_know_one():
    info = ShardInfo("s", 1, 100, etag='"e"', mtime=2.0, md5sum="ABCDEF")
    fp = info.fingerprint
    assert fp == Fingerprint(100, '"e"', 2.0, "ABCDEF")
    assert Fingerprint.of(FileStat(100, "e", 3.0)) == Fingerprint(100, "e", 3.0, None)
    assert Fingerprint.of(fp) is fp
    # two fingerprints compare by the same rule as a fingerprint and a stat
    assert fp.matches(Fingerprint(100, "W/e", md5="abcdef"))  # md5 case-blind
    got = fp.mismatch(Fingerprint(100, "e", md5="012345"))
    assert got is not None and "md5 is 012345" in got
    assert fp.matches(Fingerprint(100, "e"))  # no md5 on one side: nothing to compare
    with pytest.raises(AttributeError):
        fp.size = 3  # type: ignore[misc]  # a frozen value


def _shard(path, prefix, n=3):
    from wids.index import scan_shard
    from wids.storage import Source
    from wids.synth import write_shard

    write_shard(
        str(path), [(f"{prefix}{i:04d}{f}", b"v" * 300) for i in range(n) for f in (".a", ".b")]
    )
    return scan_shard(Source(str(path)))[1]


def _reader(path, reads=None):
    def at(start, end):
        if reads is not None:
            reads.append((start, end))
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    return at


def test_header_spot_check_catches_another_shard_of_the_same_size(tmp_path):
    members = _shard(tmp_path / "a.tar", "a")
    _shard(tmp_path / "b.tar", "b")
    assert spot_member(members) == ("a0002.a", 4 * 1024 + 512, 300)  # 1 KiB a member
    reads: list[tuple[int, int]] = []
    assert header_mismatch_at_spot(members, _reader(tmp_path / "a.tar", reads)) is None
    assert reads == [(4 * 1024, 4 * 1024 + 512)]  # one 512-byte read
    got = header_mismatch_at_spot(members, _reader(tmp_path / "b.tar"))
    assert got is not None and "'b0002.a'" in got
    assert header_mismatch_at_spot(ShardMembers.from_samples([]), _reader("unused")) is None


def test_unchanged_needs_fingerprint_and_header(tmp_path):
    import os

    members = _shard(tmp_path / "a.tar", "a")
    _shard(tmp_path / "b.tar", "b")
    st = os.stat(tmp_path / "a.tar")
    recorded = Fingerprint(st.st_size, None, st.st_mtime)
    now = FileStat(st.st_size, None, st.st_mtime)
    assert unchanged(recorded, members, now, _reader(tmp_path / "a.tar"))
    # same fingerprint, other bytes (a swap with its mtime restored): the header tells
    assert not unchanged(recorded, members, now, _reader(tmp_path / "b.tar"))
    # no mtime or etag recorded: not a positive identification
    assert not unchanged(Fingerprint(st.st_size), members, now, _reader(tmp_path / "a.tar"))
    # a file that cannot be read is not positively the shard
    assert not unchanged(recorded, members, now, lambda a, b: b"")


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
    assert code == 1 and f"CHANGED {paths[1]}: " in text and "its contents changed" in text
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


def test_deep_verify_reads_a_rewrite_whose_mtime_was_set_back(tmp_path, capsys):
    """Same size, same member layout, other bytes, the recorded mtime: only the bytes tell.

    Plain ``verify`` accepts it (its fingerprint is the recorded one); before, ``--deep``
    (rescan and compare offsets) did too. A copy (new mtime, same bytes) stays OK.
    """
    import os
    import shutil

    paths, out = _indexed(tmp_path)
    st = os.stat(paths[1])
    data = paths[1].read_bytes()
    paths[1].write_bytes(data.replace(b"v" * 300, b"w" * 300, 1))
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _verify(capsys, out)[0] == 0  # the documented limit of a cheap check
    code, text = _verify(capsys, out, "--deep")
    assert code == 1 and f"CHANGED {paths[1]}: " in text and "found by reading it" in text
    paths[1].write_bytes(data)
    shutil.copy(paths[2], tmp_path / "copy.tar")
    os.replace(tmp_path / "copy.tar", paths[2])  # a copy: new mtime, same bytes
    code, text = _verify(capsys, out, "--deep")
    assert code == 0 and "3 of 3 shards match" in text


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


# -- what a user sees of a damaged index, and of a mirror --------------------------------


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
