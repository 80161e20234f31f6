"""The SQLite index writer: all rows in one transaction in a temporary file, published whole.

The schema is described in :mod:`wids.index.sqlitereader`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping
from itertools import pairwise, repeat
from typing import Any

import numpy as np

from .members import ShardMembers
from .model import BaseIndexWriter, ShardInfo, component_rows
from .sqlitereader import FORMAT, SCHEMA_VERSION, SEEK_SCHEMA_VERSION

__all__ = ["SqliteIndexWriter"]


def _keys(members: ShardMembers) -> list[str | bytes]:
    blob, offs = members.key_blob, members.key_offsets.tolist()
    parts = [blob[a:b] for a, b in pairwise(offs)]
    try:
        return [p.decode("utf-8") for p in parts]
    except UnicodeDecodeError:
        out: list[str | bytes] = []
        for p in parts:
            try:
                out.append(p.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(p)
        return out


class SqliteIndexWriter(BaseIndexWriter):
    """Builds an SQLite index in a temporary file and publishes it atomically on :meth:`close`.

    Shards added before any :meth:`start_component` call form the main component (named
    ``name``); each :meth:`start_component` opens a sub-dataset. Use from one thread.

    Args:
        path: Local path of the index to write (conventionally ``*.sqlite``).
        name: The dataset's name.
    """

    records_seek = True

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        super().__init__(path, name=name)
        self._tmp: Any = None
        self._db: Any = None
        self._nshards = 0
        self._has_seek = False
        self._field_ids: dict[str, int] = {}
        self._components: list[tuple[str, float | None, int]] = [(name or "", None, 0)]

    def _open(self) -> sqlite3.Connection:
        if self._db is not None:
            conn: sqlite3.Connection = self._db.conn
            return conn
        import sqlite_utils

        from ..atomic import TempFile

        self._tmp = TempFile(os.path.dirname(self.path), os.path.basename(self.path))
        conn = sqlite3.connect(self._tmp.path, isolation_level=None)
        for pragma in ("journal_mode = OFF", "synchronous = OFF", "cache_size = -262144"):
            conn.execute(f"PRAGMA {pragma}")
        db = sqlite_utils.Database(conn)
        db.table("meta").create({"key": str, "value": str}, pk="key")
        db.table("shards").create(
            {
                "id": int,
                "url": str,
                "nsamples": int,
                "size": int,
                "etag": str,
                "mtime": float,
                "md5sum": str,
                "has_members": int,
                "extra": str,
            },
            pk="id",
            not_null=["url", "nsamples", "has_members"],
        )
        db.table("components").create(
            {"id": int, "name": str, "weight": float, "first_shard": int, "stop_shard": int},
            pk="id",
            not_null=["name", "first_shard", "stop_shard"],
        )
        db.table("fields").create({"id": int, "name": str}, pk="id", not_null=["name"])
        db.table("fields").create_index(["name"], unique=True)
        db.table("samples").create(
            {"shard_id": int, "idx": int, "key": str, "start": int, "end": int},
            pk=("shard_id", "idx"),
        )
        db.table("members").create(
            {"shard_id": int, "sample_idx": int, "field_id": int, "offset": int, "size": int}
        )
        conn.execute("BEGIN")
        self._db = db
        return conn

    def _start_component(self, name: str, weight: float | None) -> None:
        self._components.append((name, weight, self._nshards))

    def _add(
        self, info: ShardInfo, members: ShardMembers | None, extra: Mapping[str, Any] | None
    ) -> None:
        conn = self._open()
        sid = self._nshards
        conn.execute(
            "INSERT INTO shards VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                sid,
                info.url,
                info.nsamples,
                info.size,
                info.etag,
                info.mtime,
                info.md5sum,
                int(members is not None),
                json.dumps(dict(extra)) if extra else None,
            ),
        )
        self._nshards += 1
        if members is None or len(members) == 0:
            return
        if members.seek is not None:  # a compressed shard: its seek points, in a table of them
            if not self._has_seek:
                conn.execute("CREATE TABLE seek (shard_id INTEGER PRIMARY KEY, points BLOB)")
                self._has_seek = True
            conn.execute("INSERT INTO seek VALUES (?, ?)", (sid, members.seek.to_bytes()))
        starts, ends = members.spans()
        conn.executemany(
            "INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
            zip(repeat(sid), range(len(members)), _keys(members), starts.tolist(), ends.tolist()),
        )
        gmap = np.array([self._field_id(conn, f) for f in members.fields], dtype=np.int64)
        sidx = np.repeat(np.arange(len(members)), np.diff(members.sample_start))
        conn.executemany(
            "INSERT INTO members VALUES (?, ?, ?, ?, ?)",
            zip(
                repeat(sid),
                sidx.tolist(),
                gmap[members.member_field].tolist(),
                members.member_offset.tolist(),
                members.member_size.tolist(),
            ),
        )

    def _field_id(self, conn: sqlite3.Connection, name: str) -> int:
        fid = self._field_ids.get(name)
        if fid is None:
            fid = self._field_ids[name] = len(self._field_ids)
            conn.execute("INSERT INTO fields VALUES (?, ?)", (fid, name))
        return fid

    def close(self) -> None:
        """Finish the tables and indexes and publish the file atomically."""
        if self._closed:
            return
        conn = self._open()
        self._closed = True
        try:
            comps = component_rows(self._components, self._nshards)
            conn.executemany(
                "INSERT INTO components VALUES (?, ?, ?, ?, ?)",
                [(i, *c) for i, c in enumerate(comps)],
            )
            meta = {
                "format": FORMAT,
                # with compressed shards, a version readers of version 1 refuse
                "version": str(SEEK_SCHEMA_VERSION if self._has_seek else SCHEMA_VERSION),
                "report": json.dumps(self._report),
            }
            if self.name is not None:
                meta["name"] = self.name
            conn.executemany("INSERT INTO meta VALUES (?, ?)", list(meta.items()))
            conn.execute("CREATE INDEX members_shard ON members (shard_id, sample_idx)")
            # Opening reads every shard's count: from this small index, not from rows whose
            # extra keys (metadata columns) can fill a page each (9x slower at 2,000 shards).
            conn.execute("CREATE INDEX shards_counts ON shards (id, nsamples)")
            conn.execute("COMMIT")
            conn.close()
            self._tmp.publish(self.path)
        except BaseException:
            self._discard()
            raise

    def abort(self) -> None:
        """Give up: remove the temporary file; the destination is untouched."""
        self._closed = True
        self._discard()

    def _discard(self) -> None:
        if self._db is not None:
            self._db.conn.close()
        if self._tmp is not None:
            self._tmp.close()
