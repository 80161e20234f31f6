"""The checks of a sample's member headers (``wids.dataset.tables``, ``wids.dataset.localread``).

Long names (over 100 bytes: in a GNU ``L`` or pax ``path`` record before the header, or a ustar
prefix) are compared too; a local sample is checked once per open file, and read again
without its header.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from tar_oracle import strip_meta
from tarfixtures import make_samples, write_shard

from wids import IndexMismatchError, ShardListDataset, build_index

LONG = "d/" * 60  # every key longer than a tar header's 100-byte name field
FIELDS = (".cls", ".txt")  # one byte, then a line naming the key: the same sizes every sample


def _swap_first_two(path: Path, members: list[tuple[str, bytes]], fmt: str) -> None:
    """Rewrite ``path`` with samples 0 and 1 in each other's place: the same size and mtime."""
    st = os.stat(path)
    k = len(FIELDS)
    write_shard(path, members[k : 2 * k] + members[:k] + members[2 * k :], format=fmt)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size


@pytest.mark.parametrize("fmt", ["gnu", "pax", "ustar"])
def test_long_named_samples_swapped_at_the_same_size_are_an_error(tmp_path: Path, fmt: str):
    """Keys alike in their first 100 bytes: only the ``L``/``path`` record (or, in ustar, the
    prefix) tells the two samples apart. Before, a long name was compared by size and offset
    only: ``ds[0]`` returned sample 1's bytes under sample 0's key."""
    members = make_samples(3, prefix=LONG, fields=FIELDS)
    path = write_shard(tmp_path / "a.tar", members, format=fmt)
    index = str(tmp_path / "i.json")
    build_index([str(path)], index)
    ds = ShardListDataset(index, transformations=[])
    assert ds[2][".cls"] == b"2"  # opened and checked before the swap, on another sample
    _swap_first_two(path, members, fmt)
    for read in (lambda: ds[0], lambda: ds.__getitems__([0, 1]), lambda: ds[1]):
        with pytest.raises(IndexMismatchError, match=r"00000[01]\.(cls|txt)"):
            read()
    ds.close()
    fresh = ShardListDataset(index, transformations=[])  # first touch: size and mtime agree
    with pytest.raises(IndexMismatchError, match="names"):
        fresh[1]
    fresh.close()


def test_a_remote_long_named_member_after_the_first_is_compared(http_server, tmp_path: Path):
    """Over nginx a range read starts at the first member's header: the records before a later
    member's header are in it (the first member's are not read: its name is compared only where
    the header holds it)."""
    members = make_samples(3, prefix=LONG, fields=FIELDS)
    path = write_shard(tmp_path / "a.tar", members, format="gnu")
    url = http_server.put(str(path), "dataset_tables/a.tar")
    index = str(tmp_path / "i.json")
    build_index([url], index)
    served = http_server.path("dataset_tables/a.tar")
    shutil.copystat(path, served)  # the index's mtime kept: the etag nginx gives is the same
    _swap_first_two(served, members, "gnu")
    ds = ShardListDataset(index, transformations=[])
    with pytest.raises(IndexMismatchError, match=r"000001\.txt"):
        ds[0]
    ds.close()


def test_long_names_of_every_format_read_as_the_tar(tmp_path: Path):
    """The long-name comparison accepts what every writer wrote (tarfile and, where present,
    GNU tar), by ``ds[i]`` and in batches."""
    members = make_samples(4, prefix=LONG + "日本/", fields=(".cls", ".jpg", ".json"))
    want = dict(members)
    paths = [write_shard(tmp_path / f"{fmt}.tar", members, format=fmt) for fmt in ("gnu", "pax")]
    index = str(tmp_path / "i.json")
    build_index([str(p) for p in paths], index)
    ds = ShardListDataset(index, transformations=[])
    got = [ds[i] for i in range(len(ds))] + ds.__getitems__(list(range(len(ds))))
    assert len(got) == 2 * len(paths) * 4
    for s in got:
        for f in (".cls", ".jpg", ".json"):
            assert s[f] == want[s["__key__"] + f]
    ds.close()


def _local(tmp_path: Path) -> tuple[Path, str, list[tuple[str, bytes]]]:
    members = make_samples(6, fields=(".cls", ".jpg", ".json"))
    path = write_shard(tmp_path / "a.tar", members)
    index = str(tmp_path / "i.json")
    build_index([str(path)], index)
    return path, index, members


def test_a_local_sample_read_again_reads_no_header(tmp_path: Path):
    """Checked once per open file: a second read of a sample is its members' bytes alone."""
    _, index, _ = _local(tmp_path)
    ds = ShardListDataset(index, transformations=[])
    ds[0]  # the shard opened and checked on first touch
    stats = ds._catalog.store.stats
    table = ds._pool.fast[0]
    start, end = table.span(3)
    for read in (lambda: ds[3], lambda: ds.__getitems__([3])):
        before = stats.bytes_read
        first = read()
        assert stats.bytes_read - before in (end - start, end - start + 512)
    before = stats.bytes_read
    again = ds[3]
    assert stats.bytes_read - before == end - start  # was end - start + 512 every time
    assert strip_meta(again) == strip_meta(first if isinstance(first, dict) else first[0])
    ds.close()


def test_a_file_replaced_under_a_dropped_descriptor_is_checked_again(tmp_path: Path):
    """A sample checked in one open file is checked again in the next: the pool dropped the
    descriptor (its file limit), and the path now names another shard of the same size and
    mtime (nothing but the headers tells)."""
    path, index, members = _local(tmp_path)
    ds = ShardListDataset(index, transformations=[])
    ds[0], ds[1], ds[2]  # checked in the open file
    st = os.stat(path)
    k = 3
    other = members[k : 2 * k] + members[:k] + members[2 * k :]  # samples 0 and 1 swapped
    tmp = tmp_path / "b.tar"
    write_shard(tmp, other)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)  # a new file at the path; the open descriptor still reads the old
    assert ds[1][".cls"] == b"1"
    ds._pool.descriptors.discard(ds._pool.fast[0].path)
    with pytest.raises(IndexMismatchError, match=r"000000\.cls"):
        ds[1]
    assert ds[2][".cls"] == b"2"  # a sample the new file holds where the index says
    ds.close()


def test_a_sample_read_again_without_its_header_is_the_same_for_every_layout(tmp_path: Path):
    """One to four fields, fields changing between samples, long and non-ASCII keys: the
    second read of each sample (no header read, nothing checked) gives the first's dict, by
    ``ds[i]`` and in batches of adjacent samples."""
    shards = {
        "one": make_samples(4, fields=(".jpg",)),
        "three": make_samples(4, fields=(".cls", ".jpg", ".json"), prefix="日本/"),
        "four": make_samples(4, fields=(".cls", ".jpg", ".json", ".txt")),
        "mixed": make_samples(2, fields=(".jpg", ".cls")) + make_samples(2, start=2),
        "long": make_samples(4, fields=(".cls", ".txt"), prefix=LONG),
    }
    paths = [str(write_shard(tmp_path / f"{name}.tar", m)) for name, m in shards.items()]
    index = str(tmp_path / "i.json")
    build_index(paths, index)
    ds = ShardListDataset(index, transformations=[])
    n = len(ds)
    first = [ds[i] for i in range(n)]
    again = [ds[i] for i in range(n)]
    batched = ds.__getitems__(list(range(n)))
    assert [list(s.items()) for s in again] == [list(s.items()) for s in first]
    assert [list(s.items()) for s in batched] == [list(s.items()) for s in first]
    fresh = ShardListDataset(index, transformations=[])  # batches first, then ds[i]
    assert [list(s.items()) for s in fresh.__getitems__(list(range(n)))] == [
        list(s.items()) for s in first
    ]
    assert [list(fresh[i].items()) for i in range(n)] == [list(s.items()) for s in first]
    ds.close()
    fresh.close()


def _bytes_read(batch: list) -> int:  # a DataLoader's collate: runs in the worker
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    assert info is not None
    return int(info.dataset._catalog.store.stats.bytes_read)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_keep_their_checks_from_one_epoch_to_the_next(
    tmp_path: Path, context: str
):
    """A persistent worker's second epoch reads no member header: its samples were checked in
    the files it holds open. (Before, every epoch read each sample's header again.)"""
    torch = pytest.importorskip("torch")
    _, index, _ = _local(tmp_path)
    ds = ShardListDataset(index, transformations=[])
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=2,
        sampler=[0, 3, 1, 4, 2, 5],
        num_workers=1,
        persistent_workers=True,
        collate_fn=_bytes_read,
        multiprocessing_context=context,
    )
    ends = [list(loader)[-1] for _ in range(3)]
    table = ShardListDataset(index, transformations=[])
    table[0]
    data = sum(b - a for a, b in map(table._pool.fast[0].span, range(6)))
    assert ends[2] - ends[1] == ends[1] - ends[0] == data  # members' bytes alone
    assert ends[0] >= data + 6 * 512  # the first epoch: with every sample's header
    table.close()
    ds.close()
