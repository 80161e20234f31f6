"""One contract for both index backends (JSON + sidecars, SQLite), plus what is backend-specific."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarfixtures import make_samples, write_shard

from wids import (
    Component,
    JsonIndex,
    JsonIndexWriter,
    ShardInfo,
    ShardMembers,
    SqliteIndex,
    SqliteIndexWriter,
    convert_index,
    create_index_writer,
    open_index,
)
from wids.errors import IndexFormatError, ShardNotFoundError
from wids.samples import split_name

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))


def tar_table(path: str | os.PathLike[str]) -> ShardMembers:
    """The member table of a real tar, from Python's tarfile (the oracle)."""
    samples: list[tuple[str, list[tuple[str, int, int]]]] = []
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isfile():
                continue
            split = split_name(m.name)
            assert split is not None
            key, field = split
            if samples and samples[-1][0] == key:
                samples[-1][1].append((field, m.offset_data, m.size))
            else:
                samples.append((key, [(field, m.offset_data, m.size)]))
    return ShardMembers.from_samples(samples)


def shard_info(path: Path, directory: Path, table: ShardMembers, **kw: Any) -> ShardInfo:
    st = path.stat()
    url = os.path.relpath(path, directory)
    return ShardInfo(url, len(table), size=st.st_size, mtime=st.st_mtime, **kw)


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    """Three real shards: gnu, pax with long non-ASCII names, ustar; different fields."""
    d = tmp_path / "data"
    d.mkdir()
    long_dir = "deep/" + "d" * 120 + "/"
    return [
        write_shard(d / "s-000.tar", make_samples(7, fields=(".jpg", ".cls")), format="gnu"),
        write_shard(
            d / "s-001.tar",
            make_samples(5, prefix=long_dir + "données-", fields=(".seg.png", ".txt", ".json")),
            format="pax",
        ),
        write_shard(d / "s-002.tar", make_samples(4, start=100, jpg_size=512), format="ustar"),
    ]


class IndexContract:
    """What every backend must do; subclasses set the suffix and the classes."""

    suffix = ""
    other_suffix = ""
    Writer: Any = None
    Reader: Any = None

    def index_path(self, tmp_path: Path, stem: str = "index") -> Path:
        return tmp_path / "data" / f"{stem}{self.suffix}"

    def write(
        self,
        path: Path,
        entries: list[tuple[ShardInfo, ShardMembers | None]],
        *,
        name: str | None = None,
        components: list[tuple[int, str, float | None]] = (),  # type: ignore[assignment]
        report: dict | None = None,
        extras: dict[int, dict] | None = None,
    ) -> None:
        starts = {at: (n, w) for at, n, w in components}
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.Writer(path, name=name) as w:
            for i, (info, members) in enumerate(entries):
                if i in starts:
                    w.start_component(*starts[i])
                w.add(info, members, (extras or {}).get(i))
            if report is not None:
                w.set_report(report)

    def real_entries(self, shards: list[Path]) -> list[tuple[ShardInfo, ShardMembers]]:
        out = []
        for p in shards:
            table = tar_table(p)
            out.append((shard_info(p, p.parent, table), table))
        return out

    def test_url_map_rewrites_resolved_shard_urls(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries)
        data = str(tmp_path / "data")
        url_map = {f"{data}/": "s3://bucket/data/", f"{data}/s-002": "https://cdn.example/x"}
        ix = open_index(str(path), url_map=url_map)
        assert [s.url for s in ix.shards] == [
            "s3://bucket/data/s-000.tar",
            "s3://bucket/data/s-001.tar",
            "https://cdn.example/x.tar",  # the longest prefix wins
        ]
        for (info, table), got, k in zip(entries, ix.shards, range(3), strict=True):
            # the old store's etag and mtime are not the new one's; size and md5 stay
            assert (got.size, got.md5sum, got.etag, got.mtime) == (info.size, None, None, None)
            assert ix.members(k) == table
        ix.close()
        with pytest.raises(ValueError, match="absolute"):
            open_index(str(path), url_map={"data/": "s3://bucket/data/"})

    # -- round trips -----------------------------------------------------------------------
    # -- round trips -----------------------------------------------------------------------

    def test_round_trip_of_real_shards(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries, name="demo", report={"shards": 3, "nested": {"a": [1]}})
        ix = open_index(str(path))
        assert isinstance(ix, self.Reader)
        assert ix.name == "demo"
        assert ix.report == {"shards": 3, "nested": {"a": [1]}}
        assert [s.url for s in ix.shards] == [str(p) for p in shards]
        for (info, _table), got in zip(entries, ix.shards, strict=True):
            assert (got.nsamples, got.size, got.mtime, got.etag) == (
                info.nsamples,
                info.size,
                info.mtime,
                None,
            )
        assert ix.components == [Component("demo", None, 0, 3)]
        for i, (_, table) in enumerate(entries):
            loaded = ix.members(i)
            assert loaded == table
            assert loaded.fields == table.fields
            data = shards[i].read_bytes()
            with tarfile.open(shards[i]) as tf:
                files = [m for m in tf if m.isfile()]
                for j in range(len(loaded)):
                    start, end = loaded.span(j)
                    for field, off, size in loaded.members(j):
                        assert start <= off and off + size <= end
                        m = files.pop(0)
                        assert m.name == loaded.key(j) + field
                        assert data[off : off + size] == tf.extractfile(m).read()
        ix.close()

    def test_etag_md5_and_extras(self, tmp_path: Path) -> None:
        path = self.index_path(tmp_path)
        table = ShardMembers.from_samples([("k", [(".x", 512, 3)])])
        info = ShardInfo("s3://b/x.tar", 1, size=2048, etag='"abc"', mtime=1.5, md5sum="00ff")
        self.write(path, [(info, table)], extras={0: {"colour": "red", "n": [1, 2]}})
        ix = self.Reader(str(path))
        assert ix.shards == [info]
        assert ix.shard_extra(0) == {"colour": "red", "n": [1, 2]}
        assert ix.name == ""

    def test_empty_shard_and_shard_without_members(self, tmp_path: Path) -> None:
        d = tmp_path / "data"
        d.mkdir()
        empty = write_shard(d / "empty.tar", [])
        full = write_shard(d / "full.tar", make_samples(2))
        t_empty, t_full = tar_table(empty), tar_table(full)
        assert len(t_empty) == 0
        path = self.index_path(tmp_path)
        self.write(
            path,
            [
                (shard_info(empty, d, t_empty), t_empty),
                (shard_info(full, d, t_full), None),
                (shard_info(full, d, t_full), t_full),
            ],
        )
        ix = self.Reader(str(path))
        got = ix.members(0)
        assert got is not None and len(got) == 0 and got.spans()[0].size == 0
        assert ix.members(1) is None
        assert ix.members(2) == t_full
        assert ix.has_members

    def test_non_ascii_and_non_utf8_keys(self, tmp_path: Path) -> None:
        samples = [
            ("données/élan-001", [(".jpg", 512, 10), (".ñ.txt", 1536, 3)]),
            ("日本語/サンプル", [(".jpg", 2560, 0)]),
            ("bad-\udcff-bytes", [(".cls", 3584, 1)]),
            ("emoji-\U0001f600", [(".cls", 4608, 1)]),
        ]
        table = ShardMembers.from_samples(samples)
        path = self.index_path(tmp_path)
        self.write(path, [(ShardInfo("ünï/s.tar", 4, size=10240), table)], name="名前")
        ix = self.Reader(str(path))
        got = ix.members(0)
        assert got == table
        assert [got.key(i) for i in range(4)] == [k for k, _ in samples]
        assert ix.name == "名前"
        assert ix.shards[0].url == str(tmp_path / "data" / "ünï" / "s.tar")

    def test_components(self, tmp_path: Path) -> None:
        t = ShardMembers.from_samples([("k", [(".x", 512, 1)])])
        entries = [(ShardInfo(f"s{i}.tar", 1, size=2048), t) for i in range(5)]
        path = self.index_path(tmp_path)
        self.write(path, entries, name="main", components=[(2, "extra", 0.25), (4, "last", None)])
        ix = self.Reader(str(path))
        assert ix.components == [
            Component("main", None, 0, 2),
            Component("extra", 0.25, 2, 4),
            Component("last", None, 4, 5),
        ]
        # sub-datasets from the first shard on: no empty main component
        path2 = self.index_path(tmp_path, "only-subs")
        self.write(path2, entries[:2], name="top", components=[(0, "a", 1.0), (1, "b", 2.0)])
        assert self.Reader(str(path2)).components == [
            Component("a", 1.0, 0, 1),
            Component("b", 2.0, 1, 2),
        ]

    def test_empty_index(self, tmp_path: Path) -> None:
        path = self.index_path(tmp_path)
        self.write(path, [], name="nothing")
        ix = self.Reader(str(path))
        assert ix.shards == [] and ix.components == [Component("nothing", None, 0, 0)]

    # One test body, two backends (subclasses): that is the contract pattern, not a flake.
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.differing_executors],
    )
    @given(
        st.lists(
            st.lists(
                st.tuples(
                    st.text(min_size=1, max_size=12).filter(lambda k: "\x00" not in k),
                    st.lists(
                        st.tuples(
                            st.sampled_from([".a", ".b.c", ".ü", ".jpg"]), st.integers(0, 10**9)
                        ),
                        min_size=1,
                        max_size=4,
                    ),
                ),
                max_size=6,
            ),
            min_size=1,
            max_size=4,
        )
    )
    def test_random_tables_round_trip(self, tables: list) -> None:
        built = []
        for samples in tables:
            offset, rows = 512, []
            for key, members in samples:
                fields = []
                for field, size in members:
                    fields.append((field, offset, size))
                    offset += 512 + size
                rows.append((key, fields))
            built.append(ShardMembers.from_samples(rows))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"h{self.suffix}"
            with self.Writer(path) as w:
                for i, t in enumerate(built):
                    w.add(ShardInfo(f"s{i}.tar", len(t), size=1 << 40), t)
            ix = self.Reader(str(path))
            assert [ix.members(i) for i in range(len(built))] == built
            ix.close()

    # -- laziness, pickling, remote -------------------------------------------------------------

    def test_pickled_reader_still_reads(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries)
        ix = self.Reader(str(path))
        assert ix.members(0) == entries[0][1]
        copy = pickle.loads(pickle.dumps(ix))
        assert copy.shards == ix.shards
        assert copy.members(2) == entries[2][1]

    def test_remote_index(self, tmp_path: Path, shards: list[Path]) -> None:
        import fsspec

        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries, name="remote")
        fs = fsspec.filesystem("memory")
        root = f"/idx-{uuid.uuid4().hex}"
        fs.put(str(path.parent), root, recursive=True)
        ix = open_index(f"memory://{root}/{path.name}")
        assert isinstance(ix, self.Reader)
        assert ix.shards[1].url == f"memory://{root}/s-001.tar"
        assert ix.members(1) == entries[1][1]
        ix.close()

    # -- bad input ------------------------------------------------------------------------------

    @pytest.mark.parametrize("content", [b"", b"garbage, not an index at all", b"\x00" * 4096])
    def test_garbage_names_the_file(self, tmp_path: Path, content: bytes) -> None:
        path = self.index_path(tmp_path, "garbage")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        with pytest.raises(IndexFormatError) as info:
            _ = self.Reader(str(path)).shards
        assert "garbage" in str(info.value)

    def test_truncated_index_names_the_file(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        self.write(path, self.real_entries(shards))
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(IndexFormatError) as info:
            ix = self.Reader(str(path))
            for i in range(len(ix.shards)):
                ix.members(i)
        assert path.name in str(info.value)

    def test_unknown_version_is_refused(self, tmp_path: Path) -> None:
        path = self.index_path(tmp_path)
        self.write(path, [(ShardInfo("a.tar", 0, size=1024), ShardMembers.from_samples([]))])
        self.bump_version(path)
        with pytest.raises(IndexFormatError, match="version") as info:
            _ = self.Reader(str(path)).shards
        assert path.name in str(info.value)

    def bump_version(self, path: Path) -> None:
        raise NotImplementedError

    def test_missing_index(self, tmp_path: Path) -> None:
        with pytest.raises(ShardNotFoundError):
            _ = self.Reader(str(tmp_path / f"nope{self.suffix}")).shards

    def test_writer_checks_nsamples(self, tmp_path: Path) -> None:
        t = ShardMembers.from_samples([("k", [(".x", 512, 1)])])
        with pytest.raises(ValueError, match="nsamples"):
            with self.Writer(self.index_path(tmp_path), name="x") as w:
                w.add(ShardInfo("a.tar", 2), t)
        assert not self.index_path(tmp_path).exists()

    # -- publishing -----------------------------------------------------------------------------

    def test_publishing_is_atomic(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries[:1], name="old")
        w = self.Writer(path, name="new")
        for info, table in entries:
            w.add(info, table)
        assert self.Reader(str(path)).name == "old"  # not published yet
        w.close()
        ix = self.Reader(str(path))
        assert ix.name == "new" and len(ix.shards) == 3 and ix.members(2) == entries[2][1]
        with pytest.raises(RuntimeError):
            with self.Writer(path, name="failed") as w2:
                w2.add(*entries[0])
                raise RuntimeError("builder failed")
        assert self.Reader(str(path)).name == "new"
        assert not [n for n in os.listdir(path.parent) if n.endswith(".tmp")]

    # -- conversion -----------------------------------------------------------------------------

    def test_convert_both_ways(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(
            path,
            entries,
            name="conv",
            components=[(1, "sub", 0.5)],
            report={"ok": True},
            extras={2: {"tag": "x"}},
        )
        there = path.with_name("converted" + self.other_suffix)
        back = tmp_path / "elsewhere" / ("back" + self.suffix)
        back.parent.mkdir()
        convert_index(str(path), there)
        convert_index(str(there), back)
        a, b, c = (open_index(str(p)) for p in (path, there, back))
        assert type(b) is not type(a) and type(c) is type(a)
        for ix in (b, c):
            assert ix.name == "conv"
            assert ix.shards == a.shards
            assert ix.components == a.components
            assert ix.report == {"ok": True}
            assert ix.shard_extra(2) == {"tag": "x"}
            assert [ix.members(i) for i in range(3)] == [t for _, t in entries]

    # -- writing to a URL ----------------------------------------------------------------------

    def check_written(self, url: str, shards: list[Path], options: dict | None = None) -> None:
        from wids import ShardListDataset

        ix = open_index(url, options)
        try:
            assert [ix.members(i) for i in range(len(shards))] == [tar_table(p) for p in shards]
        finally:
            ix.close()
        ds = ShardListDataset(url, transformations=[], storage_options=options)
        try:
            with tarfile.open(shards[2]) as tf:
                first = tf.getmembers()[0]
                want = tf.extractfile(first).read()  # type: ignore[union-attr]
            got = ds[len(ds) - len(tar_table(shards[2]))]
            assert got["__key__"] == split_name(first.name)[0]  # type: ignore[index]
            assert got[split_name(first.name)[1]] == want  # type: ignore[index]
        finally:
            ds.close()

    def test_build_and_convert_to_memory_url(self, tmp_path: Path, shards: list[Path]) -> None:
        """A store without atomic PUT: temporary name, then a move; nothing left beside it."""
        import fsspec

        from wids import build_index

        base = f"memory://wids-{uuid.uuid4().hex[:8]}"
        fs = fsspec.filesystem("memory")
        urls = [f"{base}/d/{p.name}" for p in shards]
        for p, u in zip(shards, urls, strict=True):
            fs.put_file(str(p), u)
        url = f"{base}/d/index{self.suffix}"
        assert build_index(urls, url).shards == 3
        self.check_written(url, shards)
        converted = f"{base}/e/conv{self.other_suffix}"
        convert_index(url, converted)
        self.check_written(converted, shards)
        left = [p for p in fs.find(base.removeprefix("memory://")) if p.endswith(".tmp")]
        assert left == []

    def test_build_to_gcs_and_rebuild_drops_stale_sidecars(
        self, gcs_server: Any, tmp_path: Path, shards: list[Path]
    ) -> None:
        from wids import build_index

        options = gcs_server.storage_options
        prefix = f"w-{uuid.uuid4().hex[:8]}"
        urls = [gcs_server.put(p, f"{prefix}/{p.name}") for p in shards]
        url = gcs_server.url(f"{prefix}/index{self.suffix}")
        assert build_index(urls, url, storage_options=options).scanned == 3
        self.check_written(url, shards, options)
        again = build_index(urls[:2], url, storage_options=options)
        assert (again.scanned, again.reused, again.shards) == (0, 2, 2)
        fs = gcs_server.fs
        fs.invalidate_cache()
        listed = [p.rsplit("/", 1)[-1] for p in fs.find(gcs_server.url(prefix))]
        sidecars = [n for n in listed if n.endswith(".tar.json")]
        assert len(sidecars) == (2 if self.suffix == ".json" else 0)
        assert not [n for n in listed if n.endswith((".tmp", ".lock"))]

    def test_create_index_writer_by_suffix(self, tmp_path: Path) -> None:
        assert isinstance(create_index_writer(tmp_path / f"x{self.suffix}"), self.Writer)
        with pytest.raises(ValueError):
            create_index_writer(tmp_path / "x.txt")


# -------------------------------------------------------------------------------------------
# JSON


class TestJsonIndex(IndexContract):
    suffix = ".json"
    other_suffix = ".sqlite"
    Writer = JsonIndexWriter
    Reader = JsonIndex

    def bump_version(self, path: Path) -> None:
        doc = json.loads(path.read_text())
        doc["wids_index"]["version"] = 99
        path.write_text(json.dumps(doc))

    def test_layout(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path, "train")
        entries = self.real_entries(shards)
        self.write(path, entries, name="train")
        doc = json.loads(path.read_text())
        assert doc["__kind__"] == "wids-shard-index-v1" and doc["wids_version"] == 1
        assert doc["wids_index"]["format"] == "wids-index-json"
        assert doc["wids_index"]["members_dir"] == "train.members"
        first = doc["shardlist"][0]
        assert first["url"] == "s-000.tar" and first["nsamples"] == 7
        assert first["filesize"] == shards[0].stat().st_size
        assert first["members"].startswith("train.members/") and first["members"].endswith(
            "-s-000.tar.json"
        )
        sidecar = json.loads((path.parent / first["members"]).read_text())
        assert sidecar["format"] == "wids-index-json-members" and sidecar["url"] == "s-000.tar"
        assert ShardMembers.from_columns(sidecar) == entries[0][1]

    def test_members_load_lazily(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries)
        ix = JsonIndex(str(path))
        doc = json.loads(path.read_text())
        for i, entry in enumerate(doc["shardlist"]):
            if i != 1:
                os.unlink(path.parent / entry["members"])
        assert len(ix.shards) == 3  # the top level alone
        assert ix.members(1) == entries[1][1]
        with pytest.raises(ShardNotFoundError):
            ix.members(0)

    def test_stale_or_corrupt_sidecar_is_an_error(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        self.write(path, self.real_entries(shards))
        doc = json.loads(path.read_text())
        doc["shardlist"][0]["filesize"] += 512
        path.write_text(json.dumps(doc))
        with pytest.raises(IndexFormatError, match="stale") as info:
            JsonIndex(str(path)).members(0)
        assert doc["shardlist"][0]["members"].split("/")[1] in str(info.value)
        (path.parent / doc["shardlist"][1]["members"]).write_text('{"format": "wids-index-json')
        with pytest.raises(IndexFormatError, match="not valid JSON"):
            JsonIndex(str(path)).members(1)
        sidecar = path.parent / doc["shardlist"][2]["members"]
        cols = json.loads(sidecar.read_text())
        cols["member_offset"] = cols["member_offset"][:-1]
        sidecar.write_text(json.dumps(cols))
        with pytest.raises(IndexFormatError) as info:
            JsonIndex(str(path)).members(2)
        assert sidecar.name in str(info.value)

    def test_reference_description_has_no_members(self, tmp_path: Path) -> None:
        path = tmp_path / "ref.json"
        path.write_text(
            json.dumps(
                {
                    "__kind__": "wids-shard-index-v1",
                    "wids_version": 1,
                    "name": "ref",
                    "shardlist": [{"url": "a.tar", "nsamples": 3, "filesize": 10240}],
                }
            )
        )
        ix = open_index(str(path))
        assert isinstance(ix, JsonIndex)
        assert ix.members(0) is None and not ix.has_members and ix.report == {}
        assert ix.shards == [ShardInfo(str(tmp_path / "a.tar"), 3, size=10240)]

    def test_rewrite_removes_unreferenced_sidecars(
        self, tmp_path: Path, shards: list[Path]
    ) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries)
        members_dir = path.parent / "index.members"
        assert len(os.listdir(members_dir)) == 3
        (members_dir / "not-ours.txt").write_text("keep me")
        self.write(path, entries[1:])
        assert sorted(os.listdir(members_dir))[-1] == "not-ours.txt"
        assert len(os.listdir(members_dir)) == 3
        assert JsonIndex(str(path)).members(0) == entries[1][1]

    def test_source_url_sub_index_reads_its_own_sidecars(
        self, tmp_path: Path, shards: list[Path]
    ) -> None:
        entries = self.real_entries(shards)
        sub = tmp_path / "data" / "sub" / "part.json"
        sub.parent.mkdir()
        with JsonIndexWriter(sub, name="part") as w:
            for info, table in entries[1:]:
                w.add(replace(info, url="../" + info.url), table)
        main = self.index_path(tmp_path, "main")
        with JsonIndexWriter(main, name="main") as w:
            w.add(*entries[0])
        doc = json.loads(main.read_text())
        doc["datasets"] = [{"source_url": "sub/part.json", "weight": 3}]
        main.write_text(json.dumps(doc))
        ix = JsonIndex(str(main))
        assert [s.url for s in ix.shards] == [str(p) for p in shards]
        assert ix.components == [Component("main", None, 0, 1), Component("part", 3.0, 1, 3)]
        assert [ix.members(i) for i in range(3)] == [t for _, t in entries]
        out = tmp_path / "flat.sqlite"
        convert_index(str(main), out)
        flat = SqliteIndex(str(out))
        assert flat.components == ix.components and flat.shards == ix.shards
        assert flat.members(2) == entries[2][1]

    def test_sidecar_is_matched_by_file_name_and_fingerprint(
        self, tmp_path: Path, shards: list[Path]
    ) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries)
        doc = json.loads(path.read_text())
        doc["shardlist"][0]["url"] = "https://mirror.example/data/s-000.tar"  # moved: same file
        path.write_text(json.dumps(doc))
        ix = JsonIndex(str(path))
        assert ix.shards[0].url == "https://mirror.example/data/s-000.tar"
        assert ix.members(0) == entries[0][1]  # was "stale sidecar: its url is 's-000.tar'"
        doc["shardlist"][1]["url"] = "s-009.tar"  # another file: not this sidecar's shard
        doc["shardlist"][2]["mtime"] += 1.0  # another fingerprint
        path.write_text(json.dumps(doc))
        with pytest.raises(IndexFormatError, match="for shard 's-001.tar', the index entry is"):
            JsonIndex(str(path)).members(1)
        with pytest.raises(IndexFormatError, match="stale member table: its shard's mtime") as e:
            JsonIndex(str(path)).members(2)
        assert "wids index create" in str(e.value) and "--full" in str(e.value)

    def test_100k_shard_top_level_loads_fast(self, tmp_path: Path) -> None:
        n = 100_000
        path = tmp_path / "big.json"
        shardlist = [
            {
                "url": f"big-{i:06d}.tar",
                "nsamples": 1000,
                "filesize": 734_003_200 + i,
                "etag": f'"{i:032x}"',
                "mtime": 1_700_000_000.25 + i,
                "members": f"big.members/{i:016x}-big-{i:06d}.tar.json",
            }
            for i in range(n)
        ]
        doc = {
            "__kind__": "wids-shard-index-v1",
            "wids_version": 1,
            "name": "big",
            "wids_index": {"format": "wids-index-json", "version": 1, "report": {}},
            "shardlist": shardlist,
        }
        path.write_text(json.dumps(doc))
        del doc, shardlist
        # CPU time, not wall time: other processes on a busy machine must not fail the test.
        best_cpu = best_wall = float("inf")
        for _ in range(3):
            c0, t0 = time.process_time(), time.perf_counter()
            ix = JsonIndex(str(path))
            shards = ix.shards
            best_cpu = min(best_cpu, time.process_time() - c0)
            best_wall = min(best_wall, time.perf_counter() - t0)
        assert len(shards) == n and shards[-1].url == str(tmp_path / f"big-{n - 1:06d}.tar")
        print(
            f"\n100k-shard JSON top level ({path.stat().st_size / 1e6:.1f} MB): "
            f"{best_cpu:.3f} s CPU, {best_wall:.3f} s wall"
        )
        assert best_cpu < 1.0


# -------------------------------------------------------------------------------------------
# SQLite


class TestSqliteIndex(IndexContract):
    suffix = ".sqlite"
    other_suffix = ".json"
    Writer = SqliteIndexWriter
    Reader = SqliteIndex

    def bump_version(self, path: Path) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'version'")
        conn.close()

    def test_schema(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        self.write(path, self.real_entries(shards), name="s")
        conn = sqlite3.connect(path)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"meta", "shards", "components", "fields", "samples", "members"} <= tables
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "members_shard" in indexes
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        assert meta["format"] == "wids-index-sqlite" and meta["version"] == "1"
        n = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
        assert n == 7 + 5 + 4
        row = conn.execute('SELECT start, "end" FROM samples WHERE shard_id = 0 AND idx = 0')
        start, end = row.fetchone()
        assert (start, end) == tar_table(shards[0]).span(0)
        conn.close()

    def test_members_load_lazily(self, tmp_path: Path, shards: list[Path]) -> None:
        path = self.index_path(tmp_path)
        entries = self.real_entries(shards)
        self.write(path, entries)
        ix = SqliteIndex(str(path))
        statements: list[str] = []
        ix._connection().set_trace_callback(statements.append)
        assert len(ix.shards) == 3
        assert not [s for s in statements if "FROM members" in s or "FROM samples" in s]
        statements.clear()
        assert ix.members(1) == entries[1][1]
        assert statements and all("shard_id = 1" in s for s in statements)

    def test_opened_read_only(self, tmp_path: Path) -> None:
        path = self.index_path(tmp_path)
        self.write(path, [])
        ix = SqliteIndex(str(path))
        _ = ix.shards
        with pytest.raises(sqlite3.OperationalError):
            ix._connection().execute("DELETE FROM meta")

    def test_small_bench(self) -> None:
        from bench_sqlite import bench_sqlite

        r = bench_sqlite(20, 500)
        assert r["samples"] == 10_000 and r["members"] == 30_000 and r["file_bytes"] > 0

    @pytest.mark.slow
    def test_one_million_samples(self, request: pytest.FixtureRequest) -> None:
        if "slow" not in (request.config.getoption("markexpr") or ""):
            pytest.skip("~15 s; run with -m slow")
        from bench_sqlite import bench_sqlite

        r = bench_sqlite(1000, 1000)
        print(
            f"\n1M-sample SQLite index: build {r['build_s']:.2f} s, first lookup "
            f"{r['open_to_first_lookup_s'] * 1000:.1f} ms"
        )
        assert r["build_s"] < 30 and r["open_to_first_lookup_s"] < 0.2


def test_open_index_detects_sqlite_by_content(tmp_path: Path) -> None:
    path = tmp_path / "no-suffix"
    with SqliteIndexWriter(path, name="x"):
        pass
    assert isinstance(open_index(str(path)), SqliteIndex)
    shutil.copy(path, tmp_path / "odd.json")
    assert isinstance(open_index(str(tmp_path / "odd.json")), SqliteIndex)


def test_spans_vectorised_match(tmp_path: Path, shards: list[Path]) -> None:
    t = tar_table(shards[1])
    starts, ends = t.spans()
    assert np.array_equal(starts, [t.span(i)[0] for i in range(len(t))])
    assert np.array_equal(ends, [t.span(i)[1] for i in range(len(t))])
