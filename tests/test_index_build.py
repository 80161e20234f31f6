from __future__ import annotations

import json
import os
import shutil
import tarfile

import pytest

from wids import ShardMembers, open_index
from wids.errors import SampleLayoutError, TarFormatError
from wids.index.build import build_index, expand_shard_args
from wids.index.scan import PROBE
from wids.samples import split_name
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
        str(d), shards=4, samples_per_shard=30, real_images=False, jpg_bytes=3000, extra_fields=True
    )


@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_build_matches_tarfile_for_every_shard(shards, tmp_path, suffix):
    out = str(tmp_path / f"idx{suffix}")
    report = build_index(shards, out, jobs=2)
    assert (report.shards, report.samples, report.scanned) == (4, 120, 4)
    assert report.bytes == sum(os.path.getsize(p) for p in shards)
    idx = open_index(out)
    try:
        assert [s.url for s in idx.shards] == [os.path.abspath(p) for p in shards]
        for k, path in enumerate(shards):
            assert idx.members(k) == tarfile_table(path)
            assert idx.shards[k].nsamples == 30
            assert idx.shards[k].size == os.path.getsize(path)
    finally:
        idx.close()


def test_json_index_stores_relative_urls_and_loads_as_reference_description(shards, tmp_path):
    d = tmp_path / "copy"
    d.mkdir()
    local = [shutil.copy(p, d) for p in shards]
    build_index(local, str(d / "train.json"), name="train")
    doc = json.loads((d / "train.json").read_text())
    assert doc["__kind__"] == "wids-shard-index-v1" and doc["wids_version"] == 1
    assert doc["name"] == "train"
    assert [s["url"] for s in doc["shardlist"]] == [os.path.basename(p) for p in local]
    assert all(s["nsamples"] == 30 and s["filesize"] > 0 for s in doc["shardlist"])


def test_incremental_rebuild_rescans_only_changed_shards(shards, tmp_path):
    d = tmp_path / "inc"
    d.mkdir()
    local = [shutil.copy(p, d) for p in shards]
    out = str(d / "idx.json")
    build_index(local, out)
    again = build_index(local, out)
    assert (again.scanned, again.reused) == (0, 4)
    write_shard(local[2], [("x.cls", b"1"), ("y.cls", b"2")])
    changed = build_index(local, out)
    assert (changed.scanned, changed.reused) == (1, 3)
    idx = open_index(out)
    assert idx.shards[2].nsamples == 2 and idx.members(2) == tarfile_table(local[2])
    idx.close()
    assert build_index(local, out, incremental=False).scanned == 4


def test_bad_shard_fails_the_build_naming_it(shards, tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(open(shards[0], "rb").read()[:5000])
    out = tmp_path / "idx.json"
    with pytest.raises(TarFormatError) as e:
        build_index([*shards, str(bad)], str(out))
    assert "bad.tar" in str(e.value)
    assert not out.exists()


def test_skip_bad_records_the_shard_and_goes_on(shards, tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"\x1f\x8b" + os.urandom(3000))
    out = str(tmp_path / "idx.json")
    report = build_index([shards[0], str(bad), shards[1]], out, skip_bad=True)
    assert report.shards == 2 and len(report.bad) == 1 and "bad.tar" in report.bad[0][0]
    idx = open_index(out)
    assert [os.path.basename(s.url) for s in idx.shards] == [
        os.path.basename(shards[0]),
        os.path.basename(shards[1]),
    ]
    idx.close()


def test_duplicate_policy_is_passed_through(tmp_path):
    p = str(tmp_path / "dup.tar")
    write_shard(p, [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    with pytest.raises(SampleLayoutError):
        build_index([p], str(tmp_path / "i.json"))
    report = build_index([p], str(tmp_path / "i.json"), duplicates="split")
    assert report.samples == 3


def test_brace_patterns_and_listfiles(shards, tmp_path):
    d = os.path.dirname(shards[0])
    pattern = os.path.join(d, "synth-{000000..000003}.tar")
    assert expand_shard_args([pattern]) == shards
    listfile = tmp_path / "list.txt"
    listfile.write_text("# shards\n" + "\n".join(shards[:2]) + "\n\n")
    assert expand_shard_args([f"@{listfile}", shards[3]]) == [*shards[:2], shards[3]]


def test_an_index_among_the_arguments_stands_for_its_shards(shards, tmp_path):
    """``wids index create old.json -o train.json``: a reference description (relative URLs,
    no member offsets) gets its member tables; it was scanned as a tar (TarFormatError)."""
    import subprocess
    import sys

    d = os.path.dirname(shards[0])
    ref = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "shardlist": [{"url": os.path.basename(p), "nsamples": 30} for p in shards[1:3]],
    }
    (tmp_path / "old.json").write_text(json.dumps({**ref, "base": d}))
    assert expand_shard_args([str(tmp_path / "old.json"), shards[0]]) == [*shards[1:3], shards[0]]
    r = subprocess.run(
        [sys.executable, "-m", "wids", "index", "create", "old.json", "-o", "new.json", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    idx = open_index(str(tmp_path / "new.json"))
    try:
        assert [s.url for s in idx.shards] == shards[1:3]
        assert [idx.members(k) for k in range(2)] == [tarfile_table(p) for p in shards[1:3]]
    finally:
        idx.close()


def test_remote_build_streams_each_shard_once(shards, tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    urls = []
    for p in shards:
        url = f"memory://buildtest/{os.path.basename(p)}"
        fs.pipe(url, open(p, "rb").read())
        urls.append(url)
    report = build_index(urls, str(tmp_path / "remote.json"), jobs=4)
    assert report.samples == 120
    # Small members: a probe of the first bytes (to choose streaming over header hopping),
    # then one sequential pass, nothing more.
    assert report.bytes_read == report.bytes + 4 * PROBE
    idx = open_index(str(tmp_path / "remote.json"))
    assert [s.url for s in idx.shards] == urls
    for k, p in enumerate(shards):
        assert idx.members(k) == tarfile_table(p)
    idx.close()


def test_a_second_build_of_the_same_index_is_refused_while_one_runs(shards, tmp_path):
    from wids.errors import LockTimeoutError
    from wids.lock import FileLock

    out = str(tmp_path / "idx.json")
    with FileLock(out + ".lock"):
        with pytest.raises(LockTimeoutError):
            build_index(shards, out)
    assert build_index(shards, out).shards == 4


def test_incremental_rebuild_reuses_file_url_shards(shards, tmp_path):
    urls = [f"file://{p}" for p in shards]
    out = str(tmp_path / "idx.json")
    assert build_index(urls, out).scanned == 4
    again = build_index(urls, out)
    assert (again.scanned, again.reused) == (0, 4)


def _two_shards(d):
    """Two shards of the same size whose members have other names."""
    paths = [str(d / "a.tar"), str(d / "b.tar")]
    for p, prefix in zip(paths, "ab", strict=True):
        write_shard(p, [(f"{prefix}{i:03d}.bin", b"z" * 600) for i in range(5)])
    assert os.path.getsize(paths[0]) == os.path.getsize(paths[1])
    return paths


def test_incremental_rebuild_rescans_a_swap_with_restored_mtime(tmp_path):
    a, b = _two_shards(tmp_path)
    out = str(tmp_path / "idx.json")
    build_index([a, b], out)
    st = os.stat(b)
    shutil.copyfile(a, b)  # a's bytes at b, b's size and mtime
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = build_index([a, b], out)
    assert (report.scanned, report.reused) == (1, 1)  # was (0, 2): b kept its stale table
    idx = open_index(out)
    assert idx.members(1) == tarfile_table(b) and idx.members(1).key(0) == "a000"
    idx.close()
