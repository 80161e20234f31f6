"""The shard-table index (``*.widx``): one file, flat arrays, member tables packed per shard.

Why this format: at 10^6 shards a JSON description or an SQLite table costs a Python object
(or a row turned into one) per shard at open, hundreds of MB and seconds in every process.
Here everything per shard is a column of fixed-width numbers or an offset into a byte blob,
so opening maps the file (``mmap``, shared by every DataLoader worker and every process on
the machine through the page cache) and checks the columns the index lookup needs with a few
vectorised passes; everything else about a shard (its URL, fingerprint, extra keys, member
table) is decoded and checked when that shard is first used. One file, not a directory of
``.npy`` files, so it is published with one atomic rename (or one upload), and member tables
are written as the builder goes (streamed into the file) without holding them in memory.

Layout (little-endian)::

    0   8 bytes  MAGIC  ``WIDSTBL`` and a zero byte
    8   uint64   offset of the header (JSON, UTF-8)
    16  uint64   length of the header
    24  ...      member tables, then the columns (each 64-byte aligned), then the header

The header: ``{"format": "wids-shard-table", "version": 1, "name": ..., "nshards": N,
"components": [{"name", "weight", "first_shard", "stop_shard"}], "report": {...},
"columns": {name: [offset, nbytes, dtype]}}``. Columns (:data:`COLUMNS`): ``nsamples`` and
``cum`` (N + 1 cumulative counts from 0) are checked against each other at open; ``flags``
says which optional values a shard has (:data:`HAS_SIZE` ...); strings (``url``, ``etag``,
``md5``, ``extra`` as JSON) are ``<name>_blob`` bytes with ``<name>_off`` (N + 1 offsets);
``mem_off``/``mem_len`` locate each shard's member table. Optional columns may be absent
(then no shard has that value).

A member table (:func:`encode_members`): ``MEMBERS_MAGIC``, then uint64 ``n`` (samples),
``m`` (members), key bytes, fields-JSON bytes; then ``key_offsets`` and ``sample_start``
(int64, n + 1 each), ``member_offset`` and ``member_size`` (int64, m each), ``member_field``
(uint16, m), the keys and the fields (a JSON list of strings). Its length must be exactly
what those counts say before any array is made; :class:`~wids.index.members.ShardMembers`
then checks every value.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from .members import ShardMembers
from .model import Component

__all__ = [
    "COLUMNS",
    "FORMAT",
    "HAS_ETAG",
    "HAS_EXTRA",
    "HAS_MD5",
    "HAS_MEMBERS",
    "HAS_MTIME",
    "HAS_SIZE",
    "IS_COMPRESSED",
    "MAGIC",
    "MAX_HEADER",
    "PREAMBLE",
    "SEEK_MEMBERS_MAGIC",
    "SEEK_VERSION",
    "STRINGS",
    "TABLE_SUFFIXES",
    "VERSION",
    "decode_members",
    "encode_members",
    "parse_components",
]

MAGIC = b"WIDSTBL\x00"
"""The first 8 bytes of every shard-table index."""
FORMAT = "wids-shard-table"
VERSION = 1
SEEK_VERSION = 2
"""The header's version when some shard is compressed: its member table starts with
:data:`SEEK_MEMBERS_MAGIC` and ends with the shard's seek points
(:meth:`wids.compress.SeekPoints.to_bytes`); readers of version 1 refuse both."""
TABLE_SUFFIXES = (".widx",)
"""File name endings that select this backend."""
PREAMBLE = struct.Struct("<8sQQ")
"""Magic, header offset, header length."""
MAX_HEADER = 64 << 20
"""The header (name, components, report, column table) is at most this many bytes."""
MAX_EXTRA = 1 << 20
"""A shard's extra keys (as JSON, UTF-8) take at most this; readers refuse more."""
MEMBERS_MAGIC = b"WIDSMEM\x00"
SEEK_MEMBERS_MAGIC = b"WIDSMEMZ"
_MEMBERS_HEAD = struct.Struct("<8sQQQQ")

# bits of the ``flags`` column: which optional values a shard has
HAS_SIZE = 1
HAS_ETAG = 2
HAS_MTIME = 4
HAS_MD5 = 8
HAS_MEMBERS = 16
HAS_EXTRA = 32
IS_COMPRESSED = 64
"""A compressed shard (version 2): its sample count is bounded by its tar's size, in its
member table's seek points, not by the file's ``size``."""
STRINGS = ("url", "etag", "md5", "extra")
"""String columns: ``<name>_blob`` (bytes) and ``<name>_off`` (N + 1 offsets)."""

# name -> (dtype, length: "n" per shard, "n1" N + 1, "blob" any), required
COLUMNS: dict[str, tuple[str, str, bool]] = {
    "nsamples": ("<i8", "n", True),
    "cum": ("<i8", "n1", True),
    "flags": ("|u1", "n", True),
    "size": ("<i8", "n", False),
    "mtime": ("<f8", "n", False),
    "mem_off": ("<i8", "n", False),
    "mem_len": ("<i8", "n", False),
    **{f"{s}_off": ("<i8", "n1", s == "url") for s in STRINGS},
    **{f"{s}_blob": ("|u1", "blob", s == "url") for s in STRINGS},
}


def parse_components(value: Any, nshards: int) -> list[Component]:
    """The header's components, which must cover ``[0, nshards)`` in order.

    Raises:
        IndexFormatError: They are malformed or do not cover the shards.
    """
    if not isinstance(value, list) or not value or len(value) > nshards + 1:
        raise IndexFormatError("'components' must be a non-empty list, one per sub-dataset")
    out, at = [], 0
    for k, c in enumerate(value):
        ok = isinstance(c, dict) and isinstance(c.get("name"), str)
        weight = c.get("weight") if ok else None
        first, stop = (c.get("first_shard"), c.get("stop_shard")) if ok else (None, None)
        if not (
            ok
            and (weight is None or (type(weight) in (int, float) and weight == weight))
            and type(first) is int
            and type(stop) is int
            and first == at
            and first <= stop <= nshards
        ):
            raise IndexFormatError(f"components[{k}] is malformed or out of order: {c!r:.200}")
        out.append(Component(c["name"], None if weight is None else float(weight), first, stop))
        at = stop
    if at != nshards:
        raise IndexFormatError(f"components cover {at} of {nshards} shards")
    return out


def encode_members(members: ShardMembers) -> bytes:
    """One member table as bytes (see the module docstring)."""
    fields = json.dumps(list(members.fields), ensure_ascii=False).encode("utf-8")
    n, m = len(members), members.nmembers
    magic = MEMBERS_MAGIC if members.seek is None else SEEK_MEMBERS_MAGIC
    head = _MEMBERS_HEAD.pack(magic, n, m, len(members.key_blob), len(fields))
    parts = [
        head,
        members.key_offsets.astype("<i8").tobytes(),
        members.sample_start.astype("<i8").tobytes(),
        members.member_offset.astype("<i8").tobytes(),
        members.member_size.astype("<i8").tobytes(),
        members.member_field.astype("<u2").tobytes(),
        members.key_blob,
        fields,
    ]
    if members.seek is not None:
        parts.append(members.seek.to_bytes())
    return b"".join(parts)


def decode_members(buf: bytes | memoryview) -> ShardMembers:
    """Inverse of :func:`encode_members`, checking every length before making an array.

    Raises:
        IndexFormatError: The bytes are not a member table, or its values are inconsistent.
    """
    size = len(buf)
    if size < _MEMBERS_HEAD.size:
        raise IndexFormatError(f"member table of {size} bytes is truncated")
    magic, n, m, nkeys, nfields = _MEMBERS_HEAD.unpack_from(buf, 0)
    if magic not in (MEMBERS_MAGIC, SEEK_MEMBERS_MAGIC):
        raise IndexFormatError("member table does not start with its magic bytes")
    want = _MEMBERS_HEAD.size + 16 * (n + 1) + 18 * m + nkeys + nfields
    seek = None
    if magic == SEEK_MEMBERS_MAGIC and want < size:  # a compressed shard's: seek points follow
        from ..compress import SeekPoints

        seek = SeekPoints.from_bytes(bytes(buf[want:]))
        size = want
    if want != size:
        raise IndexFormatError(
            f"member table of {size} bytes, but its counts ({n} samples, {m} members) need {want}"
        )
    at = _MEMBERS_HEAD.size

    def take(dtype: str, count: int) -> np.ndarray:
        nonlocal at
        arr = np.frombuffer(buf, dtype=dtype, count=count, offset=at)
        at += arr.nbytes
        return arr.astype(np.int64) if dtype == "<i8" else arr

    key_offsets, sample_start = take("<i8", n + 1), take("<i8", n + 1)
    member_offset, member_size = take("<i8", m), take("<i8", m)
    member_field = take("<u2", m)
    key_blob = bytes(buf[at : at + nkeys])
    try:
        fields = json.loads(bytes(buf[at + nkeys : at + nkeys + nfields]))
    except (ValueError, RecursionError):
        raise IndexFormatError("member table fields are not valid JSON") from None
    if not isinstance(fields, list):
        raise IndexFormatError("member table fields must be a list")
    return ShardMembers(
        fields, key_blob, key_offsets, sample_start, member_field, member_offset, member_size, seek
    )
