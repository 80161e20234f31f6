"""A member sidecar parsed straight into arrays, when it is in the form the writer gives it.

A DataLoader worker (not persistent) reads the sidecar of every shard it touches, every
epoch; ``json.loads`` of a 1,000-sample sidecar makes ~11,000 Python objects that numpy then
copies into arrays (~1.5 ms, most of a worker's first touch of a shard). The writer
(:func:`wids.index.jsonwriter.render_sidecar`) always lays a sidecar out the same way::

    {"format":...,"fields":[...],"keys":["k0","k1",...],"sample_start":[0,3,...],
     "member_field":[...],"member_offset":[...],"member_size":[...]}

:func:`parse_sidecar` reads that form with a few vectorised numpy operations over the bytes:
everything before ``"keys"`` by ``json.loads`` (a few hundred bytes), the keys when they are
printable ASCII without escapes, the integer columns when they are plain digits. It accepts
only text that is valid JSON meaning exactly what ``json.loads`` would read (nothing is
guessed): anything else (whitespace, escapes, non-ASCII keys, signs, leading zeros, numbers of
more than 18 digits, another key order, duplicate keys) gives ``None``, and the caller parses
the whole document with ``json.loads``, which reports what is wrong. The values are then
checked by :class:`~wids.index.members.ShardMembers` as any others.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["COLUMNS", "parse_sidecar"]

COLUMNS = ("sample_start", "member_field", "member_offset", "member_size")
"""The integer columns, in the order the writer puts them (after ``keys``)."""

MIN_BYTES = 8192
"""Smaller sidecars (up to ~120 samples) go to ``json.loads``: faster there than numpy's fixed
cost (~0.2 ms; the two cross near 7 KB, and 1,000 samples take ~0.5 ms here, ~1.1 ms there)."""

_KEYS = b',"keys":['
_FOLLOWING = (*(f'],"{c}":['.encode() for c in COLUMNS), b"]}")
_QUOTE, _COMMA, _ZERO, _BACKSLASH = 34, 44, 48, 92
_MAX_DIGITS = 18  # below 2**62 always; longer numbers (invalid anyway) go to json.loads


def parse_sidecar(data: bytes) -> tuple[dict[str, Any], bytes, np.ndarray, list[np.ndarray]] | None:
    """A sidecar in the writer's form, as arrays; ``None`` when it is not in that form.

    Args:
        data: The sidecar's bytes.

    Returns:
        ``(head, key_blob, key_offsets, columns)``: the object's other keys (``format``,
        ``fields``, ...) as ``json.loads`` reads them, the keys as one UTF-8 blob and its
        ``n + 1`` offsets, and the :data:`COLUMNS` as int64 arrays; or ``None`` (parse it with
        ``json.loads``: it is not in the writer's form, or not valid, or too small to gain).
    """
    if len(data) < MIN_BYTES:
        return None
    k = data.find(_KEYS)
    if k < 0:
        return None
    try:
        # Valid only if the marker is at the top level of the object (a '}' closes it).
        # Decoded as UTF-8 here: json.loads would guess another encoding from a head's first
        # bytes (UTF-16, say) that the whole file, with its ASCII tail, is not valid in.
        head = json.loads(data[:k].decode("utf-8") + "}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(head, dict) or "keys" in head or any(c in head for c in COLUMNS):
        return None  # not an object, or a key given twice: json.loads keeps the last one
    if not isinstance(head.get("fields"), list):
        return None  # json.loads, then ShardMembers.from_columns, say what is wrong
    pos = k + len(_KEYS)
    segments = []
    for following in _FOLLOWING:
        end = data.find(following, pos)  # the first: keys hold no quote, numbers no "]"
        if end < 0:
            return None
        segments.append(data[pos:end])
        pos = end + len(following)
    if pos != len(data):
        return None
    keys = _keys(segments[0])
    counts = [s.count(b",") + 1 for s in segments[1:]]
    values = _ints(b",".join(segments[1:]), sum(counts)) if all(segments[1:]) else None
    if keys is None or values is None:
        return None
    columns = np.split(values, np.cumsum(counts[:-1]))
    return head, keys[0], keys[1], columns


def _keys(text: bytes) -> tuple[bytes, np.ndarray] | None:
    """``"k0","k1",...`` (printable ASCII, no escapes) as a blob and offsets, else ``None``."""
    a = np.frombuffer(text, dtype=np.uint8)
    if not len(a) or not bool(np.all((a - 0x20 < 0x60) & (a != _BACKSLASH))):
        return None  # none, a control character, non-ASCII or an escape: json.loads
    # Without escapes every quote delimits: "k0","k1",...,"kn": quotes in pairs, each pair
    # but the last followed by exactly one comma and the next one's opening quote.
    q = np.flatnonzero(a == _QUOTE)
    if len(q) % 2 or q[0] != 0 or q[-1] != len(a) - 1:
        return None
    opens, closes = q[0::2], q[1::2]
    commas = closes[:-1] + 1
    if not (np.array_equal(opens[1:], commas + 1) and bool(np.all(a[commas] == _COMMA))):
        return None
    keep = np.ones(len(a), dtype=bool)
    keep[q] = False
    keep[commas] = False
    offsets = np.zeros(len(opens) + 1, dtype=np.int64)
    np.cumsum(closes - opens - 1, out=offsets[1:])
    return a[keep].tobytes(), offsets


def _ints(text: bytes, count: int) -> np.ndarray | None:
    """``count`` plain JSON integers (``1,22,333``: no sign, <= 18 digits) as int64, or ``None``."""
    a = np.frombuffer(text, dtype=np.uint8)
    comma = a == _COMMA
    if not bool(np.all((a - _ZERO < 10) | comma)):
        return None  # anything but digits and commas
    starts = np.empty(count, dtype=np.int64)
    starts[0] = 0
    starts[1:] = np.flatnonzero(comma) + 1
    lengths = np.empty(count, dtype=np.int64)
    lengths[:-1] = starts[1:] - starts[:-1] - 1
    lengths[-1] = len(a) - starts[-1]
    if int(lengths.min()) < 1 or int(lengths.max()) > _MAX_DIGITS:
        return None  # an empty number (",,") or one too long for here
    if bool(np.any((a[starts] == _ZERO) & (lengths > 1))):
        return None  # a leading zero: not JSON
    # only digits and single commas now: numpy's text parser reads them exactly
    values = np.fromstring(text, dtype=np.int64, sep=",")
    return values if len(values) == count else None
