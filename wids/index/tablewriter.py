"""The shard-table index writer: member tables streamed to a temporary file, published whole.

The layout is described in :mod:`wids.index.tableformat`. Per shard the writer keeps a few
numbers in compact arrays (``array``/``bytearray``, not Python objects), so writing 10^6
shards holds tens of MB; each member table goes to the file as it is added.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .members import ShardMembers
from .model import BaseIndexWriter, ShardInfo, component_rows
from .tableformat import (
    FORMAT,
    HAS_ETAG,
    HAS_EXTRA,
    HAS_MD5,
    HAS_MEMBERS,
    HAS_MTIME,
    HAS_SIZE,
    IS_COMPRESSED,
    MAGIC,
    MAX_EXTRA,
    PREAMBLE,
    SEEK_VERSION,
    STRINGS,
    VERSION,
    encode_members,
)

__all__ = ["TableIndexWriter"]

_ALIGN = 64


class _Strings:
    """One string column being written: every shard's value (``url``) or only the ones set."""

    def __init__(self) -> None:
        self.blob = bytearray()
        self.off = array("q", [0])
        self.sparse: dict[int, bytes] = {}

    def add(self, value: str) -> None:
        self.blob += value.encode("utf-8", "surrogateescape")
        self.off.append(len(self.blob))

    def columns(self, n: int) -> tuple[np.ndarray, bytes] | None:
        """The ``_off`` and ``_blob`` columns of ``n`` shards, or ``None`` if none is set."""
        if not self.sparse:
            if len(self.off) == 1:
                return None
            return np.frombuffer(self.off, dtype=np.int64), bytes(self.blob)
        keys = sorted(self.sparse)
        lengths = np.zeros(n, dtype=np.int64)
        lengths[keys] = [len(self.sparse[k]) for k in keys]
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        return off, b"".join(self.sparse[k] for k in keys)


class TableIndexWriter(BaseIndexWriter):
    """Builds a shard-table index in a temporary file and publishes it atomically on close.

    Shards added before any :meth:`start_component` call form the main component (named
    ``name``); each :meth:`start_component` opens a sub-dataset. Use from one thread.

    Args:
        path: Local path of the index to write (``*.widx``).
        name: The dataset's name.
    """

    records_seek = True

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        super().__init__(path, name=name)
        self._tmp: Any = None
        self._has_seek = False  # a compressed shard's table: the header is version 2
        self._end = PREAMBLE.size
        self._nsamples = array("q")
        self._size = array("q")
        self._mtime = array("d")
        self._mem_off = array("q")
        self._mem_len = array("q")
        self._flags = bytearray()
        self._strings = {s: _Strings() for s in STRINGS}
        self._components: list[tuple[str, float | None, int]] = [(name or "", None, 0)]

    def _file(self) -> int:
        if self._tmp is None:
            from ..atomic import TempFile

            self._tmp = TempFile(os.path.dirname(self.path), os.path.basename(self.path))
            os.pwrite(self._tmp.fd, PREAMBLE.pack(MAGIC, 0, 0), 0)
        return self._tmp.fd  # type: ignore[no-any-return]

    def _write(self, data: bytes | memoryview, align: int) -> int:
        fd = self._file()
        at = -(-self._end // align) * align
        os.pwrite(fd, data, at)
        self._end = at + len(data)
        return at

    def _start_component(self, name: str, weight: float | None) -> None:
        self._components.append((name, weight, len(self._nsamples)))

    def _add(
        self, info: ShardInfo, members: ShardMembers | None, extra: Mapping[str, Any] | None
    ) -> None:
        url, size, etag, mtime, md5 = info.url, info.size, info.etag, info.mtime, info.md5sum
        k = len(self._nsamples)
        flags = 0
        if size is not None:
            flags = HAS_SIZE
        if etag is not None:
            flags |= HAS_ETAG
            self._strings["etag"].sparse[k] = etag.encode("utf-8", "surrogateescape")
        if mtime is not None:
            if not math.isfinite(mtime):
                raise ValueError(f"{url}: mtime {mtime!r} is not finite")
            flags |= HAS_MTIME
        if md5 is not None:
            flags |= HAS_MD5
            self._strings["md5"].sparse[k] = md5.encode("utf-8", "surrogateescape")
        if extra:
            flags |= HAS_EXTRA
            self._strings["extra"].sparse[k] = _extra_bytes(extra, url)
        if members is not None:
            flags |= HAS_MEMBERS
            blob = encode_members(members)
            if members.seek is not None:
                flags |= IS_COMPRESSED
                self._has_seek = True
            self._mem_off.append(self._write(blob, 8))
            self._mem_len.append(len(blob))
        else:
            self._mem_off.append(0)
            self._mem_len.append(0)
        self._nsamples.append(info.nsamples)
        self._size.append(0 if size is None else size)
        self._mtime.append(0.0 if mtime is None else mtime)
        self._flags.append(flags)
        self._strings["url"].add(url)

    def add_many(
        self,
        infos: Sequence[ShardInfo],
        urls: Sequence[str] | None = None,
        extras: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None:
        """Record many shards without member tables at once, a column at a time.

        The same as :meth:`add` for each (what conversion of a description of 10^6 shards does).

        Args:
            infos: The shards.
            urls: The URLs to store instead of ``infos[k].url`` (same length), if given.
            extras: More keys for each shard (same length), if given.

        Raises:
            ValueError: A value cannot be stored.
        """
        self._check_open()
        n, k0 = len(infos), len(self._nsamples)
        urls = [i.url for i in infos] if urls is None else urls
        if len(urls) != n or (extras is not None and len(extras) != n):
            raise ValueError("infos, urls and extras differ in length")
        if not all(type(u) is str and u for u in urls):
            raise ValueError("every shard url must be a non-empty string")
        encoded = [u.encode("utf-8", "surrogateescape") for u in urls]
        col = self._strings["url"]
        ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n)) + len(col.blob)
        col.blob += b"".join(encoded)
        col.off.frombytes(ends.tobytes())
        sizes = [i.size for i in infos]
        mtimes = [i.mtime for i in infos]
        flags = np.zeros(n, dtype=np.uint8)
        for bit, values in ((HAS_SIZE, sizes), (HAS_MTIME, mtimes)):
            flags[[k for k, v in enumerate(values) if v is not None]] |= bit
        for bit, name, attr in ((HAS_ETAG, "etag", "etag"), (HAS_MD5, "md5", "md5sum")):
            sparse = self._strings[name].sparse
            for k, info in enumerate(infos):
                value = getattr(info, attr)
                if value is not None:
                    flags[k] |= bit
                    sparse[k0 + k] = value.encode("utf-8", "surrogateescape")
        if any(m is not None and not math.isfinite(m) for m in mtimes):
            raise ValueError("an mtime is not finite")
        for k, extra in enumerate(extras or ()):
            if extra:
                flags[k] |= HAS_EXTRA
                self._strings["extra"].sparse[k0 + k] = _extra_bytes(extra, urls[k])
        self._nsamples.frombytes(
            np.fromiter((i.nsamples for i in infos), dtype=np.int64, count=n).tobytes()
        )
        self._size.frombytes(np.array([s or 0 for s in sizes], dtype=np.int64).tobytes())
        self._mtime.frombytes(np.array([m or 0.0 for m in mtimes], dtype=np.float64).tobytes())
        zeros = bytes(8 * n)
        self._mem_off.frombytes(zeros)
        self._mem_len.frombytes(zeros)
        self._flags += flags.tobytes()

    def _columns(self) -> dict[str, np.ndarray | bytes]:
        nsamples = np.frombuffer(self._nsamples, dtype=np.int64)
        if len(nsamples) and int(nsamples.min()) < 0:
            raise ValueError("nsamples must not be negative")
        cum = np.zeros(len(nsamples) + 1, dtype=np.int64)
        np.cumsum(nsamples, out=cum[1:])
        flags = np.frombuffer(bytes(self._flags), dtype=np.uint8)
        cols: dict[str, np.ndarray | bytes] = {"nsamples": nsamples, "cum": cum, "flags": flags}
        if np.any(flags & HAS_SIZE):
            cols["size"] = np.frombuffer(self._size, dtype=np.int64)
        if np.any(flags & HAS_MTIME):
            cols["mtime"] = np.frombuffer(self._mtime, dtype=np.float64)
        if np.any(flags & HAS_MEMBERS):
            cols["mem_off"] = np.frombuffer(self._mem_off, dtype=np.int64)
            cols["mem_len"] = np.frombuffer(self._mem_len, dtype=np.int64)
        for name, col in self._strings.items():
            got = col.columns(len(nsamples))
            if got is not None or name == "url":
                off, blob = got or (np.zeros(1, dtype=np.int64), b"")
                cols[f"{name}_off"], cols[f"{name}_blob"] = off, blob
        return cols

    def close(self) -> None:
        """Write the columns and the header and publish the file atomically."""
        if self._closed:
            return
        self._closed = True
        try:
            fd = self._file()
            table = {}
            for name, data in self._columns().items():
                raw = (
                    data.astype(data.dtype.newbyteorder("<")).tobytes()
                    if isinstance(data, np.ndarray)
                    else data
                )
                dtype = data.dtype.str if isinstance(data, np.ndarray) else "|u1"
                table[name] = [self._write(raw, _ALIGN), len(raw), dtype]
            header = {
                "format": FORMAT,
                "version": SEEK_VERSION if self._has_seek else VERSION,
                "name": self.name or "",
                "nshards": len(self._nsamples),
                "components": self._component_list(),
                "report": self._report,
                "columns": table,
            }
            text = json.dumps(header, ensure_ascii=False).encode("utf-8")
            at = self._write(text, 8)
            os.pwrite(fd, PREAMBLE.pack(MAGIC, at, len(text)), 0)
            self._tmp.publish(self.path)
        except BaseException:
            self._discard()
            raise

    def _component_list(self) -> list[dict[str, Any]]:
        return [
            {"name": c[0], "weight": c[1], "first_shard": c[2], "stop_shard": c[3]}
            for c in component_rows(self._components, len(self._nsamples))
        ]

    def abort(self) -> None:
        """Give up: remove the temporary file; the destination is untouched."""
        self._closed = True
        self._discard()

    def _discard(self) -> None:
        if self._tmp is not None:
            self._tmp.close()


def _extra_bytes(extra: Mapping[str, Any], url: str) -> bytes:
    """A shard's extra keys as stored, refused over :data:`MAX_EXTRA` (readers refuse more)."""
    data = json.dumps(dict(extra), ensure_ascii=False).encode("utf-8", "surrogateescape")
    if len(data) > MAX_EXTRA:
        from ..errors import IndexFormatError
        from ..storage import redact_url

        raise IndexFormatError(
            f"extra keys of {len(data)} bytes, over the shard table's {MAX_EXTRA} (the metadata "
            "columns of a shard this large: a .json or .sqlite index holds them)",
            shard=redact_url(url),
        )
    return data
