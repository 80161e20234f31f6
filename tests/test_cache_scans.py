"""The scan-once member-table cache (``wids.cache.scans``): one scan per machine, by fingerprint."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tarfile

import pytest

from wids import ShardInfo, ShardMembers
from wids.cache import scan_cached
from wids.errors import IndexMismatchError
from wids.samples import split_name
from wids.storage import Source
from wids.synth import write_dataset, write_shard


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


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    return write_dataset(
        str(d), shards=2, samples_per_shard=30, real_images=False, jpg_bytes=3000, extra_fields=True
    )


def _two_shards(d):
    """Two shards of the same size whose members have other names."""
    paths = [str(d / "a.tar"), str(d / "b.tar")]
    for p, prefix in zip(paths, "ab", strict=True):
        write_shard(p, [(f"{prefix}{i:03d}.bin", b"z" * 600) for i in range(5)])
    assert os.path.getsize(paths[0]) == os.path.getsize(paths[1])
    return paths


def _scan_in_child(url, cache_dir, q):
    table = scan_cached(Source(url), cache_dir=cache_dir)
    q.put(table.to_columns())


def test_scan_cached_scans_once_and_serves_other_processes(shards, tmp_path):
    cache = str(tmp_path / "cache")
    table = scan_cached(Source(shards[0]), cache_dir=cache)
    assert table == tarfile_table(shards[0])
    saved = os.listdir(os.path.join(cache, "scans"))
    assert len([f for f in saved if f.endswith(".json")]) == 1
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_scan_in_child, args=(shards[0], cache, q)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(ShardMembers.from_columns(c) == table for c in got)


def test_scan_cached_rejects_a_shard_of_the_wrong_size(shards, tmp_path):
    with pytest.raises(IndexMismatchError, match="index says 5"):
        scan_cached(
            Source(shards[0]), cache_dir=str(tmp_path), expected=ShardInfo(shards[0], 30, size=5)
        )


def test_scan_cached_rescans_a_changed_shard(tmp_path):
    p = str(tmp_path / "s.tar")
    write_shard(p, [("a.cls", b"1")])
    cache = str(tmp_path / "c")
    assert len(scan_cached(Source(p), cache_dir=cache)) == 1
    write_shard(p, [("a.cls", b"1"), ("b.cls", b"2"), ("c.cls", b"3")])
    assert len(scan_cached(Source(p), cache_dir=cache)) == 3


def test_scan_cache_record_is_checked_by_fingerprint(tmp_path):
    a, b = _two_shards(tmp_path)
    cache = str(tmp_path / "c")
    assert scan_cached(Source(b), cache_dir=cache).key(0) == "b000"
    st = os.stat(b)
    shutil.copyfile(a, b)
    # a later rewrite at the same size: the record's mtime no longer matches
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert scan_cached(Source(b), cache_dir=cache).key(0) == "a000"
    # and the index's fingerprint is checked, not only its size
    wrong = ShardInfo(b, 5, size=st.st_size, mtime=st.st_mtime - 3600)
    with pytest.raises(IndexMismatchError, match="modified at"):
        scan_cached(Source(b), cache_dir=str(tmp_path / "c2"), expected=wrong)
