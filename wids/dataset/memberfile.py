"""One tar member as a read-only, seekable binary file: ``os.pread`` locally, range reads remotely.

:class:`MemberFile` is what ``ShardListDataset.open(i, field)`` returns, and what ``ds[i]``
holds instead of bytes for members over ``stream_over``: a file object (``read``,
``readinto``, ``seek``, ``tell``, a context manager) over bytes ``[offset, offset + size)`` of
a shard, for consumers that seek and read (video and audio decoders, ``zipfile``,
``tarfile``, ``wave``), so decoding two seconds of a 1 GB video reads about the bytes the
decoder consumes.

Local shards are read with ``os.pread`` on a descriptor of the handle's own, straight into
the caller's buffer; the page cache is the read-ahead. Remote shards are read through the
shard's :class:`~wids.storage.Source` (range requests, retries, the answer checks of every
remote read): a miss fetches what was asked for, or more while the reads are sequential (the
read-ahead of a miss is as long as the run of sequential reads before it, from ``readahead``
up to ``max_readahead``, and starts again after a seek: at most as many bytes fetched ahead
as were consumed), so at most one block of read-ahead is held at a time.

Every read is verified like the dataset's: the version of the shard is pinned (the index's
etag, or the first answer's; a pickled handle carries it to the process that unpickles it),
so a shard replaced while it is read raises
:class:`~wids.errors.IndexMismatchError`; and a handle's first read in a process also reads the
512 bytes before the member and checks they are its tar header
(:func:`~wids.tar.header_mismatch`): in the same request when the read starts near the
member's beginning, else in a request of its own (512 bytes). Errors keep their type and
name the shard, key and field.

A handle pickles as what it reads (source, member, position); descriptors, buffers and
connections are made again in the process that uses it (a DataLoader worker, under fork,
forkserver or spawn).
"""

from __future__ import annotations

import copy
import io
import operator
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import IndexMismatchError, WidsError
from ..index.contents import mismatch_error
from ..storage import Source, forks, redact_url, strip_credentials
from ..tar import header_mismatch
from .readers import CachedReader, RangeReader
from .wholeshard import MemoryReader, probe_range

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from .catalog import Catalog
    from .pool import ReaderPool
    from .readers import ShardReader

__all__ = [
    "DEFAULT_READAHEAD",
    "MAX_READAHEAD",
    "MemberFile",
    "check_stream_over",
    "member_file",
    "streamed_sample",
]

HEADER = 512
DEFAULT_READAHEAD = 64 << 10
"""First read-ahead of a remote handle (bytes fetched beyond a read, at least the read)."""
MAX_READAHEAD = 8 << 20
"""The most a remote handle's read-ahead grows to along sequential reads (and holds)."""


class MemberFile(io.RawIOBase):
    """A read-only, seekable binary file over one member of a shard.

    Made by :meth:`wids.ShardListDataset.open` (and by ``ds[i]`` with ``stream_over``);
    it can also be made from a :class:`~wids.storage.Source` and the member's place.

    Args:
        source: The shard (local path or remote URL, with its store and recorded version).
        offset: Where the member's data begins in the shard (after its tar header).
        size: The member's size in bytes.
        key: The sample's key (for the header check and messages).
        field: The member's field, with its leading dot (``".mp4"``).
        readahead: A remote handle's first read-ahead in bytes (grows along sequential reads).
        max_readahead: The most a remote handle fetches beyond a read.
        copy: A descriptor of a verified local copy of the whole shard (the shard cache's,
            ``access="shard"``), which the handle then owns and reads by ``os.pread``; in
            another process (pickled, forked) the handle reads ``source`` again.

    Attributes:
        name: ``key + field``, the member's name in the shard.
        size: The member's size.

    Raises:
        ValueError: A negative offset or size, or an offset that leaves no room for a header.

    Example:
        >>> with ds.open(0, ".wav") as f:  # doctest: +SKIP
        ...     import wave
        ...     frames = wave.open(f).readframes(16000)
    """

    def __init__(
        self,
        source: Source,
        offset: int,
        size: int,
        *,
        key: str,
        field: str,
        readahead: int = DEFAULT_READAHEAD,
        max_readahead: int = MAX_READAHEAD,
        copy: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(source, Source):
            raise TypeError(f"source must be a wids Source, not {type(source).__name__}")
        for what, value in (("size", size), ("readahead", readahead)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{what} must be an int >= 0, not {value!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < HEADER:
            raise ValueError(f"offset must be an int >= {HEADER} (after a header), not {offset!r}")
        if isinstance(max_readahead, bool) or not isinstance(max_readahead, int):
            raise ValueError(f"max_readahead must be an int, not {max_readahead!r}")
        self.source = source
        self.offset = offset
        self.size = size
        self.key = key
        self.field = field
        self.name = key + field
        self.readahead = readahead
        self.max_readahead = max(max_readahead, readahead)
        self._pos = 0
        self._fd: int | None = None
        self._reset_process()
        if copy is not None:  # already verified against the index: no header check
            self._fd, self._checked = copy, True

    def _reset_process(self) -> None:
        self._made = forks.stamp()
        self._fd = None
        self._checked = False  # the member's header, once per process
        self._buf = b""
        self._buf_start = 0
        self._run_start = 0  # where the current run of sequential reads began
        self._lock = threading.RLock()

    # -- pickling: what it reads, not how ------------------------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        if self.closed:
            raise ValueError(f"cannot pickle a closed member file ({self._where()})")
        src = self.source
        if not src.is_local:  # the version this process pinned, for the next process to read
            etag = src.pin.etag if src.pin.pinned else src.etag
            src = src.store.source(src.url, size=src.size, etag=etag, mtime=src.mtime)
        args = (src, self.offset, self.size)
        kwargs = {
            "key": self.key,
            "field": self.field,
            "readahead": self.readahead,
            "max_readahead": self.max_readahead,
        }
        return (_rebuild, (args, kwargs, self._pos))

    # -- io.RawIOBase -------------------------------------------------------------------------

    def readable(self) -> bool:
        """Always ``True`` (until closed)."""
        self._check_open()
        return True

    def seekable(self) -> bool:
        """Always ``True`` (until closed)."""
        self._check_open()
        return True

    def writable(self) -> bool:
        """Always ``False``: members are read-only."""
        self._check_open()
        return False

    @property
    def mode(self) -> str:
        """``"rb"``."""
        return "rb"

    def tell(self) -> int:
        """The position in the member."""
        self._check_open()
        with self._lock:
            self._check_open()
            return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` from the start, the current position or the end; no I/O.

        Raises:
            TypeError: An offset that is not an integer (``1.5``).
            ValueError: A negative resulting position or an unknown ``whence``.
        """
        offset = operator.index(offset)
        self._check_open()
        with self._lock:
            self._check_open()
            if whence == io.SEEK_SET:
                pos = offset
            elif whence == io.SEEK_CUR:
                pos = self._pos + offset
            elif whence == io.SEEK_END:
                pos = self.size + offset
            else:
                raise ValueError(f"invalid whence {whence!r}")
            if pos < 0:
                raise ValueError(f"negative seek position {pos}")
            self._pos = pos
            return pos

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the position (all the rest for ``-1``/``None``)."""
        want = -1 if size is None else operator.index(size)
        self._check_open()
        with self._lock:  # the position is read and moved under the lock: one reader at a time
            self._check_open()
            start = self._pos
            n = max(0, min(self.size - start if want < 0 else want, self.size - start))
            if n == 0:
                return b""
            data = self._read_at(start, n)
            self._pos = start + len(data)
            return data

    def readall(self) -> bytes:
        """The rest of the member, in one read."""
        return self.read(-1)

    def readinto(self, buffer: Buffer) -> int:
        """Read into ``buffer``; the number of bytes read (0 at the end of the member)."""
        self._check_open()
        view = memoryview(buffer).cast("B")
        with self._lock:
            self._check_open()
            start = self._pos
            n = max(0, min(len(view), self.size - start))
            if n == 0:
                return 0
            if self._fd is not None or self.source.is_local:
                got = self._preadinto(view[:n], start)
            else:
                data = self._read_at(start, n)
                got = len(data)
                view[:got] = data
            self._pos = start + got
            return got

    def close(self) -> None:
        """Close the descriptor and drop the read-ahead; the file cannot be read afterwards."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before there was anything to close
            super().close()
            return
        with lock:  # never while another thread reads through the descriptor
            if not self.closed:
                fd, self._fd = self._fd, None
                if fd is not None and self._made == forks.generation:
                    os.close(fd)
                self._buf = b""
            super().close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pos={self._pos}"
        url = redact_url(self.source.url)
        return f"MemberFile({url!r}, {self.name!r}, size={self.size}, {state})"

    # -- reads --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"I/O operation on a closed member file ({self._where()})")
        if self._made != forks.generation:  # forked: the parent's descriptor is not ours
            with forks.lock:
                if self._made != forks.generation:
                    self._fd = None
                    self._reset_process()

    def _where(self) -> str:
        return f"member {self.name!r} (key {self.key!r}, field {self.field!r})"

    def _read_at(self, start: int, n: int) -> bytes:
        """Exactly ``n`` bytes of the member at ``start`` (within it)."""
        if self._fd is not None or self.source.is_local:
            fd = self._descriptor()
            parts: list[bytes] = []
            got = 0
            while got < n:  # one pread returns at most about 2 GiB (Linux): read on
                part = os.pread(fd, n - got, self.offset + start + got)
                if not part:
                    raise self._short(start, got, n)
                parts.append(part)
                got += len(part)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        a = start - self._buf_start
        buf = self._buf
        if 0 <= a and a + n <= len(buf):
            return buf[a : a + n]
        if 0 <= a < len(buf):  # the first part is held: the rest from a new fetch
            head = buf[a:]
            return head + self._read_at(start + len(head), n - len(head))
        if start == self._buf_start + len(buf) and buf:  # sequential: as far as the run went
            ahead = max(self.readahead, start - self._run_start)
        else:  # a seek: start small again
            self._run_start = start
            ahead = self.readahead
        end = min(self.size, start + max(n, min(ahead, self.max_readahead)))
        self._buf = b""  # the old block goes before the new one arrives: one held at a time
        self._buf = self._fetch(start, end)
        self._buf_start = start
        return self._buf[:n]

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the member from storage; the first also checks the header."""
        base = self.offset
        try:
            if self._checked:
                return self.source.read_range(base + start, base + end)
            if start > max(self.readahead, HEADER):  # far from the header: read it on its own
                self.source.read_range(base - HEADER, base, check=self._header_check)
                self._checked = True
                return self.source.read_range(base + start, base + end)
            data = self.source.read_range(base - HEADER, base + end, check=self._header_check)
        except WidsError as e:
            raise self._named(e) from e
        self._checked = True
        return data[HEADER + start :]

    def _header_check(self, data: bytes) -> str | None:
        return header_mismatch(data[:HEADER], self.name, self.size)

    def _descriptor(self) -> int:
        """This process's descriptor of the local shard, opened and checked on first use."""
        fd = self._fd
        if fd is not None:
            return fd
        path = self.source.local_path
        if path is None:  # an invariant: only local sources read through a descriptor
            raise RuntimeError("internal error: a descriptor for a remote member")
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            from ..errors import ShardNotFoundError

            raise ShardNotFoundError(f"no such file, reading {self._where()}", shard=path) from None
        try:
            self._check_local(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return fd

    def _check_local(self, fd: int) -> None:
        """The file is the indexed one by size, and the member's header is where it was."""
        size = os.fstat(fd).st_size
        expected = self.source.size
        problem = None
        if expected is not None and size != expected:
            problem = f"the shard is {size} bytes where the index says {expected}"
        elif self.offset + self.size > size:
            problem = f"the shard ends at byte {size}, inside the member"
        else:
            header = os.pread(fd, HEADER, self.offset - HEADER)
            problem = header_mismatch(header, self.name, self.size)
        if problem is not None:
            raise IndexMismatchError(
                f"{self._where()} at byte {self.offset}: {problem}; the shard changed after "
                "indexing, so rebuild the index",
                shard=redact_url(self.source.url),
            )
        self._checked = True

    def _preadinto(self, view: memoryview, start: int) -> int:
        fd = self._descriptor()
        got = 0
        while got < len(view):  # one preadv returns at most about 2 GiB (Linux): read on
            part: int = os.preadv(fd, [view[got:]], self.offset + start + got)
            if part == 0:
                raise self._short(start, got, len(view))
            got += part
        return got

    def _short(self, start: int, got: int, n: int) -> WidsError:
        return IndexMismatchError(
            f"{self._where()}: {got} of {n} bytes at byte {self.offset + start}: the shard "
            "is shorter than the index says",
            shard=redact_url(self.source.url),
        )

    def _named(self, e: WidsError) -> WidsError:
        """``e`` (same type and attributes) with the member named in its message."""
        named = copy.copy(e)
        WidsError.__init__(named, f"{self._where()}: {e.message}", shard=e.shard)
        return named


def _rebuild(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int) -> MemberFile:
    f = MemberFile(*args, **kwargs)
    f._pos = pos
    return f


# -- the dataset's side: members of an indexed sample as handles --------------------------------


def member_file(
    catalog: Catalog, pool: ReaderPool, shard: int, j: int, field: str, **options: Any
) -> MemberFile | io.BytesIO:
    """A :class:`MemberFile` for ``field`` of sample ``j`` of ``shard``, checked on first touch.

    The shard is opened through the pool as any read would (the first-touch checks against
    the index; ``offline`` refuses a remote shard). The handle reads the shard's storage
    itself, or the shard cache's copy when the pool reads the shard from it
    (``access="shard"``): then no byte is fetched again.

    A member of a compressed shard (``.tar.gz``, ``.tar.zst``) is decoded whole by the
    shard's reader (from the seek point before it, or from the decompressed copy) into an
    ``io.BytesIO``, bounded by ``max_sample_bytes``: its bytes cannot be reached by offset.

    Raises:
        KeyError: The sample has no such field (the message lists the fields it has).
        SampleTooLargeError: A compressed shard's member over ``max_sample_bytes``.
    """
    reader = _reader(catalog, pool, shard)
    members = catalog.members(shard)[0]
    key = members.key(j)
    found = [(off, size) for f, off, size in members.members(j) if f == field]
    if not found:
        have = [f for f, _, _ in members.members(j)]
        raise KeyError(f"sample {key!r} has no field {field!r} (it has {have})")
    info = catalog.load().infos[shard]
    offset, size = found[0]
    if members.seek is not None or isinstance(reader, MemoryReader):
        return io.BytesIO(_decoded_member(catalog, reader, shard, j, key + field, offset, size))
    source = catalog.source(info.url, info)
    copy = _copy_of(reader) if not source.is_local else None
    return MemberFile(source, offset, size, key=key, field=field, copy=copy, **options)


def _reader(catalog: Catalog, pool: ReaderPool, shard: int) -> ShardReader:
    """The shard's reader (first-touch checks, the offline rule), whole if its server ignores it.

    A handle's own range reads would be refused by a server that ignores ``Range``: such a
    shard is read whole (:mod:`.wholeshard`: into the cache, else into memory, one warning
    per server), and its members come from that copy.
    """
    reader = pool.reader(shard)
    url = catalog.load().infos[shard].url
    if isinstance(reader, RangeReader) and probe_range(url, reader, catalog.local):
        reader = pool.without_range({shard: reader}).get(shard, reader)
    return reader


def _decoded_member(
    catalog: Catalog, reader: ShardReader, shard: int, j: int, name: str, offset: int, size: int
) -> bytes:
    """A member read through the shard's reader, its tar header checked.

    For a compressed shard (decoded), or one held whole in memory (its server ignores Range).
    """
    bound = catalog.max_sample_bytes
    if bound is not None and size > bound:
        raise catalog.too_large(shard, j, size)

    def check(data: bytes) -> str | None:
        return header_mismatch(data[:HEADER], name, size)

    problem = f"member {name!r} at byte {offset} leaves no room for its header"
    if offset >= HEADER:
        verify = check if reader.verifies else None
        data = reader.read_span(offset - HEADER, offset + size, catalog.store.stats, verify)
        found = check(data)  # a reader that does not verify (a cached copy) too
        if found is None:
            return data[HEADER:]
        problem = f"at byte {offset - HEADER}, where member {name!r} begins, {found}"
    raise mismatch_error(problem, catalog.load().infos[shard].url)


def _copy_of(reader: ShardReader) -> int | None:
    """A descriptor of the cache's copy a cached reader holds (``access="shard"``), or ``None``."""
    if not isinstance(reader, CachedReader):
        return None
    fileno = getattr(reader.shard, "fileno", None)
    try:
        return None if fileno is None else os.dup(fileno())
    except (OSError, ValueError):  # closed meanwhile: read the storage
        return None


def streamed_sample(
    catalog: Catalog,
    pool: ReaderPool,
    i: int,
    shard: int,
    j: int,
    threshold: int | Mapping[str, int],
) -> dict[str, Any] | None:
    """Sample ``j`` of ``shard`` with members over ``threshold`` bytes as handles.

    ``threshold`` is one size for every field, or a size per field (other fields: bytes).

    ``None`` when no member is over it (the caller reads the sample as usual). Smaller
    members are read whole, one verified read each, so the sample's bytes in memory are its
    small members only, and only those count against ``max_sample_bytes``.

    Raises:
        SampleTooLargeError: The small members together are over ``max_sample_bytes``.
    """
    members = catalog.members(shard)[0]
    rows = members.members(j)
    big = [_over(threshold, field, size) for field, _, size in rows]
    if not any(big):
        return None
    held = sum(size for (_, _, size), b in zip(rows, big, strict=True) if not b)
    bound = catalog.max_sample_bytes  # handles do not count: only the bytes read into memory
    if bound is not None and held > bound:
        raise catalog.too_large(shard, j, held)
    reader = _reader(catalog, pool, shard)
    info = catalog.load().infos[shard]
    key = members.key(j)
    sample: dict[str, Any] = {}
    for (field, offset, size), b in zip(rows, big, strict=True):
        # compressed: members are decoded, not reached by offset; in memory: read from there
        if members.seek is not None or isinstance(reader, MemoryReader):
            data = _decoded_member(catalog, reader, shard, j, key + field, offset, size)
            sample[field] = io.BytesIO(data) if b else data
            continue
        source = catalog.source(info.url, info)
        copy = _copy_of(reader) if not source.is_local else None
        f = MemberFile(source, offset, size, key=key, field=field, copy=copy)
        if b:
            sample[field] = f
        else:
            with f:
                sample[field] = f.readall()
    sample["__key__"] = key
    sample["__index__"] = i
    sample["__shard__"] = strip_credentials(info.url)
    sample["__shardindex__"] = j
    sample["__dataset__"] = catalog.load().dataset_of[shard]
    return sample


def _over(threshold: int | Mapping[str, int], field: str, size: int) -> bool:
    if isinstance(threshold, int):
        return size > threshold
    limit = threshold.get(field)
    return limit is not None and size > limit


def check_stream_over(value: Any) -> int | dict[str, int] | None:
    """``stream_over`` validated: ``None``, a size, or a mapping of fields to sizes.

    Raises:
        ValueError: Anything else (a negative size, a field without its leading dot).
    """

    def size(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, int) and v >= 0

    if value is None or size(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and k.startswith(".") and size(v) for k, v in value.items()
    ):
        return dict(value)
    raise ValueError(
        "stream_over must be None, an int >= 0, or a mapping of fields ('.mp4') to ints >= 0, "
        f"not {value!r}"
    )
