"""One contract for both index backends (JSON + sidecars, SQLite): subclassed per backend.

``tests/test_index_json.py`` and ``tests/test_index_sqlite.py`` run it, with what is specific
to each backend. Not collected itself (no ``test_`` prefix).
"""

from __future__ import annotations

import os
import pickle
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarfixtures import make_samples, write_shard

from wids import (
    Component,
    ShardInfo,
    ShardMembers,
    convert_index,
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


class IndexContract:
    """What every backend must do; subclasses set the suffix and the classes."""

    suffix = ""
    other_suffix = ""
    Writer: Any = None
    Reader: Any = None

    @pytest.fixture
    def shards(self, tmp_path: Path) -> list[Path]:
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
