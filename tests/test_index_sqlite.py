"""The SQLite index (``wids.index.sqlitereader``, ``wids.index.sqlitewriter``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from indexcontract import IndexContract, tar_table

from wids import SqliteIndex, SqliteIndexWriter


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
    def test_one_million_samples(self) -> None:
        from bench_sqlite import bench_sqlite

        r = bench_sqlite(1000, 1000)
        print(
            f"\n1M-sample SQLite index: build {r['build_s']:.2f} s, first lookup "
            f"{r['open_to_first_lookup_s'] * 1000:.1f} ms"
        )
        assert r["build_s"] < 30 and r["open_to_first_lookup_s"] < 0.2


def test_dataset_opens_without_reading_every_shard_row(tmp_path: Path) -> None:
    """Rows are read per shard on first use: a damaged row fails only its own shard."""
    from tarfixtures import make_samples, write_shard

    from wids import ShardListDataset
    from wids.errors import IndexFormatError
    from wids.index import ShardInfo

    real = write_shard(tmp_path / "real.tar", make_samples(3))
    table = tar_table(real)
    path = tmp_path / "many.sqlite"
    with SqliteIndexWriter(path) as w:
        w.add(ShardInfo("real.tar", 3, size=real.stat().st_size), table)
        for i in range(1, 50):
            w.add(ShardInfo(f"missing-{i}.tar", 3, size=real.stat().st_size), table)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE shards SET url = X'41' WHERE id = 49")
    conn.close()
    ds = ShardListDataset(str(path), transformations=[])
    assert len(ds) == 150 and ds.lengths == [3] * 50
    assert ds[1]["__key__"] == table.key(1)
    with pytest.raises(IndexFormatError, match="shards row 49"):
        ds[149]
    ix = SqliteIndex(str(path))
    assert ix.nshards == 50 and ix.cumulative_counts()[-1] == 150
    with pytest.raises(IndexFormatError, match="shards row 49"):
        _ = ix.shards  # the whole list is still checked whole
    ds.close()
