"""Decoding one tar header block and its extension records, and checking headers.

Numbers (octal and base-256, as tarfile's ``nti``), checksums (one by one, or in numpy batches),
pax ``x``/``g`` and GNU ``L``/``K`` records, and :func:`header_mismatch`, which tells whether
512 bytes are the header of a given member. The walkers in :mod:`.walk` call these.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import HeaderChecksumError, TarFormatError, TruncatedTarError
from .member import Row

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BLOCK",
    "MAX_EXTENSION",
    "MAX_MEMBER_SIZE",
    "MAX_NAME",
    "header_fits",
    "header_mismatch",
    "record_name",
]

BLOCK = 512
# Larger pax / GNU long-name records are refused rather than read into memory.
MAX_EXTENSION = 16 << 20
# A member name (GNU long name, pax path) longer than this is refused: no file system path is
# longer (Linux's PATH_MAX), and every name becomes a key held in memory by the index.
MAX_NAME = 4096

_ZERO = bytes(BLOCK)
_MAGICS = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
# A record's length has at most 19 digits (more cannot be a real length); no newline in a key.
_PAX_RECORD = re.compile(rb"(\d{1,19}) ([^=\n]+)=")
# Sizes from headers and pax records must stay below this: larger ones cannot be real members,
# and offsets computed from them would overflow the C integers of os.pread.
MAX_MEMBER_SIZE = 1 << 62

_adler32 = zlib.adler32


def _check(h: bytes, off: int, shard: str | None, ext: _Ext) -> None:
    """Verify one header's checksum now (raises; the end block is not expected here)."""
    u = _unsigned_sum(h)
    if b"%06o\0 " % u != h[148:156]:
        _bad_checksum(h, u, off, shard, ext)


def _verify_batch(hdrs: list[bytes], rows: list[Row], off: int, shard: str | None) -> None:
    r"""Verify the headers of ``rows`` at once; raise for the first bad one. Clears ``hdrs``.

    ``hdrs[k]`` is the header of ``rows[k]``, which starts 512 bytes before its data; a last
    header without a row (its parsing failed) is the one at ``off``.

    A header passes here if its checksum field is the canonical ``"%06o\\0 "`` rendering of its
    unsigned sum, as tarfile and GNU tar write it; any other header is checked exactly by
    :func:`_bad_checksum` (other renderings, the historic signed sum, or an error).
    """
    import numpy as np

    arr = np.frombuffer(b"".join(hdrs), dtype=np.uint8).reshape(-1, BLOCK)
    for k in np.flatnonzero(~_canonical_checksums(arr)).tolist():
        h = hdrs[k]
        at = rows[k][1] - BLOCK if k < len(rows) else off
        _bad_checksum(h, _unsigned_sum(h), at, shard, _Ext())
    hdrs.clear()


def _canonical_checksums(arr: np.ndarray) -> np.ndarray:
    r"""Per header (rows of a ``(n, 512)`` uint8 array), whether its checksum is canonical.

    Canonical: the field is ``"%06o\0 "`` of the header's unsigned sum. A header failing this
    may still be valid (see :func:`_bad_checksum`).
    """
    import numpy as np

    u64 = np.uint64
    total = arr.sum(1, dtype=np.uint32).astype(u64)
    # The 8-byte checksum field of each header as one little-endian integer (byte k at bit 8k).
    field = np.ascontiguousarray(arr[:, 148:156]).view("<u8").ravel()
    pairs = (field & u64(0x00FF00FF00FF00FF)) + ((field >> u64(8)) & u64(0x00FF00FF00FF00FF))
    field_sum = (pairs * u64(0x0001000100010001)) >> u64(48)  # adds the four 16-bit lanes
    unsigned = total - field_sum + u64(256)
    expected = u64(32) << u64(56)  # six octal digits, a NUL, a space
    for k in range(6):
        digit = ((unsigned >> u64(3 * (5 - k))) & u64(7)) | u64(48)
        expected = expected | (digit << u64(8 * k))
    return np.asarray(field == expected)


class _Ext:
    """Extension-record state between headers: pending (x, L) and global (g) values."""

    __slots__ = ("active", "name", "name_from_gnu", "size", "hoff", "gpath", "gsize")

    def __init__(self) -> None:
        self.active = False  # anything pending or global: leave the hot path
        self.name: str | None = None  # pending name from GNU L or pax x path (first one wins)
        self.name_from_gnu = False
        self.size: int | None = None  # pending pax x size
        self.hoff = -1  # header offset of the first pending extension record
        self.gpath: str | None = None
        self.gsize: int | None = None

    def pending(self) -> bool:
        return self.hoff >= 0

    def reset(self) -> None:
        self.name = None
        self.name_from_gnu = False
        self.size = None
        self.hoff = -1
        self.active = self.gpath is not None or self.gsize is not None


_EXT_TYPES = frozenset(b"LKxXg")


def _member(h: bytes, off: int, hoff: int, shard: str | None, ext: _Ext) -> Row:
    """Parse a non-extension header (general path); applies and clears pending extensions."""
    t = h[156]
    if t == 83:  # "S"
        raise TarFormatError(
            "GNU sparse member; wids cannot serve sparse files", shard=shard, offset=off
        )
    size = _number(h, off, shard)
    raw = h[:100].partition(b"\0")[0]
    typ = "0" if t == 0 else chr(t)
    if t == 0 and raw.endswith(b"/"):
        typ = "5"
    if typ == "5":
        raw = raw.rstrip(b"/")
    if h[345]:
        raw = h[345:500].partition(b"\0")[0] + b"/" + raw
    name = raw.decode("utf-8", "surrogateescape")
    from_gnu = False
    if ext.active:
        if ext.name is not None:
            name = ext.name
            from_gnu = ext.name_from_gnu
            if typ == "5" and from_gnu:
                name = name.removesuffix("/")
        elif ext.gpath is not None:
            name = ext.gpath.rstrip("/")
        if ext.size is not None:
            size = ext.size
        elif ext.gsize is not None:
            size = ext.gsize
        ext.reset()
    if typ == "5" and not from_gnu:
        name = name.rstrip("/")
    if size < 0:
        raise TarFormatError(f"negative size {size} for {name!r}", shard=shard, offset=off)
    return (name, off + BLOCK, size, typ, hoff)


def _extension(
    t: int,
    h: bytes,
    off: int,
    read: Callable[[int, int], bytes],
    buf: bytes,
    base: int,
    shard: str | None,
    file_size: int | None,
    ext: _Ext,
) -> int:
    """Process a pax (x, X, g) or GNU (L, K) record at ``off``; return the next header's offset."""
    size = _number(h, off, shard)
    if size < 0 or (size > MAX_EXTENSION and t != 75):  # K's data is skipped, never read
        raise TarFormatError(
            f"extension record of {size} bytes (limit {MAX_EXTENSION})", shard=shard, offset=off
        )
    data_off = off + BLOCK
    nxt = data_off + ((size + 511) & ~511)
    if t != 103 and ext.hoff < 0:  # not "g": belongs to the next member
        ext.hoff = off
    if t == 75:  # "K": long link name; wids does not report link targets
        ext.active = True
        return nxt
    p = data_off - base
    if 0 <= p and p + size <= len(buf):
        data = buf[p : p + size]
    else:
        data = read(size, data_off)[:size] if size else b""
    if len(data) < size:
        _truncated(data_off + len(data), shard, file_size, "inside an extension record's data")
    if t == 76:  # "L": GNU long name
        if ext.name is None:
            i = data.find(0)
            name = data[:i] if i >= 0 else data
            _check_name_length(len(name), off, shard)
            ext.name = name.decode("utf-8", "surrogateescape")
            ext.name_from_gnu = True
    else:
        records = _pax_records(data, off, shard)
        if any(k.startswith("GNU.sparse.") for k in records):
            raise TarFormatError(
                "GNU sparse member (pax); wids cannot serve sparse files", shard=shard, offset=off
            )
        path = records.get("path")
        if path is not None:
            _check_name_length(len(path.encode("utf-8", "surrogateescape")), off, shard)
        size_value = records.get("size")
        number = None if size_value is None else _pax_size(size_value, off, shard)
        if t == 103:  # "g": global, sticks for the rest of the archive
            if path is not None:
                ext.gpath = path
            if number is not None:
                ext.gsize = number
        else:
            if path is not None and ext.name is None:
                ext.name = path.rstrip("/")
                ext.name_from_gnu = False
            if number is not None and ext.size is None:
                ext.size = number
    ext.active = True
    return nxt


def _check_name_length(n: int, off: int, shard: str | None) -> None:
    if n > MAX_NAME:
        raise TarFormatError(
            f"member name of {n:,} bytes (limit {MAX_NAME:,}, the longest path a file system "
            "allows)",
            shard=shard,
            offset=off,
        )


def _pax_records(data: bytes, off: int, shard: str | None) -> dict[str, str]:
    r"""Parse ``"%d key=value\n"`` records; every record's length must fit it exactly.

    tarfile (before 3.12.5) stops at the first non-record and trusts a record's length, so a
    length that is too large puts the next record's bytes (or the newline) into the value and
    one too small drops the rest: both are errors here. NUL bytes after the last record are
    ignored.
    """
    records: dict[str, str] = {}
    pos, n = 0, len(data)
    while pos < n:
        match = _PAX_RECORD.match(data, pos)
        if not match:
            if data[pos:].strip(b"\0"):
                raise TarFormatError(
                    f"malformed pax record at byte {pos} of the record data",
                    shard=shard,
                    offset=off,
                )
            break
        length = int(match.group(1))
        end = pos + length
        if end <= match.end() or end > n or data[end - 1] != 10:  # 10: "\n"
            keyword = match.group(2).decode("utf-8", "backslashreplace")
            raise TarFormatError(
                f"pax record {keyword!r} (byte {pos} of the record data) says it has {length} "
                f"bytes: that does not end at a newline within the {n} bytes of record data",
                shard=shard,
                offset=off,
            )
        keyword = match.group(2).decode("utf-8", "surrogateescape")
        records[keyword] = data[match.end() : end - 1].decode("utf-8", "surrogateescape")
        pos = end
    return records


def _pax_size(value: str, off: int, shard: str | None) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TarFormatError(f"invalid pax size {value!r}", shard=shard, offset=off) from None
    if number < 0:
        raise TarFormatError(f"negative pax size {number}", shard=shard, offset=off)
    if number >= MAX_MEMBER_SIZE:
        raise TarFormatError(f"pax size {number} is too large", shard=shard, offset=off)
    return number


def _number(h: bytes, off: int, shard: str | None, start: int = 124, end: int = 136) -> int:
    """Decode a numeric header field exactly as tarfile's ``nti`` does (octal or base-256)."""
    field = h[start:end]
    what = "size" if start == 124 else "checksum"
    if field[0] in (0o200, 0o377):
        n = int.from_bytes(field[1:], "big")
        if field[0] == 0o377:
            n -= 256 ** (len(field) - 1)
        if n >= MAX_MEMBER_SIZE:  # octal fields cannot get there (at most 8**11)
            raise TarFormatError(
                f"{what} field (base-256) {n} is too large (limit 2**62)", shard=shard, offset=off
            )
        return n
    i = field.find(0)
    text = field[:i] if i >= 0 else field
    try:
        return int(text.decode("ascii").strip() or "0", 8)
    except (UnicodeDecodeError, ValueError):
        raise TarFormatError(
            f"invalid {what} field {field!r} in header", shard=shard, offset=off
        ) from None


def _unsigned_sum(h: bytes) -> int:
    """The header's unsigned checksum (checksum field as spaces), exactly, for any bytes."""
    # adler32's first half is 1 + sum(bytes) mod 65521; each slice here sums to < 65521.
    return (
        (_adler32(h[:148]) & 0xFFFF)
        + (_adler32(h[156:400]) & 0xFFFF)
        + (_adler32(h[400:]) & 0xFFFF)
        + 253  # 256 for the eight spaces, minus the three adler32 start values of 1
    )


def _bad_checksum(h: bytes, unsigned: int, off: int, shard: str | None, ext: _Ext) -> bool:
    """Handle a header whose checksum field is not the canonical rendering of its sum.

    Returns True for the end-of-archive block, False for a valid header (checksum written
    differently, or with the historic signed sum); raises otherwise.
    """
    if h == _ZERO:
        if ext.pending():
            raise TarFormatError(
                "end-of-archive block right after an extension header", shard=shard, offset=off
            )
        return True
    try:
        stored = _number(h, off, shard, 148, 156)
    except TarFormatError:
        stored = None
    if stored is not None:
        signed = unsigned - 256 * sum(b >= 128 for b in h[:148] + h[156:])
        if stored in (unsigned, signed):
            return False
    what = "header checksum mismatch"
    if off == 0:
        _compressed(h, shard)
        what = "not a tar archive: " + what
    raise HeaderChecksumError(
        f"{what} (stored {h[148:156]!r}, computed {unsigned})", shard=shard, offset=off
    )


_MAX_OCTAL_SIZE = 0o77777777777  # larger sizes need base-256 or a pax ``size`` record


def header_fits(buf: bytes, at: int, name0: bytes, size: int) -> bool:
    r"""Whether ``buf[at - 512 : at]`` is, at a glance, the header of member ``name0``, ``size``.

    The hot path of reads (every member of every sample), without a copy of the header:
    ``True`` when, as tarfile, GNU tar and wids's writer put them for a short name, the name
    field is the name and a NUL with no prefix, the size field is ``"%011o\0"`` of ``size``
    and the type a regular file's. The checksum is not summed here: it tells a header from
    other bytes, and these fields at this place already do (a tar crafted to hold a header in
    a member's data could as well give it a valid checksum). ``False`` means "ask
    :func:`header_mismatch`", which decides exactly (checksum, other renderings, long or
    non-ASCII names) and says what is wrong. ``LocalShard.read`` inlines these tests.

    Args:
        buf: Bytes holding the header.
        at: Where the member's data begins in ``buf`` (``>= 512``).
        name0: The member's name (key + field) as bytes, followed by a NUL.
        size: The member's size as the index records it.
    """
    h = at - BLOCK
    return (
        len(name0) <= 100
        and buf[h : h + len(name0)] == name0
        and buf[h + 124 : h + 136] == b"%011o\0" % size
        and buf[h + 156] in (0, 48)
        and not buf[h + 345]
    )


def header_mismatch(h: bytes, name: str, size: int) -> str | None:
    """Check that ``h`` is the header of a regular member ``name`` of ``size`` bytes.

    This is how a reader proves that bytes it got from storage come from where the index says:
    the 512 bytes just before a member's data are that member's own header. A header is only
    compared on what every writer puts there: a valid checksum, a regular-file type, the size
    (unless it needs more than 11 octal digits, when a pax record may carry it) and the name
    when it fits the header unchanged (ASCII, at most 100 bytes). Longer or non-ASCII names
    come from a GNU ``L`` or pax ``path`` record before the header, and writers put different
    approximations of them in the header itself: a longer one is not compared; a non-ASCII
    one of at most 100 bytes must not be in the header as another ASCII name (the writers put
    its own bytes there, or ASCII with ``?`` for each other character).

    Args:
        h: The 512 bytes before the member's data.
        name: The member's full name (``key + field``), as the index records it.
        size: The member's size as the index records it.

    Returns:
        ``None`` if the header fits; otherwise what is wrong, for an error message.
    """
    if len(h) != BLOCK:
        return f"{len(h)} bytes where a 512-byte member header should be"
    if h == _ZERO:
        return "a zero block where the member's header should be"
    u = _unsigned_sum(h)
    if b"%06o\0 " % u != h[148:156]:
        try:
            _bad_checksum(h, u, 1, None, _Ext())  # offset 1: no "not a tar archive" wording
        except TarFormatError:
            return "no tar header where the member's header should be (bad checksum)"
    t = h[156]
    if t not in (0, 48, 55):  # NUL, "0", "7"
        return f"a header of type {chr(t)!r} where a regular file's should be"
    try:
        stored = _number(h, 0, None)
    except TarFormatError:
        return "a header with an invalid size field"
    if stored != size and size <= _MAX_OCTAL_SIZE:
        return f"the header says {stored} bytes where the index says {size}"
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= 100:
        got = h[:100].partition(b"\0")[0]
        if h[345]:
            got = h[345:500].partition(b"\0")[0] + b"/" + got
        if got != raw and (
            raw.isascii()  # an ASCII name of at most 100 bytes: always in the header as it is
            # a non-ASCII one: its bytes as they are (GNU tar, libarchive), or its ASCII
            # rendering with "?" for each other character (tarfile, wids's writer); a header
            # with an ASCII name that is neither names another member
            or (got.isascii() and got != name.encode("ascii", "replace"))
        ):
            shown = got.decode("utf-8", "backslashreplace")
            return f"the header names {shown!r} where the index says {name!r}"
    return None


_NO_DATA = frozenset("123456")  # links, devices, directories, FIFOs: no data blocks


def record_name(gap: bytes) -> str | None:
    """The name that extension records in ``gap`` give the member whose header follows it.

    A member's name longer than 100 bytes is not in its header (writers put different
    approximations of it there): it is in a GNU ``L`` or pax ``x`` ``path`` record before the
    header. ``gap`` is the archive's bytes from a header boundary (where the previous member's
    data and padding end) up to that member's header, exclusive: the records, and any other
    entries (directories) between the two members. They are walked as a tar reader walks
    them, bounded by ``len(gap)``.

    Args:
        gap: The bytes between the previous member and the member's header.

    Returns:
        The name the records give the member (the first ``L`` or ``path``, as tarfile; else
        a pax ``g`` record's ``path`` in ``gap``), or ``None`` when no record there names it
        (its header's own name stands, or a ``g`` record before ``gap``).

    Raises:
        TarFormatError: ``gap`` is not a sequence of whole headers and records ending where
            the member's header begins.
    """
    ext = _Ext()
    off, n = 0, len(gap)

    def read(size: int, at: int) -> bytes:
        return gap[at : at + size]

    while off < n:
        h = gap[off : off + BLOCK]
        if len(h) < BLOCK or h == _ZERO:
            raise TarFormatError("no header where the walk from the previous member got to")
        _check(h, off, None, ext)
        t = h[156]
        if t in _EXT_TYPES:
            off = _extension(t, h, off, read, gap, 0, None, None, ext)
        else:  # another entry: it takes the pending records itself
            _, data, size, typ, _ = _member(h, off, off, None, ext)
            off = data if typ in _NO_DATA else data + ((size + 511) & ~511)
    if off != n:
        raise TarFormatError("the last record before the header runs past it")
    if ext.name is not None:
        return ext.name
    return None if ext.gpath is None else ext.gpath.rstrip("/")


def _compressed(head: bytes, shard: str | None) -> None:
    """Raise if ``head`` starts like a compressed file."""
    for magic, kind in _MAGICS:
        if head.startswith(magic):
            raise TarFormatError(
                f"{kind}-compressed; wids reads uncompressed tar", shard=shard, offset=0
            )


def _truncated(off: int, shard: str | None, file_size: int | None, where: str) -> None:
    """Raise TruncatedTarError; ``off`` is where more bytes were expected."""
    if file_size is not None and file_size < off:
        where += f" (expected bytes at {off}, the file has {file_size})"
        off = file_size
    raise TruncatedTarError(f"truncated tar: the file ends {where}", shard=shard, offset=off)
