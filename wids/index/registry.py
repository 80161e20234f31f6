"""The index backends in one place: which reader opens a file, which writer writes a path.

- Reading: :func:`open_index` looks at the file's first bytes; an SQLite file and a shard-table
  file (:mod:`wids.index.tableformat`) are recognised by their magic, anything else is read as
  a JSON description (ours or the reference's). A remote ``*.json`` is read whole with one
  request, which the JSON reader then parses (no separate request for the first bytes).
- Writing: :func:`create_index_writer` goes by the path's ending, ``*.json`` for JSON, one
  of :data:`SQLITE_SUFFIXES` for SQLite and ``*.widx`` for the shard table (the format for
  10^5 shards and more: opening it costs no Python object per shard); :func:`writer_for` is
  the same choice without creating anything, for checks made before any work (``wids index
  create`` refuses an output it could not write before scanning a shard).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..storage import Store, is_remote, local_path, named_by
from .jsonreader import JsonIndex
from .jsonwriter import JsonIndexWriter
from .model import IndexReader, IndexWriter
from .spec import read_bytes
from .tableformat import MAGIC as TABLE_MAGIC
from .tableformat import TABLE_SUFFIXES
from .tablereader import TableIndex

if TYPE_CHECKING:  # imported where used: a dataset opening a JSON index needs neither (sqlite3)
    from .sqlitewriter import SqliteIndexWriter
    from .tablewriter import TableIndexWriter

__all__ = [
    "INDEX_SUFFIXES",
    "SQLITE_MAGIC",
    "SQLITE_SUFFIXES",
    "create_index_writer",
    "is_sqlite_name",
    "is_table_name",
    "open_index",
    "writer_for",
]

SQLITE_MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite file."""
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
"""File name endings that select the SQLite backend; ``.json`` selects JSON."""

_Writer = type[JsonIndexWriter] | type["SqliteIndexWriter"] | type["TableIndexWriter"]
_WRITERS: tuple[tuple[tuple[str, ...], str, str], ...] = (  # suffixes, module, class
    ((".json",), "jsonwriter", "JsonIndexWriter"),
    (SQLITE_SUFFIXES, "sqlitewriter", "SqliteIndexWriter"),
    (TABLE_SUFFIXES, "tablewriter", "TableIndexWriter"),
)
INDEX_SUFFIXES: tuple[str, ...] = tuple(s for suffixes, _, _ in _WRITERS for s in suffixes)
"""Every file name ending that selects an index backend."""


def _name(path: str | os.PathLike[str]) -> str:
    name = os.fspath(path).lower()
    return name.split("?", 1)[0] if "://" in name else name  # never a query string


def writer_for(path: str | os.PathLike[str]) -> _Writer:
    """The writer class that ``path``'s ending selects.

    Raises:
        ValueError: The ending selects no backend.
    """
    name = _name(path)
    for suffixes, module, cls in _WRITERS:
        if name.endswith(suffixes):
            found: _Writer = getattr(importlib.import_module(f".{module}", __package__), cls)
            return found
    raise ValueError(f"{path}: name the index one of {', '.join(INDEX_SUFFIXES)}")


def is_sqlite_name(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s ending selects the SQLite backend."""
    return _name(path).endswith(SQLITE_SUFFIXES)


def is_table_name(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s ending selects the shard-table backend."""
    return _name(path).endswith(TABLE_SUFFIXES)


def create_index_writer(path: str | os.PathLike[str], *, name: str | None = None) -> IndexWriter:
    """A writer of a local index file, for the backend that ``path``'s ending selects.

    The low-level form of :func:`wids.write_index` (which also checks the output before
    writing, locks it, and writes to any fsspec URL): shards are added in dataset order with
    ``add``, and the index is published atomically by ``close`` (or by leaving a ``with``
    block; an error in the block publishes nothing).

    Args:
        path: A local path (or ``file://`` URL): ``*.json`` for JSON, ``*.sqlite`` /
            ``*.sqlite3`` / ``*.db`` for SQLite, ``*.widx`` for the shard table.
        name: The dataset's name.

    Returns:
        The writer.

    Raises:
        ValueError: The ending selects no backend.
        DestinationError: ``path`` is a remote URL (use :func:`wids.write_index`).
    """
    local = os.fspath(path)
    if is_remote(local):
        from ..errors import DestinationError
        from ..storage import redact_url

        raise DestinationError(
            "index writers write local files; write to a URL with wids.write_index",
            shard=redact_url(local),
        )
    return writer_for(local)(local_path(local), name=name)


def open_index(
    url: str,
    storage_options: Mapping[str, Any] | Store | None = None,
    *,
    url_map: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> IndexReader:
    """Open an index or dataset description, choosing the backend from its content.

    SQLite and shard-table files are recognised by their magic bytes; anything else is read
    as a JSON description (ours, or the reference ``wids-shard-index-v1``).

    Args:
        url: Path or URL of the index.
        storage_options: fsspec options for remote URLs.
        url_map: Read shards from a mirror: ``{"https://old/": "s3://new/"}`` replaces the
            longest matching prefix of each resolved shard URL (see
            :func:`wids.index.urls.check_url_map`). A mapped shard is checked by size and member
            headers; the etag and mtime recorded at the old location are not compared.
        **kwargs: Passed to the backend (``base``, ``allow_local_shards``: let an index read
            from a remote location name local files, refused by default).

    Returns:
        The opened index.

    Raises:
        ValueError: ``url_map`` is invalid.
    """
    if url_map:
        from .urls import check_url_map

        kwargs["url_map"] = check_url_map(url_map)  # before any I/O
    from ..errors import RangeNotSupportedError, ShortReadError

    store = Store.of(storage_options, named=named_by(url, kwargs.get("base"), url_map))
    if is_remote(url) and _name(url).endswith(".json"):
        return _opened_whole(url, store, kwargs)
    src = store.source(url)
    try:
        head = src.read_range(0, 16)
    except ShortReadError:  # under 16 bytes: not SQLite; the JSON reader says what it is
        head = b""
    except RangeNotSupportedError:
        # A server that ignores Range (``python -m http.server``): the file is read whole
        # (bounded), as a remote ``.json`` is, so that a description under another name opens
        # and anything else is said to be no index, not a server fault.
        return _opened_whole(url, store, kwargs)
    finally:
        src.close()
    if head == SQLITE_MAGIC:
        from .sqlitereader import SqliteIndex

        return SqliteIndex(url, store, **kwargs)
    if head[: len(TABLE_MAGIC)] == TABLE_MAGIC:
        return TableIndex(url, store, **kwargs)
    return JsonIndex(url, store, **kwargs)


def _opened_whole(url: str, store: Store, kwargs: dict[str, Any]) -> IndexReader:
    """The index at a remote ``url``, recognised from the whole file (one bounded request)."""
    data = read_bytes(url, store)  # a JSON reader reads it whole anyway: one round trip
    if data[:16] == SQLITE_MAGIC:
        from .sqlitereader import SqliteIndex

        return SqliteIndex(url, store, **kwargs)
    if data[: len(TABLE_MAGIC)] == TABLE_MAGIC:
        return TableIndex(url, store, **kwargs)
    return JsonIndex(url, store, data=data, **kwargs)
