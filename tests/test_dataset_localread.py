"""The fast path of local shards (``wids.dataset.localread``): same samples, counts and checks."""

from __future__ import annotations

import os
import shutil
import sys

import fsspec
import pytest
from forked import in_fork
from tar_oracle import dataset_samples, strip_meta
from tarfixtures import make_samples, write_shard

from wids import IndexMismatchError, ShardListDataset, ShortReadError, build_index
from wids.dataset.localread import LOCAL_GAP
from wids.dataset.tables import MemberTable
from wids.synth import write_dataset

NS, NSAMPLES = 3, 10


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Local shards and a JSON index of them."""
    d = tmp_path_factory.mktemp("localread")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, real_images=False)
    index = str(d / "train.json")
    build_index(paths, index, name="train")
    return {"dir": d, "paths": paths, "index": index, "oracle": dataset_samples(paths)}


def _span(ds: ShardListDataset, i: int) -> tuple[int, int]:
    """The bytes a read of sample ``i`` takes: its members and the first one's tar header."""
    _, shard, j = ds._catalog.locate(i)
    start, end = ds._pool._tables[shard].span(j)
    return start - 512, end


def test_a_local_batch_reads_its_samples_bytes_only(local):
    """Samples of a shard farther apart than a tar header share no read: no gap bytes copied.

    Each read starts at its sample's first tar header (every member's header is checked).

    Before, a local batch was merged as a remote one (``merge_gap``, 64 KiB): samples 0, 2
    and 5 of a shard were one ``pread`` with samples 1, 3 and 4 in it.
    """
    ds = ShardListDataset(local["index"], transformations=[])
    batch = [5, 0, 2, NSAMPLES + 3, NSAMPLES + 4]  # two runs apart in shard 0, one run in 1
    ds[0], ds[NSAMPLES]  # opened and checked: the batch's reads alone are counted below
    stats = ds._catalog.store.stats
    requests, nbytes = stats.requests, stats.bytes_read
    got = ds.__getitems__(batch)
    assert [strip_meta(s) for s in got] == [local["oracle"][i] for i in batch]
    assert [s["__index__"] for s in got] == batch
    spans = {i: _span(ds, i) for i in batch}
    assert spans[NSAMPLES + 4][0] - spans[NSAMPLES + 3][1] <= LOCAL_GAP  # one pread
    assert spans[2][0] - spans[0][1] > LOCAL_GAP  # not merged locally (64 KiB remotely)
    assert stats.requests - requests == 4
    whole = spans[NSAMPLES + 4][1] - spans[NSAMPLES + 3][0]
    assert stats.bytes_read - nbytes == sum(b - a for a, b in map(spans.get, (0, 2, 5))) + whole
    ds.close()


def test_fast_path_counts_as_the_other_reads(local):
    ds = ShardListDataset(local["index"], transformations=[])
    ds[0], ds[1], ds[NSAMPLES + 1]  # two shards opened: two misses
    ds.__getitems__([2, 2 * NSAMPLES, 2 * NSAMPLES + 5, NSAMPLES])  # shard 2 opened in a batch
    assert ds.get_stats() == (7, 3)
    assert ds.stats.samples == 7
    ds.close()


def test_every_sample_of_every_order_and_batch_is_the_tars(local):
    ds = ShardListDataset(local["index"], transformations=[])
    n = len(ds)
    order = [(7 * k + 3) % n for k in range(n)] + [n - 1, -1, -n, 4, 4]
    singles = [ds[i] for i in order]
    assert [strip_meta(s) for s in singles] == [local["oracle"][i % n] for i in order]
    assert [s["__index__"] for s in singles] == [i % n for i in order]
    assert ds.__getitems__(order) == singles
    with pytest.raises(IndexError):
        ds[n]
    with pytest.raises(IndexError):
        ds.__getitems__([0, -n - 1])
    ds.close()


def _copy(local, tmp_path) -> tuple[list[str], str]:
    paths = [str(shutil.copy(p, tmp_path / os.path.basename(p))) for p in local["paths"]]
    index = str(tmp_path / "copy.json")
    build_index(paths, index, name="copy")
    return paths, index


def test_a_shard_changed_after_it_opened_raises_not_a_short_sample(local, tmp_path):
    paths, index = _copy(local, tmp_path)
    ds = ShardListDataset(index, transformations=[])
    ds[0]
    with open(paths[0], "r+b") as f:  # the fast path's pread comes back short
        f.truncate(_span(ds, 3)[0] + 1)
    with pytest.raises(Exception) as err:
        ds[3]
    assert not isinstance(err.value, (KeyError, IndexError, AssertionError))
    with pytest.raises(type(err.value)):
        ds.__getitems__([1, 3])
    ds.close()


def test_a_forked_child_checks_its_local_shards_again(local, tmp_path):
    """The first-touch check runs once per shard and process, fast path or not."""
    paths, index = _copy(local, tmp_path)
    ds = ShardListDataset(index, transformations=[])
    ds[0], ds.__getitems__([1, 2])  # shard 0 opened and on the fast path in the parent

    def child() -> str:
        with open(paths[0], "ab") as f:  # another size: not the shard the index describes
            f.write(b"\0" * 1024)
        answers = []
        for read in (lambda: ds[3], lambda: ds.__getitems__([4])):
            try:
                read()
                answers.append("read")
            except IndexMismatchError:
                answers.append("mismatch")
        return " ".join(answers)

    assert in_fork(child) == "mismatch mismatch"
    ds.close()


def test_local_and_remote_reads_build_the_same_sample_dicts(local):
    """The local fast path's shard table is a ``MemberTable``: samples as remote reads build them.

    (``ds[i]`` of a local shard builds its dict inline: see the next test.)
    """
    fs = fsspec.filesystem("memory")
    infos = []
    for p in local["paths"]:
        url = f"memory://wids-localread/{os.path.basename(p)}"
        with open(p, "rb") as f:
            fs.pipe_file(url, f.read())
        infos.append({"url": url, "nsamples": NSAMPLES})
    remote = ShardListDataset(infos, transformations=[])
    ds = ShardListDataset(local["index"], transformations=[])
    order = [3, NSAMPLES + 7, 2 * NSAMPLES, 1]
    for got, want in zip([ds[i] for i in order], [remote[i] for i in order], strict=True):
        assert list(got.items())[:-3] == list(want.items())[:-3]  # fields, key, index in order
        assert list(got)[-3:] == list(want)[-3:] == ["__shard__", "__shardindex__", "__dataset__"]
    tables = ds._pool._tables
    assert all(tables[s] is ds._pool.fast[s] for s in ds._pool.fast)  # one table per shard
    assert isinstance(ds._pool.fast[0], MemberTable)
    assert type(ds._pool.fast[0]).sample is MemberTable.sample
    ds.close()
    remote.close()


def test_ds_i_s_inlined_sample_is_the_tables(local):
    """``LocalShard.read`` (``ds[i]``) builds its dict inline: the same as ``MemberTable.sample``.

    Batches of adjacent samples are built by ``MemberTable.sample``; every sample, both ways.
    """
    ds = ShardListDataset(local["index"], transformations=[])
    n = len(ds)
    for i in range(0, n - 1, 2):
        pair = ds.__getitems__([i, i + 1])  # adjacent: one pread, MemberTable.sample
        for got, want in zip([ds[i], ds[i + 1]], pair, strict=True):
            assert list(got.items()) == list(want.items())
    ds.close()


def _layouts(tmp_path):
    """Shards of every layout ``LocalShard.read`` tells apart, and their samples by tarfile."""
    shards = {
        "one": make_samples(5, fields=(".jpg",)),
        "two": make_samples(5, fields=(".cls", ".jpg"), prefix="日本/"),
        "three": make_samples(5, fields=(".cls", ".jpg", ".json")),
        "four": make_samples(5, fields=(".cls", ".jpg", ".json", ".txt")),
        "mixed": make_samples(3, fields=(".jpg", ".cls")) + make_samples(3, start=3),
        "order": make_samples(2, fields=(".cls", ".jpg"))
        + make_samples(2, fields=(".jpg", ".cls"), start=2),
    }
    paths = [str(write_shard(tmp_path / f"{name}.tar", m)) for name, m in shards.items()]
    index = str(tmp_path / "layouts.json")
    build_index(paths, index)
    return index, paths


def test_ds_i_is_the_tables_sample_for_every_layout(tmp_path):
    """One to four fields a sample, fields changing from sample to sample, keys not ASCII.

    Shards whose samples all have the same 1-3 fields in order build their dict as one display
    (``LocalShard.names``); the others field by field. Both must be ``MemberTable.sample``'s.
    """
    index, paths = _layouts(tmp_path)
    ds = ShardListDataset(index, transformations=[])
    n = len(ds)
    got = [ds[i] for i in range(n)]
    pairs = [s for i in range(0, n - 1, 2) for s in ds.__getitems__([i, i + 1])]
    if n % 2:
        pairs += ds.__getitems__([n - 2, n - 1])[1:]
    assert [list(s.items()) for s in got] == [list(s.items()) for s in pairs]
    names = [ds._pool.fast[s].names for s in range(len(paths))]
    assert names == [(".jpg",), (".cls", ".jpg"), (".cls", ".jpg", ".json"), (), (), ()]
    assert (
        got[5]["__key__"] == "日本/000000"
        and got[5][".jpg"] == make_samples(1, fields=(".cls", ".jpg"), prefix="日本/")[1][1]
    )
    ds.close()


def test_ds_i_of_an_open_local_shard_is_four_python_calls(local):
    """The hot path's depth: ``__getitem__``, ``locate``, ``LocalShard.read``, the descriptor's
    ``pread``; before, ``MemberTable.sample`` was a fifth (~5% of a read). Its ASCII key is a
    slice of the table's keys as one str (was a ``bytes.decode`` a sample)."""
    ds = ShardListDataset(local["index"], transformations=[])
    ds[1], ds[3]  # opened and checked; its descriptor taken
    calls: list[str] = []

    builtins: list[str] = []

    def profile(frame, event, arg):  # noqa: ANN001, ANN202 - sys.setprofile's signature
        if event == "call":
            calls.append(frame.f_code.co_name)
        elif event == "c_call":
            builtins.append(arg.__name__)

    sys.setprofile(profile)
    try:
        sample = ds[2]
    finally:
        sys.setprofile(None)
    assert sample["__index__"] == 2
    assert calls == ["__getitem__", "locate", "read", "pread"], calls
    assert "pread" in builtins and "decode" not in builtins  # an ASCII key is a str slice
    ds.close()


def test_fast_path_counts_outlive_close_and_a_failed_read_is_no_sample(local, tmp_path):
    """Each local shard counts its own reads; the pool adds them up, and keeps them on close."""
    paths, index = _copy(local, tmp_path)
    ds = ShardListDataset(index, transformations=[])
    ds[0], ds[1], ds.__getitems__([4, 5, 7])  # 4 and 5 share a pread
    ds.close()
    assert ds.get_stats() == (5, 1) and ds.stats.samples == 5
    ds[2]  # reopened after close: a miss
    with open(paths[0], "r+b") as f:
        f.truncate(_span(ds, 3)[0] + 1)
    with pytest.raises(ShortReadError):
        ds[3]
    assert ds.get_stats() == (7, 2) and ds.stats.samples == 6
    ds.close()
