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
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import numpy as np

from ..errors import IndexFormatError, UntrustedLocationError
from ..storage import Store, redact_url
from .members import ShardMembers
from .model import MAX_SHARD_SIZE, Component, ShardInfo, max_samples
from .urls import UrlMap, apply_url_map, check_remote_ref, check_url_map, resolve_url, url_dir

__all__ = ["FORMAT", "SCHEMA_VERSION", "SqliteIndex"]

logger = logging.getLogger(__name__)

FORMAT = "wids-index-sqlite"
"""``meta.format`` of an SQLite index."""
SCHEMA_VERSION = 1
"""``meta.version`` of the schema read here and written by :mod:`wids.index.sqlitewriter`."""

_KEYS_QUERY = 'SELECT idx, "key" FROM samples WHERE shard_id = ? ORDER BY idx'
_MEMBERS_QUERY = (
    'SELECT sample_idx, field_id, "offset", size FROM members WHERE shard_id = ? '
    "ORDER BY sample_idx, rowid"
)


# Every table the reader queries; each must be a real table (a view can recurse forever).
_TABLES = ("meta", "shards", "components", "fields", "samples", "members")
_SHARDS_QUERY = (
    "SELECT id, url, nsamples, size, etag, mtime, md5sum, has_members FROM shards ORDER BY id"
)


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
        self._state: tuple[dict[str, str], list[ShardInfo], list[bool], list[Component]] | None
        self._state = None
        self._fields: list[str] = []

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
        src.download(dest)
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
        except sqlite3.DatabaseError as e:
            raise IndexFormatError(
                f"not a readable SQLite index: {e}", shard=self._where()
            ) from None

    def _where(self) -> str:
        return redact_url(self.url)

    def _error(self, message: str) -> IndexFormatError:
        return IndexFormatError(message, shard=self._where())

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
        for table in _TABLES:
            kind, sql = kinds.get(table, (None, ""))
            if kind != "table" or sql.lstrip().upper().startswith("CREATE VIRTUAL"):
                what = (
                    "missing"
                    if kind is None
                    else "a virtual table"
                    if kind == "table"
                    else f"a {kind}"
                )
                raise self._error(f"{table!r} is {what}, not a table: not a wids SQLite index")
            if any(row[-1] for row in self._query(f'PRAGMA table_xinfo("{table}")')):
                raise self._error(f"table {table!r} has generated columns: not a wids index")
        for sql in (_KEYS_QUERY, _MEMBERS_QUERY):
            plan = " ".join(str(r[-1]) for r in self._query("EXPLAIN QUERY PLAN " + sql, (0,)))
            if "SCAN" in plan or "TEMP B-TREE" in plan:
                raise self._error(f"the index lacks its indexes (query plan: {plan})")

    def _load(self) -> tuple[dict[str, str], list[ShardInfo], list[bool], list[Component]]:
        if self._state is not None:
            return self._state
        self._check_schema()
        meta = dict(self._query("SELECT key, value FROM meta"))
        if meta.get("format") != FORMAT or meta.get("version") != str(SCHEMA_VERSION):
            raise self._error(
                f"format {meta.get('format')!r} version {meta.get('version')!r}; expected "
                f"{FORMAT!r} version {SCHEMA_VERSION}"
            )
        root = self.base if self.base is not None else url_dir(self.url)
        rows = self._query(_SHARDS_QUERY)
        shards = [self._shard(k, row, root) for k, row in enumerate(rows)]
        shards = apply_url_map(shards, self.url_map)
        has = [bool(r[7]) for r in rows]
        comps = [
            self._component(k, row, len(shards))
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
        self._state = (meta, shards, has, comps)
        return self._state

    def _shard(self, k: int, row: tuple[Any, ...], root: str) -> ShardInfo:
        """One row of ``shards``, every value checked (the same rules as a JSON description)."""
        sid, url, n, size, etag, mtime, md5, has = row
        if not (
            sid == k
            and type(sid) is int
            and type(url) is str
            and url
            and type(n) is int
            and (size is None or (type(size) is int and 0 <= size < MAX_SHARD_SIZE))
            and 0 <= n <= max_samples(size)
            and (etag is None or type(etag) is str)
            and (md5 is None or type(md5) is str)
            and (mtime is None or (type(mtime) in (int, float) and abs(mtime) < MAX_SHARD_SIZE))
            and has in (0, 1)
        ):
            shown = ", ".join(repr(v)[:80] for v in row)
            raise self._error(
                f"shards row {k} ({shown}): expected id {k}, a url, 0 <= nsamples <= "
                f"{max_samples(size) if type(size) is int else 'the most its size allows'}, "
                "size in [0, 2**62) or NULL, text etag/md5sum, a finite mtime, has_members 0/1"
            )
        resolved = resolve_url(url, root)
        refused = check_remote_ref(resolved, self.url, self.allow_local_shards)
        if refused:
            raise UntrustedLocationError(f"shards row {k}: url {refused}", shard=self._where())
        return ShardInfo(resolved, n, size, etag, None if mtime is None else float(mtime), md5)

    def _component(self, k: int, row: tuple[Any, ...], nshards: int) -> Component:
        cid, name, weight, first, stop = row
        if not (
            cid == k
            and (name is None or type(name) is str)
            and (weight is None or (type(weight) in (int, float) and 0 <= weight < 2**62))
            and type(first) is int
            and type(stop) is int
            and 0 <= first <= stop <= nshards
        ):
            shown = ", ".join(repr(v)[:80] for v in row)
            raise self._error(
                f"components row {k} ({shown}): expected id {k}, a name, a weight >= 0 or NULL "
                f"and 0 <= first_shard <= stop_shard <= {nshards}"
            )
        return Component(name or "", None if weight is None else float(weight), first, stop)

    # -- the reader protocol ----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The dataset's name (``""`` when none)."""
        return self._load()[0].get("name") or ""

    @property
    def shards(self) -> list[ShardInfo]:
        """All shards with resolved URLs."""
        return self._load()[1]

    @property
    def components(self) -> list[Component]:
        """The main shard list and the sub-datasets."""
        return self._load()[3]

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
        return any(self._load()[2])

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
        _, shards, has, _ = self._load()
        info = shards[shard]  # IndexError for a bad shard number, like a list
        if not has[shard]:
            return None
        keys = self._query(_KEYS_QUERY, (shard,))
        rows = self._query(_MEMBERS_QUERY, (shard,))
        try:
            table = _table(keys, rows, info.nsamples, self._fields)
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


def _table(
    keys: list[tuple[Any, Any]], rows: list[tuple[Any, ...]], nsamples: int, names: list[str]
) -> ShardMembers:
    """Build a :class:`ShardMembers` from ``(idx, key)`` and ``(sample, field, offset, size)`` rows.

    Every value is checked (ids in range, integers only) before it sizes an array.
    """
    if len(keys) != nsamples:
        raise IndexFormatError(f"{len(keys)} sample rows for {nsamples} samples")
    if any(idx != i or type(k) not in (str, bytes) for i, (idx, k) in enumerate(keys)):
        raise IndexFormatError(f"sample rows must be numbered 0..{nsamples - 1} with text keys")
    if not rows:
        if nsamples:
            raise IndexFormatError(f"no member rows for {nsamples} samples")
        zero = np.zeros(1, dtype=np.int64)
        return ShardMembers([], b"", zero, zero, np.zeros(0), np.zeros(0), np.zeros(0))
    cols = np.array(rows)
    if cols.ndim != 2 or cols.shape[1] != 4 or cols.dtype.kind != "i":
        raise IndexFormatError("member rows must hold integers only (no NULL, text or real)")
    cols = cols.astype(np.int64, copy=False)
    sidx, gfield = cols[:, 0], cols[:, 1]
    if int(sidx[0]) < 0 or int(sidx[-1]) >= nsamples:  # sorted by the query
        raise IndexFormatError(f"member rows name samples outside 0..{nsamples - 1}")
    if int(gfield.min()) < 0 or int(gfield.max()) >= len(names):
        raise IndexFormatError(f"member rows name field ids outside 0..{len(names) - 1}")
    counts = np.bincount(sidx, minlength=nsamples)
    if not counts.all():
        raise IndexFormatError(f"member rows do not cover samples 0..{nsamples - 1}")
    sample_start = np.zeros(nsamples + 1, dtype=np.int64)
    np.cumsum(counts, out=sample_start[1:])
    blobs = [k if isinstance(k, bytes) else k.encode("utf-8", "surrogateescape") for _, k in keys]
    key_offsets = np.zeros(nsamples + 1, dtype=np.int64)
    np.cumsum([len(k) for k in blobs], out=key_offsets[1:])
    # Field ids are global to the file; a table numbers its own fields by first appearance.
    uniq, first = np.unique(gfield, return_index=True)
    order = np.argsort(first)
    lut = np.zeros(int(uniq.max()) + 1, dtype=np.int64)
    lut[uniq[order]] = np.arange(len(uniq), dtype=np.int64)
    return ShardMembers(
        fields=[names[int(g)] for g in uniq[order]],
        key_blob=b"".join(blobs),
        key_offsets=key_offsets,
        sample_start=sample_start,
        member_field=lut[gfield],
        member_offset=np.ascontiguousarray(cols[:, 2]),
        member_size=np.ascontiguousarray(cols[:, 3]),
    )
