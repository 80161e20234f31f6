"""Sample metadata columns: small per-sample values kept in the index, shard by shard.

A column has a name (a Python identifier, so filter expressions can use it), a type and one
value per sample, which may be missing. Where its values come from is a :class:`ColumnSpec`:

- ``json:PATH`` — a number, bool or string in the sample's ``.json`` member (``PATH`` is a
  key, or dotted keys into nested objects: ``json:meta.width``); the default name is ``PATH``
  with dots as underscores;
- ``size:.EXT`` — the size in bytes of the sample's ``.EXT`` member (default name
  ``size_EXT``);
- ``has:.EXT`` — whether the sample has a ``.EXT`` member (bool, never missing; ``has_EXT``).

``NAME=SOURCE`` names a column explicitly (``w=json:meta.width``).

Types: ``int64``, ``float64``, ``bool``, ``str``. Within one shard the values decide: ints ->
``int64``, ints and floats -> ``float64``, bools -> ``bool``, strings -> ``str``; mixing
others (a string and a number, a bool and a number) is a :class:`~wids.errors.ColumnError`
naming the shard and the sample, as is an object or a list. Missing values: the member or key
is absent, or the JSON value is ``null`` (or ``NaN``). A shard with only missing values has
type ``null``, which goes with any other.

Storage: a shard's columns are one extra key of its entry, :data:`EXTRA_KEY`, in every index
format (a JSON description's shard line, an SQLite row's ``extra``, a shard table's extra
string), so they travel with the shard through conversion and subsets, and old readers ignore
them (extra keys). Each column is ``{"type", "dtype", "data", "nulls"}``: ``data`` the values
as base64 of a little-endian array of the narrowest ``dtype`` that holds them, ``nulls`` a
base64 bit mask (``numpy.packbits``) of the missing ones, when there are any; a ``str``
column is a JSON list (``null`` when missing). Readers check everything they decode
(:func:`decode_columns`): type, dtype, lengths against ``nsamples``, bounds.
"""

from __future__ import annotations

import base64
import binascii
import json
import keyword
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ColumnError, IndexFormatError

__all__ = [
    "EXTRA_KEY",
    "MAX_COLUMNS",
    "MAX_JSON_BYTES",
    "MAX_STRING_BYTES",
    "TYPES",
    "VERSION",
    "ColumnSpec",
    "ShardColumn",
    "decode_columns",
    "encode_columns",
    "merge_type",
    "parse_specs",
    "shard_extras",
    "values_column",
]

EXTRA_KEY = "wids_columns"
"""The extra key of a shard entry that holds its columns."""
VERSION = 1
"""``version`` of that entry; a reader refuses a newer one (``ColumnError``)."""
TYPES = ("int64", "float64", "bool", "str")
"""The column types (and ``null``: a shard whose values are all missing)."""
MAX_COLUMNS = 64
"""Columns per index."""
MAX_STRING_BYTES = 1024
"""The longest string value (UTF-8 bytes)."""
MAX_JSON_BYTES = 1 << 20
"""The largest ``.json`` member a column is read from."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DTYPES = ("|i1", "<i2", "<i4", "<i8", "<f8", "|b1")
_RESERVED = frozenset(("True", "False", "None", "isnull", "notnull", "abs", "key"))


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """Where a column's values come from.

    Attributes:
        name: The column's name.
        source: ``"json"``, ``"size"`` or ``"has"``.
        arg: The JSON path (``"meta.width"``) or the member's field (``".jpg"``).
    """

    name: str
    source: str
    arg: str

    @classmethod
    def parse(cls, text: str) -> ColumnSpec:
        """A spec from its text: ``[NAME=]json:PATH``, ``[NAME=]size:.EXT``, ``[NAME=]has:.EXT``.

        Raises:
            ColumnError: The text is no such spec, or the name is not an identifier.
        """
        if not isinstance(text, str):
            raise ColumnError(f"a column spec is a string, got {type(text).__name__}")
        name, eq, rest = text.partition("=")
        if not eq:
            name, rest = "", text
        source, colon, arg = rest.partition(":")
        source = source.strip()
        if not colon or source not in ("json", "size", "has") or not arg:
            raise ColumnError(
                f"not a column spec: {text!r} (json:KEY, size:.EXT or has:.EXT, "
                "optionally NAME=...)"
            )
        if source == "json":
            if any(not part for part in arg.split(".")):
                raise ColumnError(f"column spec {text!r}: empty key in {arg!r}")
            default = arg.replace(".", "_")
        else:
            if not arg.startswith(".") or len(arg) < 2 or "/" in arg:
                raise ColumnError(f"column spec {text!r}: the member is .EXT (e.g. .jpg)")
            default = f"{source}_{arg[1:].replace('.', '_')}"
        name = name.strip() or default
        check_name(name, text)
        return cls(name, source, arg)

    def __str__(self) -> str:
        return f"{self.name}={self.source}:{self.arg}"


def check_name(name: str, where: str | None = None) -> None:
    """Refuse a column name that is not a usable identifier.

    Raises:
        ColumnError: ``name`` is not an identifier of at most 64 characters, or is a Python
            keyword or a name filter expressions reserve.
    """
    if not isinstance(name, str) or not _NAME.match(name) or keyword.iskeyword(name):
        raise ColumnError(
            f"column name {name!r} is not an identifier of at most 64 characters"
            + (f" (in {where!r}; give NAME=...)" if where and where != name else "")
        )
    if name in _RESERVED:
        raise ColumnError(f"column name {name!r} is reserved")


def parse_specs(specs: Sequence[str | ColumnSpec] | None) -> list[ColumnSpec]:
    """Specs from texts (or specs), checked: at most :data:`MAX_COLUMNS`, distinct names.

    Raises:
        ColumnError: A malformed spec, too many, or two with one name.
    """
    if specs is None:
        return []
    if isinstance(specs, (str, ColumnSpec)):
        specs = [specs]
    out = [s if isinstance(s, ColumnSpec) else ColumnSpec.parse(s) for s in specs]
    if len(out) > MAX_COLUMNS:
        raise ColumnError(f"{len(out)} columns: at most {MAX_COLUMNS}")
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ColumnError(f"two columns named {dup[0]!r}")
    return out


@dataclass(frozen=True, slots=True)
class ShardColumn:
    """One column of one shard.

    Attributes:
        type: ``int64``, ``float64``, ``bool``, ``str`` or ``null`` (all missing).
        values: One value per sample: int64, float64 (missing: NaN), bool, or object (str,
            missing: ``None``) array; a ``null`` column's is float64 NaN.
        missing: Where values are missing (bool array), or ``None`` when none is.
    """

    type: str
    values: np.ndarray
    missing: np.ndarray | None

    def __len__(self) -> int:
        return len(self.values)


def merge_type(a: str, b: str, where: str = "") -> str:
    """The type of two shards' (or values') types together.

    Raises:
        ColumnError: Types that do not go together (a string and a number, a bool and a number).
    """
    if a == b or b == "null":
        return a
    if a == "null":
        return b
    if {a, b} == {"int64", "float64"}:
        return "float64"
    raise ColumnError(f"{where}values of types {a} and {b} in one column")


def _value_type(v: Any) -> str:
    t = type(v)
    if v is None:
        return "null"
    if t is bool:
        return "bool"
    if t is int:
        return "int64"
    if t is float:
        return "null" if math.isnan(v) else "float64"
    if t is str:
        return "str"
    return "object"


def values_column(values: Sequence[Any], where: str = "", keys: Sequence[str] = ()) -> ShardColumn:
    """A column of Python values (``None`` or NaN: missing), typed and checked.

    Args:
        values: One value per sample.
        where: The shard, for errors.
        keys: The samples' keys, for errors.

    Raises:
        ColumnError: A value is not a number, bool or string, a string is too long, an int
            is out of int64, or the values mix types (see :func:`merge_type`).
    """
    kind = "null"
    for i, v in enumerate(values):
        t = _value_type(v)
        name = f"sample {keys[i]!r}" if i < len(keys) else f"sample {i}"
        if t == "object":
            raise ColumnError(
                f"{where}{name}: a column value is a number, bool or string, got {type(v).__name__}"
            )
        if t == "int64" and not -(1 << 63) <= v < (1 << 63):
            raise ColumnError(f"{where}{name}: integer {v} is out of int64")
        if t == "str" and len(v.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
            raise ColumnError(f"{where}{name}: a string over {MAX_STRING_BYTES} bytes")
        try:
            kind = merge_type(kind, t)
        except ColumnError:
            raise ColumnError(f"{where}{name}: a {t} value in a column of {kind} values") from None
    n = len(values)
    if kind == "null":
        return ShardColumn("null", np.full(n, np.nan), np.ones(n, dtype=bool) if n else None)
    missing = np.fromiter((_value_type(v) == "null" for v in values), dtype=bool, count=n)
    if kind == "str":
        arr = np.empty(n, dtype=object)
        arr[:] = [None if m else v for v, m in zip(values, missing, strict=True)]
        return ShardColumn("str", arr, missing if missing.any() else None)
    fill: Any = {"int64": 0, "float64": math.nan, "bool": False}[kind]
    dtype: Any = {"int64": np.int64, "float64": np.float64, "bool": np.bool_}[kind]
    data = np.fromiter(
        (fill if m else v for v, m in zip(values, missing, strict=True)), dtype=dtype, count=n
    )
    return ShardColumn(kind, data, missing if missing.any() else None)


def _narrow(values: np.ndarray) -> np.ndarray:
    """Integers in the narrowest little-endian dtype that holds them."""
    if not len(values):
        return values.astype("|i1")
    lo, hi = int(values.min()), int(values.max())
    for dt in ("|i1", "<i2", "<i4"):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return values.astype(dt)
    return values.astype("<i8")


def encode_columns(columns: Mapping[str, ShardColumn], nsamples: int) -> dict[str, Any]:
    """The extra entry (:data:`EXTRA_KEY`'s value) of a shard's columns.

    Raises:
        ColumnError: A column's length is not ``nsamples``, or a name is not usable.
    """
    out: dict[str, Any] = {}
    for name, col in columns.items():
        check_name(name)
        if len(col) != nsamples:
            raise ColumnError(f"column {name!r} has {len(col)} values for {nsamples} samples")
        entry: dict[str, Any] = {"type": col.type}
        if col.type == "str":
            entry["values"] = list(col.values)
        elif col.type != "null":
            data = col.values
            if col.type == "int64":
                data = _narrow(np.where(col.missing, 0, data) if col.missing is not None else data)
            elif col.type == "float64":
                data = data.astype("<f8")
            else:
                data = data.astype("|b1")
            entry["dtype"] = data.dtype.str
            entry["data"] = base64.b64encode(data.tobytes()).decode("ascii")
            if col.missing is not None and col.type != "float64":
                entry["nulls"] = base64.b64encode(np.packbits(col.missing).tobytes()).decode()
        out[name] = entry
    if len(out) > MAX_COLUMNS:
        raise ColumnError(f"{len(out)} columns: at most {MAX_COLUMNS}")
    return {"version": VERSION, "columns": out}


def decode_columns(
    extra: Mapping[str, Any], nsamples: int, shard: str | None, names: Sequence[str] | None = None
) -> dict[str, ShardColumn]:
    """The columns of a shard from its extra keys (none when it has no :data:`EXTRA_KEY`).

    Args:
        extra: The shard's extra keys (``reader.shard_extra(i)``).
        nsamples: Its sample count.
        shard: Its URL, for errors.
        names: Decode only these columns (the others are not looked at).

    Raises:
        IndexFormatError: The entry is malformed (naming the shard).
        ColumnError: It was written by a newer wids (another ``version``).
    """
    entry = extra.get(EXTRA_KEY)
    if entry is None:
        return {}

    def bad(what: str) -> IndexFormatError:
        return IndexFormatError(f"{EXTRA_KEY}: {what}", shard=shard)

    if not isinstance(entry, dict) or not isinstance(entry.get("columns"), dict):
        raise bad("not an object with 'columns'")
    if entry.get("version") != VERSION:
        raise ColumnError(
            (f"{shard}: " if shard is not None else "")
            + f"columns of version {entry.get('version')!r}; this wids reads version "
            f"{VERSION} (a newer wids wrote them)"
        )
    cols = entry["columns"]
    if len(cols) > MAX_COLUMNS:
        raise bad(f"{len(cols)} columns, at most {MAX_COLUMNS}")
    out = {}
    for name in cols if names is None else [n for n in names if n in cols]:
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad(f"column name {name!r} is not an identifier")
        out[name] = _decode_one(cols[name], nsamples, bad, name)
    return out


def _b64(text: Any, limit: int, bad: Any, what: str) -> bytes:
    if not isinstance(text, str) or len(text) > 4 * (limit // 3 + 1):
        raise bad(f"{what} is not base64 of at most {limit} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{what} is not base64") from None


def _decode_one(entry: Any, n: int, bad: Any, name: str) -> ShardColumn:
    if not isinstance(entry, dict):
        raise bad(f"column {name!r} is not an object")
    kind = entry.get("type")
    if kind == "null":
        return ShardColumn("null", np.full(n, np.nan), np.ones(n, dtype=bool) if n else None)
    if kind == "str":
        values = entry.get("values")
        if not isinstance(values, list) or len(values) != n:
            raise bad(f"column {name!r}: 'values' is not a list of {n}")
        try:
            col = values_column(values, f"column {name!r}: ")
        except ColumnError as e:  # stored values: damage to the index, not a user's value
            raise bad(str(e)) from None
        if col.type not in ("str", "null"):
            raise bad(f"column {name!r}: a str column holds {col.type} values")
        return ShardColumn("str", col.values.astype(object), col.missing)
    if kind not in TYPES:
        raise bad(f"column {name!r}: unknown type {kind!r}")
    dtype = entry.get("dtype")
    allowed = {"int64": _DTYPES[:4], "float64": ("<f8",), "bool": ("|b1",)}[kind]
    if dtype not in allowed:
        raise bad(f"column {name!r}: dtype {dtype!r} for a {kind} column")
    size = np.dtype(dtype).itemsize
    raw = _b64(entry.get("data"), n * size, bad, f"column {name!r} data")
    if len(raw) != n * size:
        raise bad(f"column {name!r}: {len(raw)} bytes of data for {n} samples of {dtype}")
    data = np.frombuffer(raw, dtype=dtype)
    if kind == "bool":
        if n and int(np.frombuffer(raw, dtype=np.uint8).max()) > 1:
            raise bad(f"column {name!r}: bool data other than 0 and 1")
        values = data.astype(bool)
    else:
        values = data.astype(np.int64 if kind == "int64" else np.float64)
    missing = None
    if kind == "float64":
        nan = np.isnan(values)
        missing = nan if nan.any() else None
    elif "nulls" in entry:
        packed = _b64(entry["nulls"], (n + 7) // 8, bad, f"column {name!r} nulls")
        if len(packed) != (n + 7) // 8:
            raise bad(f"column {name!r}: a null mask of {len(packed)} bytes for {n} samples")
        missing = np.unpackbits(np.frombuffer(packed, dtype=np.uint8), count=n).astype(bool)
        if not missing.any():
            missing = None
    return ShardColumn(kind, values, missing)


def json_value(data: bytes | bytearray | memoryview, path: str, where: str) -> Any:
    """The value at ``path`` (dotted keys) in a ``.json`` member's bytes; ``None`` if absent.

    Raises:
        ColumnError: The member is over :data:`MAX_JSON_BYTES`, is not JSON, or the value
            is an object or a list.
    """
    if len(data) > MAX_JSON_BYTES:
        raise ColumnError(f"{where}: .json member of {len(data)} bytes, over {MAX_JSON_BYTES}")
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)  # a memoryview (a writer's encoded member)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ColumnError(f"{where}: .json member is not JSON ({e})") from None
    for part in path.split("."):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
        if doc is None:
            return None
    if isinstance(doc, (dict, list)):
        raise ColumnError(f"{where}: json:{path} is an {type(doc).__name__}, not a value")
    return doc


def shard_extras(
    extra: Callable[[int], Mapping[str, Any]], n: int, remote: bool, threads: int = 16
) -> Iterable[Mapping[str, Any]]:
    """Every shard's extra keys in order; ``remote``: ``threads`` shards' sidecars read at once.

    A remote JSON index keeps each shard's columns in its member sidecar, one request each:
    read one after another, 200 shards behind 25 ms of latency took 6 s.
    """
    if not remote or n < 2:
        return (extra(k) for k in range(n))
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(threads, thread_name_prefix="wids-columns") as pool:
        return list(pool.map(extra, range(n)))
