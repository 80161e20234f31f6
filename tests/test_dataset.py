"""ShardListDataset on local files and in-memory filesystems; tarfile is the oracle."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import time
import typing
import warnings

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from tar_oracle import dataset_samples, strip_meta
from tarfixtures import FIXTURES

from wids import RetryPolicy, ShardListDataset, build_index
from wids.errors import IndexFormatError, IndexMismatchError, OfflineError, ShardNotFoundError
from wids.synth import write_dataset, write_shard


class CountingMemFS(MemoryFileSystem):
    """``memory://`` under another protocol, counting every call that reaches storage."""

    protocol = ("countmem",)
    calls: list[tuple] = []

    def cat_file(self, path, start=None, end=None, **kw):
        type(self).calls.append(("cat_file", path, start, end))
        return super().cat_file(path, start=start, end=end, **kw)

    def info(self, path, **kw):
        type(self).calls.append(("info", path))
        return super().info(path, **kw)

    def open(self, path, mode="rb", **kw):
        if "r" in mode:
            type(self).calls.append(("open", path))
        return super().open(path, mode, **kw)


fsspec.register_implementation("countmem", CountingMemFS, clobber=True)

NS, NSAMPLES = 4, 30


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    return write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, extra_fields=True)


@pytest.fixture(scope="module")
def oracle(shards):
    return dataset_samples(shards)


@pytest.fixture(scope="module")
def json_index(shards, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("idx") / "train.json")
    build_index(shards, out, name="train")
    return out


@pytest.fixture()
def counting(shards):
    fs = fsspec.filesystem("countmem")
    urls = []
    for p in shards:
        url = f"countmem://bucket/{os.path.basename(p)}"
        with open(p, "rb") as f:
            fs.pipe_file(url, f.read())
        urls.append(url)
    CountingMemFS.calls.clear()
    return urls


def _check_all(ds, oracle):
    assert len(ds) == len(oracle)
    for i in range(len(ds)):
        assert strip_meta(ds[i]) == oracle[i], i
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    for k in range(0, len(order), 17):
        batch = order[k : k + 17]
        got = ds.__getitems__(batch)
        assert [strip_meta(s) for s in got] == [oracle[i] for i in batch]
        assert [s["__index__"] for s in got] == batch


def test_list_of_dicts_matches_tarfile(shards, oracle):
    ds = ShardListDataset([{"url": p, "nsamples": NSAMPLES} for p in shards], transformations=[])
    _check_all(ds, oracle)


def test_json_index_matches_tarfile(json_index, oracle):
    ds = ShardListDataset(json_index, transformations=[])
    _check_all(ds, oracle)
    assert ds.name == "train"
    assert ds[0]["__dataset__"] == "train"


def test_sqlite_index_matches_tarfile(shards, oracle, tmp_path):
    pytest.importorskip("wids.index.sqlitereader")
    out = str(tmp_path / "train.sqlite")
    build_index(shards, out)
    _check_all(ShardListDataset(out, transformations=[]), oracle)


def test_brace_pattern_and_url_list(shards, oracle, tmp_path):
    d = os.path.dirname(shards[0])
    ds = ShardListDataset(f"{d}/synth-{{000000..{NS - 1:06d}}}.tar", transformations=[])
    _check_all(ds, oracle)
    ds2 = ShardListDataset(list(shards), transformations=[], cache_dir=str(tmp_path))
    assert ds2.lengths == [NSAMPLES] * NS
    assert strip_meta(ds2[NSAMPLES + 1]) == oracle[NSAMPLES + 1]


def test_memory_filesystem(shards, oracle):
    fs = fsspec.filesystem("memory")
    urls = []
    for p in shards:
        url = f"memory://wids-test/{os.path.basename(p)}"
        with open(p, "rb") as f:
            fs.pipe_file(url, f.read())
        urls.append(url)
    ds = ShardListDataset([{"url": u, "nsamples": NSAMPLES} for u in urls], transformations=[])
    _check_all(ds, oracle)
    assert ds[0]["__shard__"] == urls[0]


def test_one_request_per_sample(counting, oracle):
    ds = ShardListDataset(
        [{"url": u, "nsamples": NSAMPLES} for u in counting], transformations=[], cache_dir=None
    )
    len(ds)
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    for i in order[:40]:  # first touches scan the shards (no offsets in a list of dicts)
        ds[i]
    CountingMemFS.calls.clear()
    for i in order[40:]:
        assert strip_meta(ds[i]) == oracle[i]
    reads = [c for c in CountingMemFS.calls if c[0] == "cat_file"]
    assert len(reads) == len(order) - 40
    assert all(c[0] == "cat_file" for c in CountingMemFS.calls)  # never open(), never stat


def test_one_request_per_sample_with_offsets_index(counting, tmp_path, oracle):
    out = str(tmp_path / "i.json")
    build_index(counting, out)
    CountingMemFS.calls.clear()
    ds = ShardListDataset(out, transformations=[])
    order = list(range(len(ds)))
    random.Random(2).shuffle(order)
    for i in order:
        assert strip_meta(ds[i]) == oracle[i]
    reads = [c for c in CountingMemFS.calls if c[0] == "cat_file"]
    infos = [c for c in CountingMemFS.calls if c[0] == "info"]
    # verify: one stat per shard per process, then one read per sample (each read carries the
    # sample's member header, which is checked, so no separate header read)
    assert len(reads) == len(order)
    assert len(infos) == NS
    assert not [c for c in CountingMemFS.calls if c[0] == "open"]
    st = ds.stats
    assert st.samples == len(order) and st.requests == len(order) + NS
    CountingMemFS.calls.clear()
    ds2 = ShardListDataset(out, transformations=[], verify=False)
    ds2[5]
    assert [c[0] for c in CountingMemFS.calls] == ["cat_file"]


def test_getitems_chunked_batch_one_request_per_group(counting, tmp_path, oracle):
    out = str(tmp_path / "i.json")
    build_index(counting, out)
    ds = ShardListDataset(out, transformations=[], verify=False, merge_gap=0)
    # 32 samples from 4 shards: 8 contiguous samples per shard, shuffled (chunked order)
    batch = [s * NSAMPLES + 10 + j for s in range(4) for j in range(8)]
    random.Random(3).shuffle(batch)
    CountingMemFS.calls.clear()
    got = ds.__getitems__(batch)
    assert [strip_meta(s) for s in got] == [oracle[i] for i in batch]
    assert len([c for c in CountingMemFS.calls if c[0] == "cat_file"]) == 4
    # two separate groups per shard: at most one request per group
    batch = [s * NSAMPLES + j for s in range(4) for j in (0, 1, 2, 20, 21)]
    CountingMemFS.calls.clear()
    got = ds.__getitems__(batch)
    assert [strip_meta(s) for s in got] == [oracle[i] for i in batch]
    assert len([c for c in CountingMemFS.calls if c[0] == "cat_file"]) == 8
    # a large merge_gap joins the groups of a shard
    ds.merge_gap = 1 << 30
    CountingMemFS.calls.clear()
    assert [strip_meta(s) for s in ds.__getitems__(batch)] == [oracle[i] for i in batch]
    assert len([c for c in CountingMemFS.calls if c[0] == "cat_file"]) == 4


def test_getitems_duplicates_and_negative(json_index, oracle):
    ds = ShardListDataset(json_index, transformations=[])
    got = ds.__getitems__([5, 5, -1, 0])
    assert [strip_meta(s) for s in got] == [oracle[5], oracle[5], oracle[-1], oracle[0]]
    assert got[2]["__index__"] == len(oracle) - 1
    assert ds.__getitems__([]) == []
    with pytest.raises(IndexError):
        ds.__getitems__([0, len(oracle)])


def test_decoded_sample(json_index):
    s = ShardListDataset(json_index)[3]
    assert isinstance(s[".cls"], int) and s[".json"]["key"] == s["__key__"]
    assert s[".txt.gz"] == f"sample {s['__key__']}"
    assert s[".jpg"].size == (64, 64)
    s = ShardListDataset(json_index, transformations="rgb8")[3]
    assert s[".jpg"].shape == (64, 64, 3)


def test_verify_detects_changed_shard(tmp_path):
    paths = write_dataset(str(tmp_path / "d"), shards=2, samples_per_shard=5, real_images=False)
    out = str(tmp_path / "i.json")
    build_index(paths, out)
    write_shard(paths[1], [("a.cls", b"1")] * 2)  # replaced after indexing
    ds = ShardListDataset(out, transformations=[])
    ds[0]
    with pytest.raises(IndexMismatchError) as e:
        ds[6]
    assert "synth-000001.tar" in str(e.value)
    ds = ShardListDataset(out, transformations=[], verify=False)
    with pytest.raises(Exception):  # noqa: B017 - whatever the stale offsets lead to
        ds[6]


def test_list_with_wrong_nsamples(tmp_path):
    paths = write_dataset(str(tmp_path / "d"), shards=1, samples_per_shard=5, real_images=False)
    ds = ShardListDataset([{"url": paths[0], "nsamples": 7}], transformations=[])
    with pytest.raises(IndexMismatchError, match="5 samples"):
        ds[0]


def test_missing_shard(tmp_path):
    ds = ShardListDataset([{"url": str(tmp_path / "nope.tar"), "nsamples": 3}])
    with pytest.raises(ShardNotFoundError):
        ds[0]


@pytest.mark.skipif(os.sep != "/", reason="a backslash is a separator there")
@pytest.mark.parametrize("name", ["C:\\data\\train.json", "C:/data/train.json", "data\\train.json"])
def test_a_windows_path_is_named_so(tmp_path, monkeypatch, name):
    """Typed as on Windows: the error says so, and a path of this system still only "no such
    file" (the file named like that is read, as any other)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ShardNotFoundError, match="Windows-style path") as e:
        len(ShardListDataset(name))
    assert e.value.shard == str(tmp_path / name)
    desc = {"wids_version": 1, "shardlist": [{"url": "shards\\a.tar", "nsamples": 1}]}
    (tmp_path / "i.json").write_text(json.dumps(desc))
    with pytest.raises(ShardNotFoundError, match="Windows-style path"):
        ShardListDataset("i.json")[0]
    with pytest.raises(ShardNotFoundError) as e:
        len(ShardListDataset("data/train.json"))
    assert "Windows" not in str(e.value)


def test_a_mistyped_path_says_what_is_there(tmp_path, monkeypatch):
    """A typo'd name: the one close name in its folder, or that the folder is missing too;
    no guess among many alike (shards of one pattern)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.json").write_text("{}")
    for i in range(3):
        (tmp_path / "data" / f"train-{i:06d}.tar").write_bytes(b"")
    cases = {
        "data/trian.json": "no such file (did you mean train.json?)",
        "dta/train.json": f"no such file (nor its folder {tmp_path / 'dta'})",
        "data/train-00000.tar": "no such file",
    }
    for name, message in cases.items():
        with pytest.raises(ShardNotFoundError) as e:
            len(ShardListDataset(name))
        assert str(e.value) == f"{tmp_path / name}: {message}"


@pytest.mark.parametrize("name", ["s3:/bucket/train.json", "https:/host/data/train-0.tar"])
def test_a_url_missing_a_slash_is_named_so(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ShardNotFoundError, match="URL missing a slash after its scheme") as e:
        len(ShardListDataset(name))
    assert e.value.shard == str(tmp_path / name)


def test_offline(counting):
    ds = ShardListDataset(
        [{"url": u, "nsamples": NSAMPLES} for u in counting], transformations=[], offline=True
    )
    with pytest.raises(OfflineError):
        ds[0]
    assert CountingMemFS.calls == []


def test_a_list_of_paths_is_a_list_of_shards(shards, oracle):
    """``sorted(Path("data").glob("*.tar"))``, as a list of str is; it was taken for a list of
    shard dicts (IndexFormatError: expected a JSON object)."""
    from pathlib import Path

    ds = ShardListDataset([Path(p) for p in shards], transformations=[])
    assert [strip_meta(ds[i]) for i in range(len(ds))] == oracle


def test_stream_input(shards, oracle):
    desc = {"wids_version": 1, "shardlist": [{"url": p, "nsamples": NSAMPLES} for p in shards]}
    ds = ShardListDataset(io.StringIO(json.dumps(desc)), transformations=[])
    assert len(ds) == len(oracle)
    assert strip_meta(ds[NSAMPLES * 2 + 3]) == oracle[NSAMPLES * 2 + 3]


def test_constructor_does_no_io_and_validates(tmp_path):
    ds = ShardListDataset(str(tmp_path / "does-not-exist.json"))
    assert repr(ds)
    with pytest.raises(ShardNotFoundError):
        len(ds)
    for bad in (
        {"access": "bogus"},
        {"lru_size": 0},
        {"merge_gap": -1},
        {"duplicates": "nope"},
        {"access": "shard"},  # needs cache_dir
        {"transformations": "bogus"},
    ):
        with pytest.raises(ValueError):
            ShardListDataset([], **bad)
    with pytest.raises(TypeError):
        ShardListDataset([], retry=3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"localname": lambda u: u},
        {"cache_size": 10},
        {"keep": True},
        {"options": {"bogus": 1}},
        {"allow_pickle": True, "transformations": []},
    ],
)
def test_unsupported_parameters_warn(kwargs):
    with pytest.warns(UserWarning):
        ShardListDataset([], **kwargs)


def test_no_warning_for_defaults():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShardListDataset([], cache_dir="/nonexistent", access="range")


def test_options_name(shards):
    ds = ShardListDataset(
        [{"url": p, "nsamples": NSAMPLES} for p in shards], options={"name": "nm"}
    )
    assert ds.name == "nm" and ds.components[0].name == "nm"


def test_constructor_arguments_are_attributes(json_index, tmp_path):
    policy = RetryPolicy(attempts=2)
    kwargs = {
        "cache_size": 1 << 20,
        "cache_dir": str(tmp_path),
        "lru_size": 3,
        "keep": True,
        "base": str(tmp_path),
        "dataset_name": "nm",
        "storage_options": {"anon": True},
        "access": "auto",
        "verify": False,
        "retry": policy,
        "merge_gap": 7,
        "offline": True,
        "duplicates": "split",
        "allow_pickle": True,
        "promote_share": 0.5,
        "allow_local_shards": True,
    }
    ds = ShardListDataset(json_index, transformations="PIL", **kwargs)
    assert {k: getattr(ds, k) for k in kwargs} == kwargs
    assert ds.url_map == () and ds.transformations
    ds.storage_options = {"anon": False}
    ds.retry = RetryPolicy(attempts=1)
    ds.verify = True
    assert ds.storage_options == {"anon": False} and ds.retry.attempts == 1 and ds.verify
    again = pickle.loads(pickle.dumps(ds))
    assert again.storage_options == {"anon": False} and again.retry.attempts == 1


def test_pickle_at_any_point(json_index, oracle):
    ds = ShardListDataset(json_index, transformations=[])
    ds2 = pickle.loads(pickle.dumps(ds))  # before anything is loaded
    assert strip_meta(ds2[1]) == oracle[1]
    ds[0]
    ds.__getitems__([1, 40, 100])
    state_before = dict(ds.__dict__)
    ds3 = pickle.loads(pickle.dumps(ds))  # with open readers
    assert ds.__dict__.keys() == state_before.keys() and ds._pool._local  # self not mutated
    assert strip_meta(ds3[-1]) == oracle[-1]
    assert strip_meta(ds[-1]) == oracle[-1]


def test_pickle_keeps_scanned_tables(shards):
    ds = ShardListDataset([{"url": p, "nsamples": NSAMPLES} for p in shards], transformations=[])
    ds[0]
    ds2 = pickle.loads(pickle.dumps(ds))
    assert 0 in ds2._catalog._members  # no second scan in workers


def test_components_with_subdatasets(shards, tmp_path):
    desc = {
        "wids_version": 1,
        "name": "main",
        "shardlist": [{"url": shards[0], "nsamples": NSAMPLES}],
        "datasets": [
            {"name": "a", "weight": 0.5, "shardlist": [{"url": shards[1], "nsamples": NSAMPLES}]},
            {"name": "b", "shardlist": [{"url": p, "nsamples": NSAMPLES} for p in shards[2:]]},
        ],
    }
    path = tmp_path / "d.json"
    path.write_text(json.dumps(desc))
    ds = ShardListDataset(str(path), transformations=[])
    comps = [(c.name, c.weight, c.start, c.stop) for c in ds.components]
    assert comps == [
        ("main", None, 0, NSAMPLES),
        ("a", 0.5, NSAMPLES, 2 * NSAMPLES),
        ("b", None, 2 * NSAMPLES, 4 * NSAMPLES),
    ]
    assert [ds[i]["__dataset__"] for i in (0, NSAMPLES, 3 * NSAMPLES)] == ["main", "a", "b"]
    assert [s["dataset"] for s in ds.shards] == ["main", "a", "b", "b"]


def test_stats(json_index):
    ds = ShardListDataset(json_index, transformations=[])
    ds[0]
    ds[1]
    ds[NSAMPLES]
    st = ds.stats
    assert (st.samples, st.accesses, st.misses) == (3, 3, 2)
    assert ds.get_stats() == (3, 2)
    assert st.bytes_read > 0 and st.cache_hits == 0 and st.retries == 0


def test_access_shard_uses_cache(counting, tmp_path, oracle):
    pytest.importorskip("wids.cache.shards")
    out = str(tmp_path / "i.json")
    build_index(counting, out)
    ds = ShardListDataset(
        out, transformations=[], access="shard", cache_dir=str(tmp_path / "cache")
    )
    for i in (0, 1, NSAMPLES + 2):
        assert strip_meta(ds[i]) == oracle[i]
    CountingMemFS.calls.clear()
    assert strip_meta(ds[2]) == oracle[2]
    assert [c for c in CountingMemFS.calls if c[0] == "cat_file"] == []
    assert ds.stats.cache_hits == 4
    ds.close()


def test_int_like_indices(json_index, oracle):
    ds = ShardListDataset(json_index, transformations=[])
    assert strip_meta(ds[np.int64(3)]) == oracle[3]
    with pytest.raises(TypeError):
        ds[1.0]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_tar_format_matches_tarfile(name, tmp_path):
    """ustar, GNU, pax (long and non-ASCII names, links, empty members ...) read as tarfile does."""
    path = str(FIXTURES[name](tmp_path / f"{name}.tar"))
    expected = dataset_samples([path])
    ds = ShardListDataset([{"url": path, "nsamples": len(expected)}], transformations=[])
    assert len(ds) == len(expected)
    for i in range(len(ds)):
        assert strip_meta(ds[i]) == expected[i], i
    batch = list(range(len(ds)))[::-1]
    assert [strip_meta(s) for s in ds.__getitems__(batch)] == [expected[i] for i in batch]
    with pytest.raises(IndexError):
        ds[len(expected)]


def test_duplicates_policy_with_offsets_index_warns(json_index):
    ds = ShardListDataset(json_index, transformations=[], duplicates="split")
    with pytest.warns(UserWarning, match="duplicates='split' has no effect"):
        ds[0]


def test_duplicates_policy_applies_when_scanning(tmp_path):
    path = str(tmp_path / "dup.tar")
    write_shard(path, [("a.cls", b"1"), ("b.cls", b"2"), ("a.txt", b"x")])
    ds = ShardListDataset([{"url": path, "nsamples": 3}], transformations=[])
    with pytest.raises(Exception, match="reappears"):
        ds[0]
    ds = ShardListDataset([{"url": path, "nsamples": 3}], transformations=[], duplicates="split")
    assert [ds[i]["__key__"] for i in range(3)] == ["a", "b", "a"]
    assert ds[2][".txt"] == b"x"


def test_decode_error_names_shard_key_field(tmp_path):
    from wids.errors import DecodeError, UnsafeDecodeError

    path = str(tmp_path / "bad.tar")
    write_shard(path, [("k1.json", b"{oops"), ("k2.pkl", b"\x80\x04K\x01."), ("k3.txt", b"ok")])
    ds = ShardListDataset([{"url": path, "nsamples": 3}])
    with pytest.raises(DecodeError) as e:
        ds[0]
    assert e.value.shard == path and "'k1'" in str(e.value) and ".json" in str(e.value)
    with pytest.raises(UnsafeDecodeError, match="allow_pickle=True"):
        ds[1]
    assert ShardListDataset([{"url": path, "nsamples": 3}], allow_pickle=True)[1][".pkl"] == 1
    assert ds[2][".txt"] == "ok"


# -- a shard is checked against the index on first touch (issue 10, items 4 and 13) ----------


def _label_shard(path, prefix: str, labels) -> str:
    """A shard of samples ``{prefix}{i:04d}`` with a ``.cls`` label and a fixed-size ``.bin``."""
    members = []
    for i, label in enumerate(labels):
        members += [(f"{prefix}{i:04d}.cls", b"%d\n" % label), (f"{prefix}{i:04d}.bin", b"x" * 700)]
    write_shard(str(path), members)
    return str(path)


def _rewrite_later(path, prefix: str, labels) -> None:
    """Rewrite a shard as someone would after indexing: same size, one label changed."""
    before = os.stat(path)
    time.sleep(0.05)  # a later write; file systems stamp mtimes in ticks of a few ms
    _label_shard(path, prefix, labels)
    assert os.stat(path).st_size == before.st_size
    assert os.stat(path).st_mtime_ns != before.st_mtime_ns


@pytest.mark.parametrize("backend", ["json", "sqlite"])
def test_same_size_rewrite_after_indexing_is_an_error(tmp_path, backend):
    a = _label_shard(tmp_path / "a.tar", "a", [0, 1, 2])
    b = _label_shard(tmp_path / "b.tar", "b", [3, 4, 5])
    out = str(tmp_path / f"i.{backend}")
    build_index([a, b], out)
    _rewrite_later(b, "b", [3, 7, 5])
    ds = ShardListDataset(out, transformations=[])
    assert ds[1][".cls"] == b"1\n"
    with pytest.raises(IndexMismatchError) as e:
        ds[4]  # was served as b"7\n"
    msg = str(e.value)
    # the recorded md5 tells a rewrite from a copy with new timestamps (cp -r)
    assert e.value.shard == b and "its contents changed" in msg and "wids index create" in msg
    assert "--full" in msg


def test_same_size_swap_with_restored_mtime_is_an_error(tmp_path):
    a = _label_shard(tmp_path / "a.tar", "a", [0, 1, 2])
    b = _label_shard(tmp_path / "b.tar", "b", [3, 4, 5])
    out = str(tmp_path / "i.json")
    build_index([a, b], out)
    st = os.stat(b)
    shutil.copyfile(a, b)  # another shard's bytes, same size ...
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the recorded mtime
    ds = ShardListDataset(out, transformations=[])
    with pytest.raises(IndexMismatchError, match="the header names 'a0002.cls'") as e:
        ds[3]  # was served as a's first sample
    assert e.value.shard == b
    # verify=False skips the first-touch checks; a read still checks its members' headers
    # (before, it returned a's bytes as sample b0002)
    with pytest.raises(IndexMismatchError, match="the header names 'a0002.cls'"):
        ShardListDataset(out, transformations=[], verify=False)[5]


def test_dataloader_workers_check_shards_on_first_touch(tmp_path):
    torch = pytest.importorskip("torch")
    a = _label_shard(tmp_path / "a.tar", "a", [0, 1, 2])
    out = str(tmp_path / "i.json")
    build_index([a], out)
    ds = ShardListDataset(out, transformations=[])
    assert ds[1][".cls"] == b"1\n"  # checked and opened in the parent
    _rewrite_later(a, "a", [0, 7, 2])
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    with pytest.raises(IndexMismatchError, match="a.tar"):
        list(loader)


def test_index_with_edited_urls_reads_a_mirror_with_the_same_files(tmp_path):
    src, mirror = tmp_path / "src", tmp_path / "mirror"
    src.mkdir()
    mirror.mkdir()
    paths = [_label_shard(src / f"s{k}.tar", f"s{k}-", [k, k + 1]) for k in range(3)]
    out = src / "i.json"
    build_index(paths, str(out))
    for p in paths:
        shutil.copy2(p, mirror)  # same bytes and times (cp -p, rsync -a)
    doc = json.loads(out.read_text())
    for entry in doc["shardlist"]:
        entry["url"] = str(mirror / entry["url"])
    out.write_text(json.dumps(doc))  # was: "stale sidecar: its url is ..."
    ds = ShardListDataset(str(out), transformations=[])
    assert [ds[i][".cls"] for i in range(6)] == [b"%d\n" % v for v in (0, 1, 1, 2, 2, 3)]
    assert ds[0]["__shard__"] == str(mirror / "s0.tar")


def test_url_map_reads_a_mirror(tmp_path):
    src, mirror = tmp_path / "src", tmp_path / "mirror"
    src.mkdir()
    mirror.mkdir()
    paths = [_label_shard(src / f"s{k}.tar", f"s{k}-", [k, k + 1]) for k in range(3)]
    out = str(tmp_path / "i.json")
    build_index(paths, out)
    for p in paths:
        shutil.copyfile(p, mirror / os.path.basename(p))  # new mtimes: another store's
    url_map = {f"{src}/": f"{mirror}/", "/nowhere/longer/": "/elsewhere/"}
    for index in (out, [{"url": p, "nsamples": 2} for p in paths]):
        ds = ShardListDataset(index, transformations=[], url_map=url_map)
        assert [ds[i][".cls"] for i in range(6)] == [b"%d\n" % v for v in (0, 1, 1, 2, 2, 3)]
        assert ds[5]["__shard__"] == str(mirror / "s2.tar")
    # the longest prefix wins
    url_map = {f"{tmp_path}/": "/nowhere/", f"{src}/": f"{mirror}/"}
    assert ShardListDataset(out, transformations=[], url_map=url_map)[0]["__key__"] == "s0-0000"
    # a mirror holding other bytes is still caught, by size or by a member's header
    shutil.copyfile(paths[0], mirror / "s1.tar")
    ds = ShardListDataset(out, transformations=[], url_map={f"{src}/": f"{mirror}/"})
    with pytest.raises(IndexMismatchError, match="the header names"):
        ds[2]


@pytest.mark.parametrize(
    "url_map, error, match",
    [
        ({"relative/": "/abs/"}, ValueError, "absolute"),
        ({"/abs/": "s3://bucket"}, ValueError, "in '/' or neither"),
        ({"/a/": "/b/", "file:///a/": "/c/"}, ValueError, "given twice"),
        ({"/a/": 3}, TypeError, "str -> str"),
        (["/a/", "/b/"], TypeError, "dict of prefix"),
    ],
)
def test_url_map_is_validated_in_the_constructor(tmp_path, url_map, error, match):
    with pytest.raises(error, match=match):
        ShardListDataset(str(tmp_path / "missing.json"), url_map=url_map)


def test_damaged_member_table_error_says_how_to_repair(tmp_path):
    a = _label_shard(tmp_path / "a.tar", "a", [0, 1, 2])
    out = tmp_path / "i.json"
    build_index([a], str(out))
    sidecar = tmp_path / json.loads(out.read_text())["shardlist"][0]["members"]
    sidecar.write_text(sidecar.read_text()[:-20])
    with pytest.raises(IndexFormatError) as e:
        ShardListDataset(str(out), transformations=[])[0]
    assert "not valid JSON" in str(e.value) and "wids index create" in str(e.value)
    assert "--full" in str(e.value)


def test_scanned_shard_from_the_scan_cache_is_checked_on_first_touch(tmp_path):
    a = _label_shard(tmp_path / "a.tar", "a", [0, 1, 2])
    b = _label_shard(tmp_path / "b.tar", "b", [3, 4, 5])
    shards = [{"url": b, "nsamples": 3}]  # a reference list: members scanned, kept in the cache
    cache = str(tmp_path / "cache")
    assert ShardListDataset(shards, transformations=[], cache_dir=cache)[0]["__key__"] == "b0000"
    st = os.stat(b)
    shutil.copyfile(a, b)
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))  # the scan record's fingerprint holds
    ds = ShardListDataset(shards, transformations=[], cache_dir=cache)
    with pytest.raises(IndexMismatchError, match="the header names 'a0002.cls'"):
        ds[0]


# -- a torch Dataset when torch is installed, and a light ``import wids`` --------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports this checkout's ``wids``."""
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=REPO
    )


def _annotated(a: ShardListDataset[dict], b: ShardListDataset[list[dict]]) -> None:
    """Annotations as the reference's users write them (evaluated by ``get_type_hints``)."""


def test_is_a_generic_torch_dataset(json_index, oracle):
    torch = pytest.importorskip("torch")
    ds = ShardListDataset(json_index, transformations=[])
    assert isinstance(ds, torch.utils.data.Dataset)
    hints = typing.get_type_hints(_annotated)
    assert typing.get_origin(hints["a"]) is ShardListDataset
    assert typing.get_args(hints["b"]) == (list[dict],)
    typed = ShardListDataset[dict](json_index, transformations=[])
    assert type(typed) is ShardListDataset and isinstance(typed, torch.utils.data.Dataset)
    again = pickle.loads(pickle.dumps(typed))
    assert strip_meta(again[3]) == oracle[3]


def test_add_gives_a_concat_dataset_read_by_spawned_workers(json_index, shards, oracle):
    torch = pytest.importorskip("torch")
    first = ShardListDataset(json_index, transformations=[])
    second = ShardListDataset(shards[:1], transformations=[])
    both = first + second
    assert isinstance(both, torch.utils.data.ConcatDataset)
    assert len(both) == len(oracle) + NSAMPLES
    assert isinstance(both + first, torch.utils.data.ConcatDataset)
    loader = torch.utils.data.DataLoader(
        both,
        batch_size=16,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=list,
    )
    got = [strip_meta(s) for batch in loader for s in batch]
    assert got == oracle + oracle[:NSAMPLES]


def test_import_wids_imports_torch_only_when_the_dataset_is_used():
    code = (
        "import sys, wids\n"
        "names = dir(wids)\n"
        "assert 'torch' not in sys.modules and 'PIL' not in sys.modules\n"
        "assert 'ShardListDataset' in names and 'DatasetStats' in names, names\n"
        "import torch.utils.data as tud\n"
        "assert issubclass(wids.ShardListDataset, tud.Dataset)\n"
        "assert wids.ShardListDataset is wids.dataset.ShardListDataset\n"
        "assert dir(wids) == names\n"
    )
    r = _run_python(code)
    assert r.returncode == 0, r.stderr


def test_works_without_torch(shards, oracle, tmp_path):
    """The core and the dataset with torch unimportable; only ``+`` needs it."""
    code = (
        "import json, pickle, sys\n"
        "sys.modules['torch'] = None\n"
        "import wids\n"
        "import wids.index, wids.tar\n"
        "shards, out = json.loads(sys.argv[1]), sys.argv[2]\n"
        "wids.build_index(shards, out)\n"
        "ds = wids.ShardListDataset[dict](out, transformations=[])\n"
        "ds = pickle.loads(pickle.dumps(ds))\n"
        "assert wids.ShardListDataset[list[dict]] is not None\n"
        "try:\n"
        "    ds + ds\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('+ without torch')\n"
        "print(json.dumps([ds[i]['__key__'] for i in range(len(ds))]))\n"
    )
    r = _run_python(code, json.dumps(shards), str(tmp_path / "i.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [s["__key__"] for s in oracle]
