"""``wids.write_index``: an index written from offsets a tool already knows, without a scan.

The shards are written with Python's ``tarfile`` and their offsets read from it (as a tool
that writes or parses tars itself knows them); the index goes through the public API only, and
``ShardListDataset`` must read back exactly the bytes ``tarfile`` extracts.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from tarfixtures import make_samples, write_shard

import wids
from wids import (
    DestinationError,
    IndexFormatError,
    IndexMismatchError,
    OutputExistsError,
    ShardInfo,
    ShardListDataset,
    ShardMembers,
    write_index,
)


def known_offsets(path: Path) -> ShardMembers:
    """What a tool knows about a tar it wrote: each member's key, field, data offset, size."""
    samples: list[tuple[str, list[tuple[str, int, int]]]] = []
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isfile():
                continue
            base = m.name.rsplit("/", 1)[-1]
            cut = len(m.name) - len(base) + base.index(".")
            key, field = m.name[:cut], m.name[cut:]
            if samples and samples[-1][0] == key:
                samples[-1][1].append((field, m.offset_data, m.size))
            else:
                samples.append((key, [(field, m.offset_data, m.size)]))
    return ShardMembers.from_samples(samples)


def extracted(paths: list[Path]) -> list[tuple[str, dict[str, bytes]]]:
    """Every sample's key and field bytes, as ``tarfile`` extracts them."""
    out: list[tuple[str, dict[str, bytes]]] = []
    for path in paths:
        table = known_offsets(path)
        with tarfile.open(path) as tf:
            files = [m for m in tf if m.isfile()]
            data = iter(tf.extractfile(m).read() for m in files)  # type: ignore[union-attr]
            for i in range(len(table)):
                out.append((table.key(i), {f: next(data) for f, _, _ in table.members(i)}))
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three tars written by ``tarfile``: GNU, pax with long non-ASCII names, ustar."""
    d = tmp_path_factory.mktemp("known") / "data"
    d.mkdir()
    return [
        write_shard(d / "k-000.tar", make_samples(6), format="gnu"),
        write_shard(
            d / "k-001.tar",
            make_samples(4, start=6, prefix="sub/" + "é" * 60 + "/", fields=(".seg.png", ".txt")),
            format="pax",
        ),
        write_shard(d / "k-002.tar", make_samples(3, start=10, jpg_size=0), format="ustar"),
    ]


def info(path: Path, relative_to: Path, members: ShardMembers) -> ShardInfo:
    return ShardInfo(os.path.relpath(path, relative_to), len(members), size=path.stat().st_size)


def raw(ds: ShardListDataset) -> list[tuple[str, dict[str, bytes]]]:
    out = []
    for i in range(len(ds)):
        s = ds[i]
        out.append((s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}))
    return out


@pytest.mark.parametrize("suffix", [".json", ".sqlite", ".widx"])
def test_an_index_from_known_offsets_reads_the_bytes_tarfile_extracts(shards, suffix):
    out = shards[0].parent.parent / f"known{suffix}"
    with write_index(out, name="known") as writer:
        for i, path in enumerate(shards):
            if i == 2:
                writer.start_component("tail", 0.5)
            members = known_offsets(path)
            writer.add(info(path, out.parent, members), members)
    ds = ShardListDataset(str(out), transformations=[])
    try:
        assert ds.lengths == [6, 4, 3]
        assert raw(ds) == extracted(shards)
        assert ds[12]["__dataset__"] == "tail" and ds[0]["__dataset__"] == "known"
        assert ds.get_stats()[1] == 3  # opened from the index: no shard was scanned
    finally:
        ds.close()
    assert wids.open_index(str(out)).members(1) == known_offsets(shards[1])


def test_the_shard_writers_table_needs_no_scan(tmp_path):
    """``TarWriter.members()`` is the table a shard writer hands to ``write_index``."""
    shard = tmp_path / "w-000.tar"
    with wids.TarWriter(str(shard)) as tw:
        for i in range(5):
            tw.write({"__key__": f"s{i}", "txt": f"text {i}", "cls": i})
        members = tw.members()
    out = tmp_path / "w.sqlite"
    with write_index(out) as writer:
        writer.add(ShardInfo(shard.name, len(members), size=shard.stat().st_size), members)
    ds = ShardListDataset(str(out), transformations=[])
    assert raw(ds) == extracted([shard])


@pytest.mark.servers
def test_write_index_to_s3(s3_server, shards, tmp_path):
    for p in shards:
        s3_server.put(p, f"known/{p.name}")
    out = s3_server.url("known/train.json")
    with write_index(out, storage_options=s3_server.storage_options) as writer:
        for path in shards:
            members = known_offsets(path)
            writer.add(ShardInfo(path.name, len(members), size=path.stat().st_size), members)
    assert os.listdir(tmp_path) == []
    ds = ShardListDataset(out, transformations=[], storage_options=s3_server.storage_options)
    try:
        assert raw(ds) == extracted(shards)
    finally:
        ds.close()


# -- bad input is a typed error, and nothing is published -------------------------------------


def _entry(shards: list[Path]) -> tuple[Path, ShardMembers]:
    return shards[0], known_offsets(shards[0])


def test_a_member_past_the_shard_size_is_refused(shards, tmp_path):
    path, members = _entry(shards)
    out = tmp_path / "bad.json"
    with pytest.raises(IndexFormatError, match="past the shard's recorded size"):
        with write_index(out) as writer:
            end = int(members.member_offset[-1] + members.member_size[-1])
            writer.add(ShardInfo(str(path), len(members), size=end - 1), members)
    assert not out.exists()


def test_overlapping_members_and_negative_sizes_are_refused():
    with pytest.raises(IndexFormatError, match="overlaps"):
        ShardMembers.from_samples([("a", [(".txt", 512, 100)]), ("b", [(".txt", 1000, 10)])])
    with pytest.raises(IndexFormatError, match="member_size"):
        ShardMembers.from_samples([("a", [(".txt", 512, -5)])])
    with pytest.raises(IndexFormatError, match="member_offset"):
        ShardMembers.from_samples([("a", [(".txt", 100, 5)])])  # inside the first header
    with pytest.raises(IndexFormatError, match="not integers"):
        ShardMembers.from_samples([("a", [(".txt", 512.5, 5)])])
    with pytest.raises(IndexFormatError, match="samples must be"):
        ShardMembers.from_samples([("a", [(".txt", 512)])])  # type: ignore[list-item]
    with pytest.raises(IndexFormatError, match="samples must be"):
        ShardMembers.from_samples([(7, [(".txt", 512, 5)])])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"nsamples": 5}, "member table has 6 samples, nsamples is 5"),
        ({"nsamples": np.int64(6)}, "nsamples must be an int"),
        ({"nsamples": -1}, "nsamples must be an int"),
        ({"size": -1}, "size must be None or an int"),
        ({"url": ""}, "url must be a non-empty string"),
        ({"mtime": float("nan")}, "mtime must be None or a finite number"),
        ({"etag": 5}, "etag must be None or a string"),
    ],
)
def test_a_bad_record_is_refused_by_every_backend(shards, tmp_path, change, match):
    path, members = _entry(shards)
    fields = {"url": path.name, "nsamples": 6, "size": path.stat().st_size, **change}
    for suffix in (".json", ".sqlite", ".widx"):
        out = tmp_path / f"bad{suffix}"
        with pytest.raises(IndexFormatError, match=match):
            with write_index(out) as writer:
                writer.add(ShardInfo(**fields), members)
        assert not out.exists()


def test_more_samples_than_the_size_allows_is_refused(tmp_path):
    with pytest.raises(IndexFormatError, match="holds at most 1 samples"):
        with wids.create_index_writer(tmp_path / "x.json") as writer:
            writer.add(ShardInfo("a.tar", 2, size=1024), None)


def test_offsets_that_fit_but_are_wrong_are_caught_on_first_read(shards, tmp_path):
    """The writer cannot see the bytes; the dataset checks a recorded header on first touch."""
    path, members = _entry(shards)
    cols = members.to_columns()
    cols["member_offset"] = [o + 512 for o in cols["member_offset"]]
    shifted = ShardMembers.from_columns(cols)
    out = tmp_path / "shifted.json"
    with write_index(out) as writer:
        writer.add(ShardInfo(str(path), len(shifted), size=path.stat().st_size), shifted)
    with pytest.raises(IndexMismatchError):
        ShardListDataset(str(out), transformations=[])[0]


def test_outputs_write_index_refuses(shards, tmp_path):
    with pytest.raises(DestinationError):
        with write_index(tmp_path / "train.txt"):
            pass
    with pytest.raises(DestinationError):
        with write_index("http://127.0.0.1:1/train.json"):
            pass
    with pytest.raises(OutputExistsError):  # a user's file of the same name
        (tmp_path / "notes.json").write_text('["mine"]')
        with write_index(tmp_path / "notes.json"):
            pass
    assert (tmp_path / "notes.json").read_text() == '["mine"]'


def test_create_index_writer_writes_local_files_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DestinationError, match="write_index"):
        wids.create_index_writer("s3://bucket/train.json")
    assert os.listdir(tmp_path) == []  # no folder named "s3:"
    with wids.create_index_writer(f"file://{tmp_path}/t.json", name="t") as writer:
        writer.add(ShardInfo("a.tar", 0), None)
    assert wids.open_index(str(tmp_path / "t.json")).name == "t"


def test_the_documented_example_runs(shards, tmp_path, monkeypatch):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "index-api.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "data").mkdir()
    for i, p in enumerate(shards[:2]):
        (tmp_path / "data" / f"train-{i:06d}.tar").write_bytes(p.read_bytes())
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/index-api.md", "exec"), scope)
    assert len(scope["ds"]) == 10
    assert raw(ShardListDataset("data/train.json", transformations=[])) == extracted(shards[:2])
