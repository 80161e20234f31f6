"""Tar header parsing: members' names, data offsets and sizes, without reading their data.

Three entry points share one header walker:

- :func:`iter_members_fetch` — random access through a ``fetch(start, end) -> bytes`` callable;
  reads each 512-byte header (and the data of pax / GNU long-name records) and skips member data.
- :func:`iter_members_stream` — one sequential pass over a non-seekable stream (remote shards),
  read in large chunks; it never seeks and reads the stream to its end.
- :func:`scan_local` (and :func:`scan_local_rows`) — a local file read with ``os.pread``, a small
  window per header, the fastest path.

Formats: ustar (``prefix`` field), GNU (``L`` long name, ``K`` long link, base-256 numbers), pax
(``x`` for the next member, ``g`` global; ``path`` and ``size`` override the header), v7.
Results agree with :mod:`tarfile` (the test oracle): same names, data offsets, sizes and types.

Strictness, where it differs from :mod:`tarfile`:

- The archive must end with an end-of-archive block (a 512-byte zero block; like tarfile we stop
  at the first one). A file that ends at a member boundary without one is reported as truncated
  (:class:`~wids.errors.TruncatedTarError`): tarfile accepts such a prefix silently, and an index
  built from it would be silently short.
- A bad header checksum anywhere is a :class:`~wids.errors.HeaderChecksumError`; tarfile treats a
  bad header after the first one as the end of the archive.
- A pax ``size`` that is not a number is an error (tarfile uses 0).
- A global (``g``) pax ``size`` applies to the member's size *and* to where its data ends;
  tarfile reports it as the size but skips by the header's size. Nobody writes such archives.
- GNU sparse members (type ``S`` or pax ``GNU.sparse.*``) are rejected: their stored bytes are not
  the file's content, so a byte range could not serve them.

- A 0-byte file is an error; an archive of only zero blocks (or only a pax ``g`` record and
  zero blocks, which tarfile cannot read) yields nothing.
- Extension records over :data:`MAX_EXTENSION` bytes are refused rather than read into memory.
- Sizes of :data:`MAX_MEMBER_SIZE` (2**62) or more are refused: no storage holds such a member,
  and offsets computed from them would overflow.
- Every pax record's length must end exactly at its newline inside the record data, and
  anything but NUL padding after the last record is an error (tarfile before 3.12.5 took the
  wrong bytes into a value or dropped the rest silently).

Like tarfile, data is skipped only for regular files and unknown types; for hard and symbolic
links, directories, devices and fifos the next header follows directly.

Every header's checksum is verified (the unsigned sum, or the historic signed one, as tarfile
accepts). The fetch path checks each header as it reads it; the local scan and the stream check
them in numpy batches of a few thousand (a third of the per-header cost in pure Python) and hand
out a batch's members only after it passed, reporting the first bad header as if it had been
checked first.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import starmap
from typing import Any, BinaryIO

from .errors import HeaderChecksumError, ShardNotFoundError, TarFormatError, TruncatedTarError

__all__ = [
    "TarMember",
    "header_mismatch",
    "iter_members_fetch",
    "iter_members_stream",
    "scan_local",
    "scan_local_rows",
]

BLOCK = 512
STREAM_CHUNK = 1 << 20
# scan_local reads this much per pread: small members' headers then arrive with the one before.
LOCAL_WINDOW = 3072
# Larger pax / GNU long-name records are refused rather than read into memory.
MAX_EXTENSION = 16 << 20

_ZERO = bytes(BLOCK)
_REGULAR = frozenset("07")
# Types after which tarfile does not skip data blocks (all other types have data).
_NO_DATA = frozenset("123456")
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
Row = tuple[str, int, int, str, int]


@dataclass(frozen=True, slots=True)
class TarMember:
    r"""One entry of a tar archive.

    Attributes:
        name: Full path, after the ustar prefix, a GNU long name or a pax ``path`` are applied;
            UTF-8 with ``surrogateescape`` for invalid bytes; no trailing slash on directories.
        offset: Byte offset of the member's data in the archive.
        size: Size of the member's data in bytes.
        type: The typeflag as one character: ``"0"`` regular (``"\0"`` is normalised to
            ``"0"``), ``"5"`` directory, ``"2"`` symlink, ``"1"`` hardlink, ...
        header_offset: Where the member's first header block starts, extension headers
            (pax ``x``, GNU ``L``/``K``) included.
    """

    name: str
    offset: int
    size: int
    type: str
    header_offset: int

    @property
    def isreg(self) -> bool:
        r"""Whether this is a regular file (types ``"0"``, ``"7"`` or ``"\0"``)."""
        return self.type in _REGULAR or self.type == "\0"


_set_name, _set_offset, _set_size, _set_type, _set_header_offset = (
    TarMember.__dict__[f].__set__ for f in ("name", "offset", "size", "type", "header_offset")
)


def _member_of(
    name: str, offset: int, size: int, type: str, header_offset: int, _new: Any = object.__new__
) -> TarMember:
    """``TarMember(...)`` at two thirds of the cost.

    The frozen dataclass ``__init__`` goes through ``object.__setattr__`` per field; the slots'
    own setters are quicker. Nothing else differs (the class has no ``__post_init__``).
    """
    m = _new(TarMember)
    _set_name(m, name)
    _set_offset(m, offset)
    _set_size(m, size)
    _set_type(m, type)
    _set_header_offset(m, header_offset)
    return m  # type: ignore[no-any-return]


def iter_members_fetch(
    fetch: Callable[[int, int], bytes],
    *,
    shard: str | None = None,
    file_size: int | None = None,
) -> Iterator[TarMember]:
    """Iterate the members of a tar through random-access reads.

    Reads each 512-byte header with one call, and the data of pax and GNU long-name records;
    seeks past member data.

    Args:
        fetch: ``fetch(start, end)`` returns the archive's bytes ``[start, end)``; fewer bytes
            (or none) at the end of the file.
        shard: Name used in error messages.
        file_size: The archive's size, if known. Reads are then clamped to it and truncation is
            reported before asking ``fetch`` for bytes past the end.

    Yields:
        Every entry except pax and GNU extension records, in archive order.

    Raises:
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """

    def read(n: int, off: int) -> bytes:
        end = off + n
        if file_size is not None:
            if off >= file_size:
                return b""
            end = min(end, file_size)
        return fetch(off, end)

    for rows in _walk(read, BLOCK, shard, file_size):
        yield from starmap(_member_of, rows)


def iter_members_stream(stream: BinaryIO, *, shard: str | None = None) -> Iterator[TarMember]:
    """Iterate the members of a tar in one sequential pass over a stream.

    The stream is read in chunks of about 1 MiB, member data is discarded, and nothing is
    seeked; after the end-of-archive block the rest of the stream is read and discarded, so the
    bytes read equal the stream's length. Members come in batches of a few thousand (their
    header checksums are verified together).

    Args:
        stream: A binary file-like object with ``read(n)``; need not be seekable.
        shard: Name used in error messages.

    Yields:
        Every entry except pax and GNU extension records, in archive order.

    Raises:
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """
    reader = _StreamReader(stream)
    for rows in _walk(reader, BLOCK, shard, None, defer=True):
        yield from starmap(_member_of, rows)
    reader.drain()


def scan_local(path: str | os.PathLike[str], *, shard: str | None = None) -> list[TarMember]:
    """List the members of a local tar file, reading only around its headers.

    Args:
        path: A local file path.
        shard: Name used in error messages (default: ``path``).

    Returns:
        Every entry except pax and GNU extension records, in archive order.

    Raises:
        ShardNotFoundError: ``path`` does not exist.
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """
    return list(starmap(_member_of, scan_local_rows(path, shard=shard)))


def scan_local_rows(path: str | os.PathLike[str], *, shard: str | None = None) -> list[Row]:
    """Like :func:`scan_local`, as plain tuples, for bulk consumers such as the index builder.

    Building a frozen dataclass per member costs about as much as parsing its header; callers
    that turn members into arrays anyway can take tuples.

    Args:
        path: A local file path.
        shard: Name used in error messages (default: ``path``).

    Returns:
        ``(name, offset, size, type, header_offset)`` per member, the fields of
        :class:`TarMember` in order (``TarMember(*row)`` builds one).

    Raises:
        ShardNotFoundError: ``path`` does not exist.
        TarFormatError: The bytes are not a valid tar (or are compressed).
        TruncatedTarError: The archive ends inside a header or member, or has no end block.
        HeaderChecksumError: A header's checksum does not match.
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY)
    except FileNotFoundError:
        raise ShardNotFoundError(f"no such file: {name}", shard=shard or name) from None
    try:
        size = os.fstat(fd).st_size
        out: list[Row] = []
        for rows in _walk(partial(os.pread, fd), LOCAL_WINDOW, shard or name, size, defer=True):
            out += rows
        return out
    finally:
        os.close(fd)


class _StreamReader:
    """``read(n, off)`` over a forward-only stream: bytes from ``off``, at least ``n`` unless EOF.

    Offsets must not decrease. Returned bytes may run past ``off + n`` (to the end of the
    current chunk), which lets the walker parse many headers from one buffer.
    """

    def __init__(self, stream: BinaryIO, chunk: int = STREAM_CHUNK) -> None:
        self.stream = stream
        self.chunk = chunk
        self.buf = b""
        self.base = 0  # archive offset of buf[0]
        self.eof = False
        self.pos = 0  # bytes read from the stream so far

    @property
    def known_size(self) -> int | None:
        """The stream's length, once its end has been reached."""
        return self.pos if self.eof else None

    def _next_chunk(self) -> bytes:
        if self.eof:
            return b""
        data = self.stream.read(self.chunk)
        if not data:
            self.eof = True
            return b""
        self.pos += len(data)
        return data

    def __call__(self, n: int, off: int) -> bytes:
        buf, base = self.buf, self.base
        if off >= base + len(buf):
            base += len(buf)
            buf = b""
            while base < off:  # discard member data, chunk by chunk
                data = self._next_chunk()
                if not data:
                    break
                if base + len(data) > off:
                    buf = data[off - base :]
                    base = off
                else:
                    base += len(data)
        elif off > base:
            buf = buf[off - base :]
            base = off
        while len(buf) < n:
            data = self._next_chunk()
            if not data:
                break
            buf += data
        self.buf, self.base = buf, base
        return buf if base == off else b""

    def drain(self) -> None:
        """Read the stream to its end (the padding after the end-of-archive block)."""
        self.buf = b""
        while self._next_chunk():
            pass


def _walk(
    read: Callable[[int, int], bytes],
    window: int,
    shard: str | None,
    file_size: int | None,
    defer: bool = False,
) -> Iterator[list[Row]]:
    """Yield lists of ``(name, offset, size, type, header_offset)``, every entry of an archive.

    ``read(n, off)`` returns bytes starting at ``off``: at least ``n`` unless the file ends first
    (more is fine). ``window`` (>= 512) is what to ask for per header. The common case, a regular
    file with an ASCII header and no extension records, runs inline; the rest in helpers.

    Rows are handed out (a new list each time) before each ``read``. With ``defer``, header
    checksums are verified in batches of :data:`_BATCH` with numpy instead of one by one (a
    third of the per-header cost); rows are held back until their headers are verified, and an
    error raised meanwhile is replaced by the checksum error of an earlier or the same header,
    as if each had been checked first. Extension headers, whose sizes decide what is read, are
    checked at once.
    """
    off = base = blen = 0
    buf = b""
    ext = _Ext()  # pending pax x / GNU L state, and pax g globals
    rows: list[Row] = []
    emit = rows.append
    hdrs: list[bytes] = []  # defer: the headers of ``rows``, not verified yet
    flush_at = _BATCH if defer else 1
    plain = True  # no extension record pending, no pax globals: the hot path applies
    try:
        while True:
            p = off - base
            if p + BLOCK > blen:
                if len(rows) >= flush_at:
                    if hdrs:
                        _verify_batch(hdrs, rows, off, shard)
                    yield rows
                    rows = []
                    emit = rows.append
                buf = read(window, off)
                base, p, blen = off, 0, len(buf)
                if blen < BLOCK:
                    _short_header(buf, off, shard, _size_at_end(read, off, blen, file_size), ext)
            h = buf[p : p + BLOCK]
            if defer:
                if not h[0] and h == _ZERO:
                    if ext.pending():
                        _bad_checksum(h, 256, off, shard, ext)  # raises
                    break
                hdrs.append(h)
            else:
                # Every byte < 128 makes the sum < 65521, so adler32 gives it exactly.
                u = (
                    (_adler32(h[156:], _adler32(h[:148])) & 0xFFFF) + 255
                    if h.isascii()
                    else _unsigned_sum(h)
                )
                if b"%06o\0 " % u != h[148:156] and _bad_checksum(h, u, off, shard, ext):
                    break  # the end-of-archive block
            t = h[156]
            if (t == 48 or t == 0) and plain:  # "0" or "\0": regular file, the hot path
                try:  # 11 octal digits and a NUL, as tarfile and GNU tar write it
                    size = int(h[124:135], 8) if h[135] == 0 else _number(h, off, shard)
                except ValueError:  # a NUL or space inside, or base-256
                    size = _number(h, off, shard)
                if size < 0:
                    _member(h, off, off, shard, ext)  # raises, naming the member
                name = h[:100].partition(b"\0")[0]
                if t == 0 and name.endswith(b"/"):  # v7 directory
                    row = _member(h, off, off, shard, ext)
                    off = row[1]
                    emit(row)
                    continue
                if h[345]:
                    name = h[345:500].partition(b"\0")[0] + b"/" + name
                data = off + BLOCK
                emit((name.decode("utf-8", "surrogateescape"), data, size, "0", off))
                off = data + ((size + 511) & ~511)
            elif t in _EXT_TYPES:
                if defer:
                    hdrs.pop()
                    _check(h, off, shard, ext)
                off = _extension(t, h, off, read, buf, base, shard, file_size, ext)
                plain = False
            else:
                row = _member(h, off, ext.hoff if ext.hoff >= 0 else off, shard, ext)
                data = off + BLOCK
                size = row[2]
                off = data + ((size + 511) & ~511) if row[3] not in _NO_DATA else data
                emit(row)
                plain = not ext.active
        if hdrs:
            _verify_batch(hdrs, rows, off, shard)
    except TarFormatError:
        if hdrs:  # a bad checksum before (or at) the failure explains it better
            _verify_batch(hdrs, rows, off, shard)
        raise
    if rows:
        yield rows


_BATCH = 4096


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

    u64 = np.uint64
    arr = np.frombuffer(b"".join(hdrs), dtype=np.uint8).reshape(-1, BLOCK)
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
    for k in np.flatnonzero(field != expected).tolist():
        h = hdrs[k]
        at = rows[k][1] - BLOCK if k < len(rows) else off
        _bad_checksum(h, _unsigned_sum(h), at, shard, _Ext())
    hdrs.clear()


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
            ext.name = (data[:i] if i >= 0 else data).decode("utf-8", "surrogateescape")
            ext.name_from_gnu = True
    else:
        records = _pax_records(data, off, shard)
        if any(k.startswith("GNU.sparse.") for k in records):
            raise TarFormatError(
                "GNU sparse member (pax); wids cannot serve sparse files", shard=shard, offset=off
            )
        path = records.get("path")
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


def header_mismatch(h: bytes, name: str, size: int) -> str | None:
    """Check that ``h`` is the header of a regular member ``name`` of ``size`` bytes.

    This is how a reader proves that bytes it got from storage come from where the index says:
    the 512 bytes just before a member's data are that member's own header. A header is only
    compared on what every writer puts there: a valid checksum, a regular-file type, the size
    (unless it needs more than 11 octal digits, when a pax record may carry it) and the name
    when it fits the header unchanged (ASCII, at most 100 bytes). Longer or non-ASCII names
    come from a GNU ``L`` or pax ``path`` record before the header, and writers put different
    approximations of them in the header itself, so those are not compared.

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
    if len(raw) <= 100 and raw.isascii():
        got = h[:100].partition(b"\0")[0]
        if h[345]:
            got = h[345:500].partition(b"\0")[0] + b"/" + got
        if got != raw:
            shown = got.decode("utf-8", "backslashreplace")
            return f"the header names {shown!r} where the index says {name!r}"
    return None


def _compressed(head: bytes, shard: str | None) -> None:
    """Raise if ``head`` starts like a compressed file."""
    for magic, kind in _MAGICS:
        if head.startswith(magic):
            raise TarFormatError(
                f"{kind}-compressed; wids reads uncompressed tar", shard=shard, offset=0
            )


def _size_at_end(
    read: Callable[[int, int], bytes], off: int, got: int, file_size: int | None
) -> int | None:
    """The file's size, for error messages, once a read came back short."""
    if file_size is not None:
        return file_size
    known = getattr(read, "known_size", None)  # a stream knows, once it has ended
    if known is not None or got or off == 0:
        return known if known is not None else off + got
    try:  # random access: does the file end exactly at ``off``, or before?
        return off if len(read(1, off - 1)) == 1 else None
    except Exception:  # noqa: BLE001 - a probe for a better message, nothing more
        return None


def _short_header(
    buf: bytes, off: int, shard: str | None, file_size: int | None, ext: _Ext
) -> None:
    """Raise for a read that ended before a whole header block."""
    if off == 0:
        if not buf:
            raise TarFormatError("empty file (0 bytes); not a tar archive", shard=shard, offset=0)
        _compressed(buf, shard)
        raise TruncatedTarError(
            f"truncated or not a tar archive: {len(buf)} bytes, less than one header",
            shard=shard,
            offset=0,
        )
    if buf:
        where = "inside a header block"
    elif file_size is None or off > file_size:
        where = "inside member data"
    elif ext.pending():
        where = "after an extension record, before its member's header"
    else:
        where = "without an end-of-archive block"
    _truncated(off + len(buf), shard, file_size, where)


def _truncated(off: int, shard: str | None, file_size: int | None, where: str) -> None:
    """Raise TruncatedTarError; ``off`` is where more bytes were expected."""
    if file_size is not None and file_size < off:
        where += f" (expected bytes at {off}, the file has {file_size})"
        off = file_size
    raise TruncatedTarError(f"truncated tar: the file ends {where}", shard=shard, offset=off)
