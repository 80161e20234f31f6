"""Whether a file is an index at all, from its first bytes: a wids index or a reference one.

Two uses: :func:`wids.index.output.check_output` replaces only a file that is recognisably
an index (a damaged one included: rebuilding repairs it), never a user's JSON config or
database that merely has the name; and a reader that fails on a file that never was an index
says so (:class:`~wids.errors.NotAnIndexError`) instead of suggesting a rebuild over it.

What counts, by the first :data:`HEAD_BYTES` bytes:

- JSON: an object whose top-level keys (read in order, up to where the head ends) include
  ``"__kind__": "wids-shard-index-v1"``, a ``"wids_index"`` object of format
  ``wids-index-json``, or both ``"wids_version"`` and ``"shardlist"`` (a list). A key nested
  deeper (``{"model": {"shardlist": ...}}``) does not count.
- SQLite: the SQLite magic and, in the head, the ``meta.format`` value ``wids-index-sqlite``
  (``meta`` is the writer's first table, so its rows sit in the file's first pages).
- shard table (``*.widx``): its magic.
"""

from __future__ import annotations

import json

__all__ = [
    "HEAD_BYTES",
    "SQLITE_FORMAT",
    "SQLITE_MAGIC",
    "TABLE_MAGIC",
    "is_index_head",
    "named_members_dir",
]

HEAD_BYTES = 65536
"""How many bytes of a file are looked at."""
SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_FORMAT = b"wids-index-sqlite"
"""``meta.format`` of an SQLite index (:data:`wids.index.sqlitereader.FORMAT`)."""
TABLE_MAGIC = b"WIDSTBL\x00"
"""The first bytes of a shard-table index (:data:`wids.index.tableformat.MAGIC`)."""

_KIND = "wids-shard-index-v1"
_JSON_FORMAT = "wids-index-json"
_WHITESPACE = " \t\r\n"


def is_index_head(head: bytes, kind: str) -> bool:
    """Whether ``head`` (a file's first bytes) is that of an index of ``kind``.

    Args:
        head: The first bytes (at most :data:`HEAD_BYTES` are looked at).
        kind: ``"json"``, ``"sqlite"`` or ``"table"``: the backend the name selects.
    """
    head = head[:HEAD_BYTES]
    if kind == "table":
        return head.startswith(TABLE_MAGIC)
    if kind == "sqlite":
        return head.startswith(SQLITE_MAGIC) and SQLITE_FORMAT in head
    return _json_is_index(head)


def named_members_dir(head: bytes | None) -> str | None:
    """The members directory a wids JSON index (its first bytes) names as its own, if any.

    ``wids_index.members_dir``, which wids writes before the shard list: the directory wids
    made beside that index, whose stale sidecars a rebuild may remove. ``None`` for anything
    else (no file, another kind of file, a reference index, an index of an older wids).
    """
    if not head:
        return None
    keys = _top_level(
        head[:HEAD_BYTES].decode("utf-8", errors="replace").lstrip("\ufeff" + _WHITESPACE)
    )
    meta = keys.get("wids_index")
    if not (isinstance(meta, dict) and meta.get("format") == _JSON_FORMAT):
        return None
    named = meta.get("members_dir")
    return named if isinstance(named, str) else None


def _json_is_index(head: bytes) -> bool:
    keys = _top_level(head.decode("utf-8", errors="replace").lstrip("\ufeff" + _WHITESPACE))
    if keys.get("__kind__") == _KIND:
        return True
    meta = keys.get("wids_index")
    if isinstance(meta, dict) and meta.get("format") == _JSON_FORMAT:
        return True
    return "wids_version" in keys and keys.get("shardlist") is list


def _top_level(text: str) -> dict[str, object]:
    """The top-level keys of a JSON object and their values, as far as ``text`` goes.

    A value cut off by the end of ``text`` ends the walk; a ``shardlist`` value is recorded as
    ``list`` when it starts with ``[``, without being decoded.
    """
    out: dict[str, object] = {}
    if not text.startswith("{"):
        return out
    decoder = json.JSONDecoder()
    i = 1
    try:
        while True:
            i = _skip(text, i)
            if text.startswith("}", i):
                return out
            key, i = decoder.raw_decode(text, i)
            i = _skip(text, i)
            if not isinstance(key, str) or not text.startswith(":", i):
                return out
            i = _skip(text, i + 1)
            if key == "shardlist":
                out[key] = list if text.startswith("[", i) else None
            value, i = decoder.raw_decode(text, i)
            if key != "shardlist":
                out[key] = value
            i = _skip(text, i)
            if not text.startswith(",", i):
                return out
            i += 1
    except (ValueError, RecursionError):  # cut off by the end of the head, or not JSON
        return out


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i
