"""How a sample becomes tar bytes: checked names, ustar headers, pax records only when needed.

- :func:`check_key` and the field check keep every name splittable back into the same key and
  field by every reader (:mod:`wids.samples`, webdataset's grouping).
- :func:`prepare_sample` encodes a sample and orders its fields (sorted, as webdataset does);
  :func:`tar_size` says how many bytes it will add to a tar.
- :class:`HeaderMaker` makes 512-byte ustar headers whose every field but name and size is fixed
  per writer (uid/gid 0, mode, mtime, user/group names), with a pax ``x`` record first only when
  ustar cannot hold the member: a name over 100 bytes or not ASCII (``path``), a size of 8 GiB
  or more (``size``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .errors import SampleLayoutError

__all__ = [
    "BLOCK",
    "DEFAULT_MTIME",
    "MAX_OCTAL",
    "ZEROS",
    "HeaderMaker",
    "Prepared",
    "check_key",
    "prepare_sample",
    "tar_size",
]

DEFAULT_MTIME = 946684800
"""The members' modification time unless the caller gives one: 2000-01-01T00:00:00Z."""

BLOCK = 512
ZEROS = bytes(BLOCK)
MAX_OCTAL = 0o77777777777  # 11 octal digits: sizes up to 8 GiB - 1
_PAX_NAME = b"././@PaxHeader"

Prepared = tuple[str, list[tuple[str, bytes, Any]]]
"""A sample ready to write: key, and per field (field with its dot, member name, data)."""


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


class HeaderMaker:
    """512-byte ustar headers with every field but name and size fixed per writer."""

    def __init__(self, mode: int, mtime: int, user: str, group: str) -> None:
        uname, gname = user.encode("utf-8"), group.encode("utf-8")
        if len(uname) > 31 or len(gname) > 31:
            raise ValueError("user and group names must fit 31 bytes")
        self.middle = _octal(mode, 8) + _octal(0, 8) + _octal(0, 8)  # mode, uid, gid
        self.mtime = _octal(mtime, 12)
        self.tail = b"".join(
            (
                b"0",  # typeflag: regular file (replaced for pax records)
                bytes(100),  # linkname
                b"ustar\x0000",
                uname.ljust(32, b"\0"),
                gname.ljust(32, b"\0"),
                _octal(0, 8) + _octal(0, 8),  # devmajor, devminor
                bytes(155 + 12),  # prefix, padding
            )
        )
        self.base = sum(self.middle) + sum(self.mtime) + sum(self.tail) + 8 * 32

    def header(self, name: bytes, size: int, typeflag: bytes = b"0") -> bytes:
        """One 512-byte header for ``name`` (at most 100 bytes) of ``size`` bytes."""
        size_field = _octal(size, 12)
        tail = self.tail if typeflag == b"0" else typeflag + self.tail[1:]
        chk = self.base + sum(name) + sum(size_field) + typeflag[0] - 48
        return b"".join(
            (
                name.ljust(100, b"\0"),
                self.middle,
                size_field,
                self.mtime,
                b"%06o\0 " % chk,
                tail,
            )
        )

    def member(self, name: bytes, size: int) -> bytes:
        """The header(s) of one member: a pax record first if ustar cannot hold it."""
        if len(name) <= 100 and size <= MAX_OCTAL and name.isascii():
            return self.header(name, size)
        records = _pax_records(name, size)
        short = name.decode("utf-8").encode("ascii", "replace")[:100]
        return b"".join(
            (
                self.header(_PAX_NAME, len(records), b"x"),
                records,
                ZEROS[: -len(records) % BLOCK],
                self.header(short, size if size <= MAX_OCTAL else 0),
            )
        )


def _pax_records(name: bytes, size: int) -> bytes:
    """The pax records a member needs: ``path`` for long or non-ASCII names, ``size`` >= 8 GiB."""
    records = b""
    if len(name) > 100 or not name.isascii():
        records += _pax_record(b"path", name)
    if size > MAX_OCTAL:
        records += _pax_record(b"size", b"%d" % size)
    return records


def _pax_record(key: bytes, value: bytes) -> bytes:
    """``"%d key=value"`` and a newline, whose length counts its own digits."""
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return b"%d" % n + body


def check_key(key: Any) -> str:
    """A sample key that every reader splits back unchanged, or :class:`SampleLayoutError`."""
    if not isinstance(key, str) or not key:
        raise SampleLayoutError(f"__key__ must be a non-empty str, not {key!r}")
    parts = key.split("/")
    problem = None
    if "." in parts[-1]:
        problem = "its last path part has a dot (readers would split the key there)"
    elif key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        problem = "it has an empty, '.' or '..' path part, or starts with '/'"
    elif "\0" in key:
        problem = "it contains a NUL character"
    if problem is None:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            problem = "it is not valid Unicode (lone surrogates)"
    if problem:
        raise SampleLayoutError(f"key {key!r} cannot be written: {problem}")
    return key


def _check_field(key: str, field: str) -> str:
    name = field[1:] if field.startswith(".") else field
    if not name or "/" in name or "\0" in name or name.startswith("."):
        raise SampleLayoutError(
            f"sample {key!r}: field {field!r} cannot be written (empty, or has '/' or NUL)"
        )
    return "." + name


def prepare_sample(
    sample: Mapping[str, Any], encoder: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None
) -> Prepared:
    """Check and encode a sample: its key, and its fields as member names and bytes, sorted.

    Raises:
        SampleLayoutError: No or a bad ``__key__``, a bad field name, or no fields.
        EncodeError: A field's value does not fit its extension.
    """
    if not isinstance(sample, Mapping):
        raise SampleLayoutError(f"a sample must be a dict, not {type(sample).__name__}")
    if "__key__" not in sample:
        raise SampleLayoutError("sample has no '__key__'")
    key = check_key(sample["__key__"])
    encoded = encoder(sample) if encoder is not None else sample
    fields: dict[str, Any] = {}
    for name in encoded:
        if not isinstance(name, str):
            raise SampleLayoutError(f"sample {key!r}: field name {name!r} is not a str")
        if name.startswith("_"):
            continue
        field = _check_field(key, name)
        if field in fields:
            raise SampleLayoutError(f"sample {key!r}: field {field!r} given twice")
        fields[field] = encoded[name]
    if not fields:
        raise SampleLayoutError(f"sample {key!r} has no fields to write")
    out = []
    for field in sorted(fields):
        data = fields[field]
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif not isinstance(data, bytes):
            if not isinstance(data, (bytearray, memoryview)):
                raise SampleLayoutError(
                    f"sample {key!r} field {field!r}: {type(data).__name__} after encoding, "
                    "not bytes"
                )
            data = memoryview(data).cast("B")
        out.append((field, (key + field).encode("utf-8"), data))
    return key, out


def tar_size(prepared: Prepared) -> int:
    """Bytes that writing a prepared sample adds to a tar (headers, pax records, padding)."""
    total = 0
    for _, name, data in prepared[1]:
        size = len(data)
        total += BLOCK + size + (-size % BLOCK)
        if len(name) > 100 or size > MAX_OCTAL or not name.isascii():
            records = _pax_records(name, size)
            total += BLOCK + len(records) + (-len(records) % BLOCK)
    return total
