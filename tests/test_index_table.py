"""The shard-table index (``wids.index.tablereader``, ``wids.index.tablewriter``)."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import numpy as np
import pytest
from indexcontract import IndexContract, tar_table
from tarfixtures import make_samples, write_shard

from wids import ShardListDataset, build_index, convert_index, open_index
from wids.errors import IndexFormatError, IndexMismatchError
from wids.index import ShardInfo, ShardMembers, TableIndex, TableIndexWriter
from wids.index.tableformat import PREAMBLE


def rewrite_header(path: Path, change) -> None:
    """Apply ``change`` to the header of the index at ``path`` (appended; the old one is left)."""
    data = bytearray(path.read_bytes())
    _, at, n = PREAMBLE.unpack_from(data, 0)
    header = json.loads(bytes(data[at : at + n]))
    change(header)
    text = json.dumps(header).encode()
    PREAMBLE.pack_into(data, 0, data[:8], len(data), len(text))
    path.write_bytes(bytes(data) + text)


class TestTableIndex(IndexContract):
    suffix = ".widx"
    other_suffix = ".json"
    Writer = TableIndexWriter
    Reader = TableIndex

    def bump_version(self, path: Path) -> None:
        rewrite_header(path, lambda h: h.update(version=99))


# -- hostile files: every damage is an IndexFormatError naming the file ------------------------


def small_index(tmp_path: Path, n: int = 4) -> Path:
    """An index of ``n`` shards of 3 samples each, with members, sizes, etags and extras."""
    path = tmp_path / "h.widx"
    table = ShardMembers.from_samples([(f"k{j}", [(".x", 512 + 1024 * j, 5)]) for j in range(3)])
    with TableIndexWriter(path, name="h") as w:
        for i in range(n):
            w.add(ShardInfo(f"s{i}.tar", 3, size=4096, etag=f'"e{i}"'), table, {"i": i})
    return path


def column(path: Path, name: str) -> tuple[int, int]:
    data = path.read_bytes()
    _, at, n = PREAMBLE.unpack_from(data, 0)
    off, nbytes, _ = json.loads(data[at : at + n])["columns"][name]
    return off, nbytes


def patch(path: Path, at: int, raw: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + len(raw)] = raw
    path.write_bytes(bytes(data))


def refused(path: Path, match: str, shard: int | None = None) -> None:
    with pytest.raises(IndexFormatError, match=match) as info:
        ix = open_index(str(path))
        _ = ix.nshards
        if shard is not None:
            ix.shard(shard)
            ix.members(shard)
    assert path.name in str(info.value)


@pytest.mark.parametrize("keep", [0, 7, 23, 100, -300, -1])
def test_truncated_file(tmp_path: Path, keep: int) -> None:
    path = small_index(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    with pytest.raises(IndexFormatError) as info:
        _ = TableIndex(str(path)).nshards
    assert path.name in str(info.value)


def test_wrong_dtype_and_wrong_length(tmp_path: Path) -> None:
    path = small_index(tmp_path)
    rewrite_header(path, lambda h: h["columns"]["nsamples"].__setitem__(2, "<f8"))
    refused(path, "dtype")
    path = small_index(tmp_path)
    rewrite_header(path, lambda h: h["columns"]["cum"].__setitem__(1, 8 * 4))
    refused(path, "expected 5 values")
    path = small_index(tmp_path)
    rewrite_header(path, lambda h: h["columns"]["url_off"].__setitem__(0, 1 << 40))
    refused(path, "bad place")
    path = small_index(tmp_path)
    rewrite_header(path, lambda h: h["columns"].pop("cum"))
    refused(path, "'cum' is missing")


def test_counts_that_disagree(tmp_path: Path) -> None:
    path = small_index(tmp_path)
    off, _ = column(path, "nsamples")
    patch(path, off + 8, np.array([4], dtype="<i8").tobytes())
    refused(path, "disagree")
    path = small_index(tmp_path)
    off, _ = column(path, "cum")
    patch(path, off, np.array([0, 3, 2, 9, 12], dtype="<i8").tobytes())
    refused(path, "rise")
    path = small_index(tmp_path)
    off, _ = column(path, "nsamples")
    patch(path, off, np.array([-1], dtype="<i8").tobytes())
    refused(path, "nsamples outside")
    path = small_index(tmp_path)
    rewrite_header(path, lambda h: h.update(nshards=5))
    refused(path, "components cover|expected 6 values")


def test_out_of_range_offsets_fail_at_their_shard_only(tmp_path: Path) -> None:
    path = small_index(tmp_path)
    off, _ = column(path, "url_off")
    patch(path, off + 8 * 2, np.array([1 << 50], dtype="<i8").tobytes())
    ix = TableIndex(str(path))
    assert ix.shard(0).url.endswith("s0.tar") and ix.shard(3).url.endswith("s3.tar")
    refused(path, "shard 1: url at bytes", shard=1)
    refused(path, "shard 2: url at bytes", shard=2)
    path = small_index(tmp_path)
    off, _ = column(path, "mem_len")
    patch(path, off + 8, np.array([1 << 40], dtype="<i8").tobytes())
    refused(path, "shard 1: member table at", shard=1)
    path = small_index(tmp_path)
    off, _ = column(path, "mem_off")
    good = int(np.frombuffer(path.read_bytes()[off : off + 8], dtype="<i8")[0])
    patch(path, off + 8, np.array([good + 8], dtype="<i8").tobytes())  # not a table's start
    refused(path, "shard 1: member table", shard=1)
    path = small_index(tmp_path)
    off, _ = column(path, "size")
    patch(path, off, np.array([100], dtype="<i8").tobytes())  # too small for 3 samples
    refused(path, "cannot hold", shard=0)


def test_member_table_counts_are_checked_before_arrays(tmp_path: Path) -> None:
    path = small_index(tmp_path)
    off, _ = column(path, "mem_off")
    at = int(np.frombuffer(path.read_bytes()[off : off + 8], dtype="<i8")[0])
    patch(path, at + 8, np.array([1 << 60], dtype="<u8").tobytes())  # n samples: huge
    refused(path, "need", shard=0)


def test_garbage_header_and_unknown_format(tmp_path: Path) -> None:
    path = small_index(tmp_path)
    rewrite_header(path, lambda h: h.update(format="something-else"))
    refused(path, "format")
    path = small_index(tmp_path)
    data = bytearray(path.read_bytes())
    PREAMBLE.pack_into(data, 0, data[:8], 24, 1 << 40)
    path.write_bytes(bytes(data))
    refused(path, "header")
    path = small_index(tmp_path)
    rewrite_header(path, lambda h: h.update(components=[{"name": "a", "first_shard": 1}]))
    refused(path, "components")


# -- the dataset over a shard table --------------------------------------------------------------


def test_dataset_reads_every_sample_as_from_the_json_index(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    shards = [
        write_shard(d / f"s-{i}.tar", make_samples(4 + i, fields=(".jpg", ".cls")), format=fmt)
        for i, fmt in enumerate(("gnu", "pax", "ustar"))
    ]
    build_index([str(p) for p in shards], str(d / "i.json"))
    convert_index(str(d / "i.json"), d / "i.widx")
    build_index([str(p) for p in shards], str(d / "b.widx"))
    want = ShardListDataset(str(d / "i.json"), transformations=[])
    for name in ("i.widx", "b.widx"):
        got = ShardListDataset(str(d / name), transformations=[])
        assert len(got) == len(want) and got.lengths == want.lengths
        assert got.shards == want.shards
        assert list(got.cum_lengths) == list(want.cum_lengths)
        assert [got[i] for i in range(len(got))] == [want[i] for i in range(len(want))]
        assert got[-1] == want[-1]
        got.close()
    want.close()


def test_dataset_opens_without_decoding_every_shard(tmp_path: Path) -> None:
    """Shard records are made on first use: a damaged record only fails its own shard."""
    d = tmp_path / "data"
    d.mkdir()
    real = write_shard(d / "real.tar", make_samples(3))
    table = tar_table(real)
    path = d / "many.widx"
    n = 5000
    with TableIndexWriter(path) as w:
        w.add(ShardInfo("real.tar", 3, size=real.stat().st_size), table)
        for i in range(1, n):
            w.add(ShardInfo(f"missing-{i}.tar", 3, size=real.stat().st_size), table)
    off, _ = column(path, "url_off")
    patch(path, off + 8 * (n - 1), np.array([1 << 50], dtype="<i8").tobytes())  # last shard
    ds = ShardListDataset(str(path), transformations=[])
    assert len(ds) == 3 * n
    assert ds[1]["__key__"] == table.key(1)
    with pytest.raises(IndexFormatError, match=f"shard {n - 1}: url"):
        ds[3 * n - 1]
    ds.close()


def test_changed_shard_is_refused_on_first_touch(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    shard = write_shard(d / "s.tar", make_samples(3))
    build_index([str(shard)], str(d / "i.widx"))
    write_shard(d / "s.tar", make_samples(4))  # same name, other bytes
    ds = ShardListDataset(str(d / "i.widx"), transformations=[])
    with pytest.raises(IndexMismatchError, match="not the shard the index describes"):
        ds[0]
    ds.close()


def test_dataloader_workers_read_the_shard_table(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    d = tmp_path / "data"
    d.mkdir()
    shards = [write_shard(d / f"s-{i}.tar", make_samples(5, start=10 * i)) for i in range(3)]
    build_index([str(p) for p in shards], str(d / "i.widx"))
    ds = ShardListDataset(str(d / "i.widx"), transformations=[operator.itemgetter("__key__")])
    for ctx in ("fork", "spawn"):
        loader = torch.utils.data.DataLoader(
            ds, batch_size=4, num_workers=2, multiprocessing_context=ctx
        )
        keys = [k for batch in loader for k in batch]
        assert keys == [ds[i] for i in range(len(ds))]


def test_locate_over_more_shards_than_the_list_path(tmp_path: Path) -> None:
    """Past ``SMALL`` shards the lookup is a numpy search: the same answers, empty shards too."""
    from wids.dataset.description import SMALL

    n = SMALL + 1000
    counts = np.random.default_rng(0).integers(0, 4, size=n)
    path = tmp_path / "big.widx"
    with TableIndexWriter(path) as w:
        for i, c in enumerate(counts.tolist()):
            w.add(ShardInfo(f"s{i}.tar", c), None)
    ds = ShardListDataset(str(path), transformations=[])
    starts = np.concatenate([[0], np.cumsum(counts)])
    assert len(ds) == int(starts[-1]) and ds._catalog.load().cum_list is None
    for i in [0, 1, len(ds) // 2, len(ds) - 2, len(ds) - 1, *range(0, len(ds), 9973)]:
        shard = int(np.searchsorted(starts, i, side="right")) - 1
        assert ds._catalog.locate(i) == (i, shard, i - int(starts[shard]))
    assert ds._catalog.locate(-1)[0] == len(ds) - 1
    with pytest.raises(IndexError):
        ds._catalog.locate(len(ds))


def test_add_many_writes_what_add_writes(tmp_path: Path) -> None:
    infos = [
        ShardInfo("a.tar", 3, size=4096, etag='"x"', mtime=1.5),
        ShardInfo("sub/b.tar", 0),
        ShardInfo("s3://bucket/c.tar", 7, size=8192, md5sum="00ff", mtime=2.0),
        ShardInfo("ü.tar", 1, etag=""),
    ]
    extras = [None, {"colour": "red"}, {}, {"n": [1]}]
    one, many = tmp_path / "one.widx", tmp_path / "many.widx"
    with TableIndexWriter(one, name="n") as w:
        for info, extra in zip(infos, extras, strict=True):
            w.add(info, None, extra)
    with TableIndexWriter(many, name="n") as w:
        w.add_many(infos[:1], None, extras[:1])
        w.add_many(infos[1:], [i.url for i in infos[1:]], extras[1:])
    assert one.read_bytes() == many.read_bytes()
    ix = TableIndex(str(many))
    assert [ix.shard_extra(i) for i in range(4)] == [{}, {"colour": "red"}, {}, {"n": [1]}]
    assert ix.shard(3).etag == "" and ix.shard(1).etag is None


def test_convert_a_reference_description(tmp_path: Path) -> None:
    desc = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "ref",
        "shardlist": [
            {"url": "a.tar", "nsamples": 2, "filesize": 4096, "md5sum": "ab", "colour": "red"},
            {"url": "s3://b/x.tar", "nsamples": 1, "etag": '"e"', "mtime": 3.5},
        ],
        "datasets": [
            {"name": "sub", "weight": 0.5, "shardlist": [{"url": "c.tar", "nsamples": 4}]}
        ],
    }
    src = tmp_path / "desc.json"
    src.write_text(json.dumps(desc))
    out = tmp_path / "out" / "t.widx"
    out.parent.mkdir()
    convert_index(str(src), out)
    a, b = open_index(str(src)), open_index(str(out))
    assert isinstance(b, TableIndex)
    assert b.shards == a.shards and b.components == a.components and b.name == "ref"
    assert [b.shard_extra(i) for i in range(3)] == [a.shard_extra(i) for i in range(3)]
    assert not b.has_members and b.members(0) is None
    assert b.sample_counts().tolist() == [2, 1, 4]
    assert b.cumulative_counts().tolist() == [0, 2, 3, 7]
