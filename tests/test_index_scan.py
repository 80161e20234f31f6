"""Scanning one shard into a member table (``wids.index.scan``)."""

from __future__ import annotations

import io
import os
import tarfile
import uuid

import pytest

from wids import ShardMembers
from wids.errors import SampleLayoutError
from wids.index import scan_shard
from wids.index.scan import PROBE
from wids.samples import split_name
from wids.storage import IOStats, Source, Store
from wids.synth import write_shard


def tarfile_table(path: str) -> ShardMembers:
    """The oracle: the member table Python's tarfile sees."""
    samples: list[tuple[str, list[tuple[str, int, int]]]] = []
    with tarfile.open(path) as tf:
        for ti in tf.getmembers():
            if not ti.isreg() or split_name(ti.name) is None:
                continue
            key, field = split_name(ti.name)  # type: ignore[misc]
            if samples and samples[-1][0] == key:
                samples[-1][1].append((field, ti.offset_data, ti.size))
            else:
                samples.append((key, [(field, ti.offset_data, ti.size)]))
    return ShardMembers.from_samples(samples)


@pytest.fixture
def shard(tmp_path) -> str:
    members = [(f"s{i:03d}{f}", bytes([i]) * (100 + i)) for i in range(5) for f in (".a", ".b")]
    members.append(("README", b"belongs to no sample"))
    path = str(tmp_path / "s.tar")
    write_shard(path, members)
    return path


def test_local_scan_equals_tarfile(shard: str) -> None:
    stat, table, skipped = scan_shard(Source(shard))
    assert stat.size == os.path.getsize(shard) and skipped == 1
    assert table == tarfile_table(shard)


def test_remote_scan_streams_once_and_equals_the_local_one(shard: str) -> None:
    import fsspec

    url = f"memory://scan-{uuid.uuid4().hex[:8]}/s.tar"
    fsspec.filesystem("memory").put_file(shard, url)
    stats = IOStats()
    stat, table, skipped = scan_shard(Source(url), stats=stats)
    assert (stat.size, skipped) == (os.path.getsize(shard), 1)
    assert table == scan_shard(Source(shard))[1]
    # The probe of the first bytes (small members: stream), then one sequential pass.
    assert stats.bytes_read == stat.size + PROBE


def test_duplicates_follow_the_policy(tmp_path) -> None:
    path = str(tmp_path / "d.tar")
    write_shard(path, [("k.a", b"1"), ("k.a", b"2"), ("k.b", b"3")])
    with pytest.raises(SampleLayoutError):
        scan_shard(Source(path))
    _, table, _ = scan_shard(Source(path), duplicates="keep_first")
    assert len(table) == 1 and [f for f, _, _ in table.members(0)] == [".a", ".b"]


def _large_member_tar(path: str, fmt: int) -> str:
    """Samples of a 1.1 MB member between small ones; long (GNU L / pax) and non-ASCII names."""
    with tarfile.open(path, "w", format=fmt) as tf:
        for i in range(8):
            key = f"videos/{'long-directory-name-' * 6}/clip-é-{i:03d}"  # > 100 bytes
            for ext, size in ((".json", 300), (".mp4", 1_100_000 + 4096 * i), (".cls", 2)):
                ti = tarfile.TarInfo(key + ext)
                ti.size = size
                tf.addfile(ti, io.BytesIO(bytes([i + 1]) * size))
    return path


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
@pytest.mark.parametrize("server", ["http_server", "s3_server"])
def test_remote_scan_of_large_members_hops_from_header_to_header(
    tmp_path, request, server: str, fmt: int
) -> None:
    srv = request.getfixturevalue(server)
    path = _large_member_tar(str(tmp_path / "big.tar"), fmt)
    url = srv.put(path, f"hop-{uuid.uuid4().hex[:8]}/big.tar")
    store = Store(srv.storage_options)
    hopped, streamed = IOStats(), IOStats()
    stat, table, _ = scan_shard(store.source(url), stats=hopped)
    _, whole, _ = scan_shard(store.source(url), stats=streamed, hop=False)
    assert table == whole == tarfile_table(path) and len(table) == 8
    assert streamed.bytes_read >= stat.size
    assert hopped.bytes_read <= 0.05 * stat.size  # headers only (measured: about 1.5%)


def test_remote_scan_of_small_members_streams(tmp_path, http_server) -> None:
    members = [(f"s{i:04d}{f}", bytes([i % 250]) * 700) for i in range(300) for f in (".a", ".b")]
    path = str(tmp_path / "small.tar")
    write_shard(path, members)
    url = http_server.put(path, f"hop-{uuid.uuid4().hex[:8]}/small.tar")
    stats = IOStats()
    stat, table, _ = scan_shard(Store(http_server.storage_options).source(url), stats=stats)
    assert table == tarfile_table(path)
    # One probe of the first bytes, then one sequential pass: not a request per header.
    assert stats.bytes_read == stat.size + PROBE and stats.requests <= 5


@pytest.mark.parametrize("duplicates", ["error", "split", "keep_first"])
def test_columns_grouping_equals_sample_grouping(duplicates) -> None:
    """The local scan's fused grouping (group_columns) and group_regular agree, errors too."""
    import random

    from wids.index.scan import _table
    from wids.samples import group_columns, group_regular

    rng = random.Random(7)
    for _ in range(300):
        rows = []
        for j in range(rng.randrange(0, 12)):
            key = rng.choice(["a", "b", "dir/c", "é", "x.y/z"])
            name = rng.choice([f"{key}.jpg", f"{key}.cls", f"{key}.seg.png", "README", ".hid"])
            rows.append((name, 512 * (2 * j + 1), j, rng.choice("0000007135"), 1024 * j))
        regular = [(r[0], r[1], r[2]) for r in rows if r[3] in "07"]
        try:
            want = ShardMembers.from_samples(group_regular(regular, duplicates=duplicates))
        except SampleLayoutError as e:
            with pytest.raises(SampleLayoutError) as got:
                group_columns(rows, duplicates=duplicates)
            assert str(got.value) == str(e)
            continue
        cols = group_columns(rows, duplicates=duplicates)
        assert _table(cols) == want
        assert cols.skipped == group_regular(regular, duplicates=duplicates).skipped
