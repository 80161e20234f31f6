"""The SQLite index: one file, every shard's members in tables, read one shard at a time.

Schema (version 1; built with sqlite-utils)::

    meta(key TEXT PRIMARY KEY, value TEXT)      format = wids-index-sqlite, version = 1,
                                                name, report (JSON)
    shards(id INTEGER PRIMARY KEY, url, nsamples, size, etag, mtime, md5sum,
           has_members, extra)                  id = position in the dataset; extra is JSON
    components(id INTEGER PRIMARY KEY, name, weight, first_shard, stop_shard)
    fields(id INTEGER PRIMARY KEY, name UNIQUE) field names with their leading dot
    samples(shard_id, idx, key, start, "end")   PRIMARY KEY (shard_id, idx); the byte span
    members(shard_id, sample_idx, field_id, "offset", size)
                                                INDEX members_shard (shard_id, sample_idx);
                                                rowid order is tar order

Shard URLs are stored as given and resolve against the index file's directory (for a remote
index, the remote directory). Keys are TEXT, or BLOB for the rare key that is not valid UTF-8.

Building writes into a temporary file beside the destination with the journal and syncing off,
all rows in one transaction (``executemany``), the members index created at the end; the file
is then published atomically. Serving opens the file read-only and immutable
(``file:...?mode=ro&immutable=1``) and loads one shard's rows with two indexed range queries.
A remote index is downloaded to a private temporary directory first.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import weakref
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import numpy as np

from ..errors import IndexFormatError, NotAnIndexError, UntrustedLocationError
from ..storage import Store, redact_url
from .lastpart import renames, sql_candidates
from .members import ShardMembers
from .model import MAX_NSAMPLES, Component, ShardInfo
from .recognise import HEAD_BYTES, is_index_head
from .sqlitetable import component_from_row, shard_from_row, table_from_rows
from .urls import UrlMap, apply_url_map, check_remote_ref, check_url_map, url_dir

__all__ = ["FORMAT", "SCHEMA_VERSION", "SEEK_SCHEMA_VERSION", "SqliteIndex"]

logger = logging.getLogger(__name__)

FORMAT = "wids-index-sqlite"
"""``meta.format`` of an SQLite index."""
SCHEMA_VERSION = 1
"""``meta.version`` of the schema read here and written by :mod:`wids.index.sqlitewriter`."""
SEEK_SCHEMA_VERSION = 2
"""``meta.version`` of an index with compressed shards: version 1 and a table
``seek(shard_id INTEGER PRIMARY KEY, points BLOB)`` of their seek points
(:meth:`wids.compress.SeekPoints.to_bytes`), which readers of version 1 refuse."""

_KEYS_QUERY = 'SELECT idx, "key" FROM samples WHERE shard_id = ? ORDER BY idx'
_MEMBERS_QUERY = (
    'SELECT sample_idx, field_id, "offset", size FROM members WHERE shard_id = ? '
    "ORDER BY sample_idx, rowid"
)


# Every table the reader queries; each must be a real table (a view can recurse forever).
_TABLES = ("meta", "shards", "components", "fields", "samples", "members")
_COLUMNS = "id, url, nsamples, size, etag, mtime, md5sum, has_members"
_SHARDS_QUERY = f"SELECT {_COLUMNS} FROM shards ORDER BY id"
_SHARD_QUERY = f"SELECT {_COLUMNS} FROM shards WHERE id = ?"


def _remove_tree(path: str, pid: int) -> None:
    # Forked workers inherit the finaliser; only the process that downloaded may delete.
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


class SqliteIndex:
    """An SQLite index, opened read-only.

    The file is opened (and, if remote, downloaded) on first use; the connection is per
    process and not pickled.

    Args:
        url: Path or URL of the index file.
        storage_options: fsspec options for a remote index.
        base: Overrides the directory relative shard URLs resolve against.
        url_map: Prefix rewrites of shard URLs, for mirrors (see
            :func:`wids.index.urls.check_url_map`).
        allow_local_shards: Let an index read from a remote location name local files (refused
            by default; see :func:`wids.index.urls.check_remote_ref`).

    Raises:
        IndexFormatError: (on first use) Not an SQLite index of a known format and version.
        ValueError: ``url_map`` is invalid.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | Store | None = None,
        *,
        base: str | None = None,
        url_map: Mapping[str, str] | UrlMap | None = None,
        allow_local_shards: bool = False,
    ) -> None:
        self.url = os.fspath(url)
        self.store = Store.of(storage_options)
        self.base = base
        self.url_map = check_url_map(url_map)
        self.allow_local_shards = bool(allow_local_shards)
        self._local: str | None = None
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._lock = threading.Lock()
        # meta, sample counts (N + 1 cumulative from 0), components; every row only on demand
        self._state: tuple[dict[str, str], np.ndarray, list[Component]] | None = None
        self._list: tuple[list[ShardInfo], list[bool]] | None = None
        self._fields: list[str] = []
        self._seek = False  # meta.version 2: a table of compressed shards' seek points
        self._meta_read = False
        self._kinds: dict[str, tuple[Any, str]] = {}

    def __repr__(self) -> str:
        return f"SqliteIndex({redact_url(self.url)!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_conn=None, _pid=0, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- opening --------------------------------------------------------------------------

    def _local_path(self) -> str:
        url = self.url
        if url.startswith("file://") or ("://" not in url and "::" not in url):
            # Local: no need to import fsspec (through remote.py) just to open a file.
            return os.path.abspath(os.path.expanduser(url.removeprefix("file://")))
        if self._local is not None and os.path.exists(self._local):
            return self._local
        src = self.store.source(url)
        tmpdir = tempfile.mkdtemp(prefix="wids-index-")
        weakref.finalize(self, _remove_tree, tmpdir, os.getpid())
        dest = os.path.join(tmpdir, "index.sqlite")
        src.download(dest, limit=self.store.limits.sqlite)
        self._local = dest
        return dest

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        with self._lock:
            if self._conn is None or self._pid != os.getpid():
                path = self._local_path()
                if not os.path.exists(path):
                    from ..errors import ShardNotFoundError

                    raise ShardNotFoundError("no such index file", shard=redact_url(self.url))
                uri = f"file:{quote(path)}?mode=ro&immutable=1"
                self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
                self._pid = os.getpid()
        return self._conn

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self._connection().execute(sql, args).fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:  # text that is not UTF-8
            raise self._error(f"not a readable SQLite index: {e}") from None

    def _where(self) -> str:
        return redact_url(self.url)

    def _error(self, message: str) -> IndexFormatError:
        """A damaged index (repairable by a rebuild), or :class:`NotAnIndexError`."""
        try:
            with open(self._local_path(), "rb") as f:
                ours = is_index_head(f.read(HEAD_BYTES), "sqlite")
        except OSError:
            ours = True
        if not ours:
            return NotAnIndexError(f"{message}; not a wids SQLite index", shard=self._where())
        return IndexFormatError(message, shard=self._where())

    def _check_table(self, table: str) -> None:
        """``table`` is a stored table without generated columns."""
        kind, sql = self._kinds.get(table, (None, ""))
        if kind != "table" or sql.lstrip().upper().startswith("CREATE VIRTUAL"):
            what = (
                "missing" if kind is None else "a virtual table" if kind == "table" else f"a {kind}"
            )
            raise self._error(f"{table!r} is {what}, not a table")
        if any(row[-1] for row in self._query(f'PRAGMA table_xinfo("{table}")')):
            raise self._error(f"table {table!r} has generated columns")

    def _check_schema(self) -> None:
        """Refuse views, virtual tables, computed columns and queries that would scan.

        A crafted file could make ``shards`` a recursive view (a query that never ends and fills
        the temporary directory) or give a column a generated value; and without the indexes
        every shard's query would read the whole file. Only stored rows of real tables, found
        through the indexes the writer creates, are read.
        """
        kinds = {
            str(name).lower(): (kind, sql or "")
            for kind, name, sql in self._query("SELECT type, name, sql FROM sqlite_master")
        }
        self._kinds = kinds
        for table in _TABLES:
            self._check_table(table)
        for sql in (_KEYS_QUERY, _MEMBERS_QUERY):
            plan = " ".join(str(r[-1]) for r in self._query("EXPLAIN QUERY PLAN " + sql, (0,)))
            if "SCAN" in plan or "TEMP B-TREE" in plan:
                raise self._error(f"the index lacks its indexes (query plan: {plan})")

    def _load(self) -> tuple[dict[str, str], np.ndarray, list[Component]]:
        """Open: meta, sample counts and components checked; shard rows on demand.

        A remote index (unless local shards are allowed) has every row checked now, so a
        local URL in it is refused before the dataset opens.
        """
        if self._state is not None:
            return self._state
        self._check_schema()
        meta = dict(self._query("SELECT key, value FROM meta"))
        versions = (str(SCHEMA_VERSION), str(SEEK_SCHEMA_VERSION))
        if meta.get("format") != FORMAT or meta.get("version") not in versions:
            raise self._error(
                f"format {meta.get('format')!r} version {meta.get('version')!r}; expected "
                f"{FORMAT!r} version {SCHEMA_VERSION} or {SEEK_SCHEMA_VERSION}"
            )
        if meta["version"] == str(SEEK_SCHEMA_VERSION):
            self._check_table("seek")
            self._seek = True
        self._meta_read = True
        n, lo, hi = self._query("SELECT count(*), min(id), max(id) FROM shards")[0]
        bad = self._query(
            "SELECT id FROM shards WHERE typeof(nsamples) != 'integer' OR nsamples < 0 "
            "OR nsamples > ? ORDER BY id LIMIT 1",
            (MAX_NSAMPLES,),
        )
        if (n and (lo != 0 or hi != n - 1)) or bad or self._untrusted():
            self._all()  # every row checked: raises naming the first bad one
        starts = np.zeros(n + 1, dtype=np.int64)
        try:
            # checked again as read: this query may be answered from another b-tree (the
            # covering index shards_counts) than the check above, and one may be corrupt
            rows = self._connection().execute("SELECT id, nsamples FROM shards ORDER BY id")
            np.cumsum(np.fromiter(self._counts(rows), dtype=np.int64, count=n), out=starts[1:])
        except IndexFormatError:
            raise
        except (sqlite3.DatabaseError, ValueError, TypeError) as e:
            raise self._error(f"not a readable SQLite index: {e}") from None
        comps = [
            self._component(k, row, n)
            for k, row in enumerate(
                self._query(
                    "SELECT id, name, weight, first_shard, stop_shard FROM components ORDER BY id"
                )
            )
        ]
        fields = self._query("SELECT id, name FROM fields ORDER BY id")
        for k, (fid, name) in enumerate(fields):
            if fid != k or type(name) is not str:
                raise self._error(f"fields row {k}: id {fid!r}, name {name!r}; expected id {k}")
        self._fields = [name for _, name in fields]
        self._state = (meta, starts, comps)
        return self._state

    def _counts(self, rows: Iterable[tuple[Any, ...]]) -> Iterator[int]:
        """The ``nsamples`` of ``(id, nsamples)`` rows, each checked (ids 0, 1, ... in order)."""
        for k, (sid, count) in enumerate(rows):
            if sid != k or type(count) is not int or not 0 <= count <= MAX_NSAMPLES:
                raise self._error(
                    f"shards row {k}: id {sid!r}, nsamples {count!r}; expected id {k} and "
                    f"nsamples an integer from 0 to {MAX_NSAMPLES}"
                )
            yield count

    def _untrusted(self) -> bool:
        return check_remote_ref("file:///", self.url, self.allow_local_shards) is not None

    def _all(self) -> tuple[list[ShardInfo], list[bool]]:
        """Every shard row, checked (one object per shard: small indexes, tools)."""
        if self._list is None:
            root = self.base if self.base is not None else url_dir(self.url)
            rows = self._query(_SHARDS_QUERY)
            if self._state is None and not self._meta_read:
                self._load()  # (_load itself calls this after reading meta, which sets _seek)
            packed = {r[0] for r in self._query("SELECT shard_id FROM seek")} if self._seek else ()
            shards = [self._shard(k, row, root, k in packed) for k, row in enumerate(rows)]
            self._list = (apply_url_map(shards, self.url_map), [bool(r[7]) for r in rows])
        return self._list

    def _one(self, shard: int) -> tuple[ShardInfo, bool]:
        """One shard's row, checked, and whether it has members."""
        if self._list is not None:
            return self._list[0][shard], self._list[1][shard]
        n = len(self._load()[1]) - 1
        if not 0 <= shard < n:
            raise IndexError(f"shard {shard} out of range for {n} shards")
        found = self._query(_SHARD_QUERY, (shard,))
        if not found:  # counted, but not there: a corrupt b-tree
            raise self._error(f"shards row {shard} is missing ({n} shards counted)")
        row = found[0]
        root = self.base if self.base is not None else url_dir(self.url)
        packed = self._seek and bool(self._query("SELECT 1 FROM seek WHERE shard_id = ?", (shard,)))
        info = apply_url_map([self._shard(shard, row, root, packed)], self.url_map)[0]
        return info, bool(row[7])

    def shard(self, shard: int) -> ShardInfo:
        """One shard, its row read and checked now (see :meth:`sample_counts`)."""
        return self._one(shard)[0]

    @property
    def nshards(self) -> int:
        """Number of shards."""
        return len(self._load()[1]) - 1

    def sample_counts(self) -> np.ndarray:
        """Samples per shard (int64 array)."""
        return np.diff(self._load()[1])

    def cumulative_counts(self) -> np.ndarray:
        """``N + 1`` cumulative sample counts from 0 (int64 array)."""
        return self._load()[1]

    def _shard(
        self, k: int, row: tuple[Any, ...], root: str, compressed: bool = False
    ) -> ShardInfo:
        """One row of ``shards``, every value checked (the same rules as a JSON description)."""
        info = shard_from_row(k, row, root, self._error, compressed)
        refused = check_remote_ref(info.url, self.url, self.allow_local_shards)
        if refused:
            raise UntrustedLocationError(f"shards row {k}: url {refused}", shard=self._where())
        return info

    def _component(self, k: int, row: tuple[Any, ...], nshards: int) -> Component:
        return component_from_row(k, row, nshards, self._error)

    def total_bytes(self) -> int:
        """Bytes of the shards whose size is recorded (one query, no record per shard)."""
        self._load()
        return int(self._query("SELECT coalesce(sum(size), 0) FROM shards")[0][0])

    def shards_without_members(self) -> int:
        """How many shards were recorded without a member table (one query)."""
        self._load()
        return int(self._query("SELECT count(*) FROM shards WHERE has_members = 0")[0][0])

    def shards_ending(self, names: Collection[str]) -> np.ndarray | None:
        """The shards whose URL, resolved, may have one of ``names`` as its last part.

        One query per distinct length of the names, without a record per shard
        (:mod:`wids.index.lastpart`).

        Args:
            names: Last parts of URLs (no ``/``).

        Returns:
            Sorted shard numbers, a superset of those whose URL has such a last part; ``None``
            when only every shard's record can tell (a ``url_map`` prefix not ending in ``/``).
        """
        if renames(self.url_map):
            return None
        self._load()
        return sql_candidates(self._query, names)

    # -- the reader protocol ----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The dataset's name (``""`` when none)."""
        return self._load()[0].get("name") or ""

    @property
    def shards(self) -> list[ShardInfo]:
        """All shards with resolved URLs (one object each; see :meth:`shard`)."""
        self._load()
        return self._all()[0]

    @property
    def components(self) -> list[Component]:
        """The main shard list and the sub-datasets."""
        return self._load()[2]

    @property
    def report(self) -> dict[str, Any]:
        """The builder's report stored in the index."""
        text = self._load()[0].get("report")
        report = self._json(text, "meta 'report'") if text else {}
        return report if isinstance(report, dict) else {}

    def _json(self, text: Any, what: str) -> Any:
        try:
            return json.loads(text)
        except (TypeError, ValueError, RecursionError) as e:
            raise self._error(f"{what} is not valid JSON: {type(e).__name__}") from None

    @property
    def has_members(self) -> bool:
        """Whether any shard has a member table."""
        self._load()
        return bool(self._query("SELECT 1 FROM shards WHERE has_members != 0 LIMIT 1"))

    def shard_extra(self, shard: int) -> dict[str, Any]:
        """Extra keys recorded for a shard."""
        self._load()
        rows = self._query("SELECT extra FROM shards WHERE id = ?", (shard,))
        if not rows:
            raise IndexError(f"shard {shard} out of range")
        extra = self._json(rows[0][0], f"shards row {shard} 'extra'") if rows[0][0] else {}
        if not isinstance(extra, dict):
            raise self._error(f"shards row {shard} 'extra' is not a JSON object")
        return extra

    def members(self, shard: int) -> ShardMembers | None:
        """Load the member table of one shard (two indexed range queries).

        Returns:
            The table, or ``None`` when the shard was recorded without offsets.

        Raises:
            IndexFormatError: The rows are inconsistent with the shard's entry.
        """
        info, has = self._one(shard)  # IndexError for a bad shard number, like a list
        if not has:
            return None
        keys = self._query(_KEYS_QUERY, (shard,))
        rows = self._query(_MEMBERS_QUERY, (shard,))
        try:
            table = table_from_rows(keys, rows, info.nsamples, self._fields)
            if self._seek:
                found = self._query("SELECT points FROM seek WHERE shard_id = ?", (shard,))
                if found:
                    if not isinstance(found[0][0], bytes):
                        raise IndexFormatError("its seek points are not a blob")
                    from ..compress import SeekPoints

                    table = table.with_seek(SeekPoints.from_bytes(found[0][0]))
            table.check_extent(info.size)
            return table
        except IndexFormatError as e:
            raise self._error(f"shard {shard}: {e.message}") from None

    def close(self) -> None:
        """Close this process's connection (reopened on next use)."""
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            conn.close()

    def __enter__(self) -> SqliteIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
