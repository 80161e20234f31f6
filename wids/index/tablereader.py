"""The shard-table index reader: columns mapped at open, each shard decoded on first use.

The layout is described in :mod:`wids.index.tableformat`. Opening a local index maps the
file (``mmap``): the columns are views of the page cache, shared by every process that opens
the same file (DataLoader workers, ranks on one machine). A remote index is read by range
requests: the header and the columns at open, a member table when its shard is first used.
Open checks what the index lookup relies on (sample counts, cumulative counts, the column
table); :meth:`TableIndex.shard` checks one shard's values when it is asked for.
"""

from __future__ import annotations

import json
import math
import mmap
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from ..errors import IndexFormatError, NotAnIndexError, UntrustedLocationError
from ..storage import Store, redact_url
from .lastpart import blob_candidates, renames
from .members import ShardMembers
from .model import MAX_NSAMPLES, MAX_SHARD_SIZE, Component, ShardInfo, max_samples
from .tableformat import (
    COLUMNS,
    FORMAT,
    HAS_ETAG,
    HAS_EXTRA,
    HAS_MD5,
    HAS_MEMBERS,
    HAS_MTIME,
    HAS_SIZE,
    IS_COMPRESSED,
    MAGIC,
    MAX_HEADER,
    PREAMBLE,
    SEEK_VERSION,
    VERSION,
    decode_members,
    parse_components,
)
from .urls import UrlMap, check_remote_ref, check_url_map, map_url, resolve_url, url_dir

__all__ = ["TableIndex"]

_MAX_STRING = 1 << 20  # a URL, etag, md5 or extra-keys JSON of one shard


class TableIndex:
    """A shard-table index (``*.widx``), opened on first use.

    Besides the :class:`~wids.index.model.IndexReader` protocol it offers the per-shard
    accessors a big dataset needs: :meth:`shard`, :attr:`nshards`, :meth:`sample_counts`,
    :meth:`cumulative_counts` (read-only arrays, shared through the page cache).

    Args:
        url: Path or URL of the index.
        storage_options: fsspec options for a remote index.
        base: Overrides the directory relative shard URLs resolve against.
        url_map: Prefix rewrites of shard URLs, for mirrors.
        allow_local_shards: Let an index read from a remote location name local files.
        origin: Where the index was read from when this file is a copy of it (an offline
            snapshot of a remote index): its shards' locations are judged against that.

    Raises:
        IndexFormatError: (on first use) The file is malformed or of an unknown version.
        ValueError: ``url_map`` is invalid.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | Store | None = None,
        *,
        base: str | None = None,
        url_map: Mapping[str, str] | UrlMap | None = None,
        allow_local_shards: bool = False,
        origin: str | None = None,
    ) -> None:
        self.url = url
        self.origin = origin
        self.store = Store.of(storage_options)
        self.base = base
        self.url_map = check_url_map(url_map)
        self.allow_local_shards = bool(allow_local_shards)
        self._root = base if base is not None else url_dir(url)
        self._state: dict[str, Any] | None = None
        self._shards: list[ShardInfo] | None = None

    def __repr__(self) -> str:
        return f"TableIndex({redact_url(self.url)!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_state"] = None  # an open map or source: reopened in the new process
        return state

    def _error(self, message: str) -> IndexFormatError:
        return IndexFormatError(message, shard=redact_url(self.url))

    # -- opening --------------------------------------------------------------------------------

    def _load(self) -> dict[str, Any]:
        if self._state is None:
            self._state = self._open()
        return self._state

    def _open(self) -> dict[str, Any]:
        src = self.store.source(self.url)
        size = src.info().size
        if size < PREAMBLE.size:
            raise self._error(f"{size} bytes: not a shard-table index (truncated?)")
        mapped: Any = None
        if src.local_path is not None:
            with open(src.local_path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            src.close()
            size = len(mapped)
        elif self.store.limits.table is not None and size > self.store.limits.table:
            from ..storage import too_large

            raise too_large(self.url, size, self.store.limits.table)

        def read(start: int, end: int) -> Any:
            if end > size:
                raise self._error(f"truncated: needs bytes up to {end}, the file has {size}")
            if mapped is not None:
                return memoryview(mapped)[start:end]
            return src.read_range(start, end)

        magic, hoff, hlen = PREAMBLE.unpack(bytes(read(0, PREAMBLE.size)))
        if magic != MAGIC:
            raise NotAnIndexError(
                "not a shard-table index (wrong magic bytes)", shard=redact_url(self.url)
            )
        if hlen > MAX_HEADER or hoff < PREAMBLE.size or hoff + hlen > size:
            raise self._error(f"header at {hoff} of {hlen} bytes is outside the {size}-byte file")
        try:
            header = json.loads(bytes(read(hoff, hoff + hlen)))
        except (ValueError, RecursionError) as e:
            raise self._error(f"header is not valid JSON: {type(e).__name__}") from None
        if not isinstance(header, dict):
            raise self._error("header must be a JSON object")
        if header.get("format") != FORMAT or header.get("version") not in (VERSION, SEEK_VERSION):
            raise self._error(
                f"format {header.get('format')!r} version {header.get('version')!r}; "
                f"expected {FORMAT!r} version {VERSION} or {SEEK_VERSION}"
            )
        n = header.get("nshards")
        if type(n) is not int or not 0 <= n <= size:
            raise self._error(f"nshards {n!r} is not a count of shards")
        try:
            comps = parse_components(header.get("components"), n)
        except IndexFormatError as e:
            raise self._error(e.message) from None
        name, report = header.get("name", ""), header.get("report", {})
        if not isinstance(name, str) or not isinstance(report, dict):
            raise self._error("'name' must be a string and 'report' an object")
        cols = self._columns(header.get("columns"), n, hoff, read)
        self._check_counts(cols["nsamples"], cols["cum"])
        return {
            "n": n,
            "name": name,
            "report": report,
            "components": comps,
            "cols": cols,
            "map": mapped,
            "src": None if mapped is not None else src,
            "end": hoff,
        }

    def _columns(self, table: Any, n: int, end: int, read: Any) -> dict[str, np.ndarray]:
        if not isinstance(table, dict):
            raise self._error("'columns' must be an object")
        cols = {}
        for name, (dtype, length, required) in COLUMNS.items():
            entry = table.get(name)
            if entry is None:
                if required:
                    raise self._error(f"column {name!r} is missing")
                continue
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and all(type(x) is int for x in entry[:2])
                and PREAMBLE.size <= entry[0]
                and 0 <= entry[1]
                and entry[0] + entry[1] <= end
            ):
                raise self._error(f"column {name!r}: bad place {entry!r:.100} in the file")
            if entry[2] != dtype:
                raise self._error(f"column {name!r} has dtype {entry[2]!r:.40}, expected {dtype}")
            itemsize = np.dtype(dtype).itemsize
            count = {"n": n, "n1": n + 1}.get(length, entry[1] // itemsize)
            if entry[1] != count * itemsize:
                raise self._error(
                    f"column {name!r} has {entry[1]} bytes, expected {count} values of {dtype}"
                )
            off = entry[0]
            cols[name] = np.frombuffer(read(off, off + entry[1]), dtype=dtype, count=count)
        for s in ("etag", "md5", "extra"):
            if (f"{s}_off" in cols) != (f"{s}_blob" in cols):
                raise self._error(f"columns {s}_off and {s}_blob must come together")
        if ("mem_off" in cols) != ("mem_len" in cols):
            raise self._error("columns mem_off and mem_len must come together")
        return cols

    def _check_counts(self, nsamples: np.ndarray, cum: np.ndarray) -> None:
        """The index lookup's columns, checked whole (vectorised; the rest per shard)."""
        if len(nsamples) and (int(nsamples.min()) < 0 or int(nsamples.max()) > MAX_NSAMPLES):
            raise self._error(f"nsamples outside [0, {MAX_NSAMPLES}]")
        if int(cum[0]) != 0 or not bool(np.all(cum[1:] >= cum[:-1])):
            raise self._error("cumulative counts must rise from 0")
        if not np.array_equal(cum[1:] - cum[:-1], nsamples):
            raise self._error("cumulative counts disagree with the shards' nsamples")

    # -- per shard ------------------------------------------------------------------------------

    def _string(self, col: str, shard: int) -> str | None:
        cols = self._load()["cols"]
        off, blob = cols.get(f"{col}_off"), cols.get(f"{col}_blob")
        if off is None or blob is None:
            return None
        a, b = int(off[shard]), int(off[shard + 1])
        if not 0 <= a <= b <= len(blob) or b - a > _MAX_STRING:
            raise self._error(f"shard {shard}: {col} at bytes {a}..{b} outside its column")
        try:
            return bytes(blob[a:b]).decode("utf-8", "surrogateescape")
        except UnicodeDecodeError:  # pragma: no cover - surrogateescape decodes anything
            raise self._error(f"shard {shard}: {col} is not UTF-8") from None

    def _flags(self, shard: int) -> int:
        state = self._load()
        if not 0 <= shard < state["n"]:
            raise IndexError(f"shard {shard} out of range for {state['n']} shards")
        return int(state["cols"]["flags"][shard])

    def shard(self, shard: int) -> ShardInfo:
        """One shard, its URL resolved (and mapped), every value checked.

        Raises:
            IndexFormatError: A value of this shard is malformed.
            UntrustedLocationError: A remote index names a local shard.
            IndexError: ``shard`` is out of range.
        """
        flags = self._flags(shard)
        cols = self._load()["cols"]
        stored = self._string("url", shard)
        if not stored or "\x00" in stored:
            raise self._error(f"shard {shard}: url empty or containing a NUL character")
        nsamples = int(cols["nsamples"][shard])
        size = int(cols["size"][shard]) if flags & HAS_SIZE and "size" in cols else None
        packed = bool(flags & IS_COMPRESSED)  # bounded by its tar's size (its member table)
        if size is not None and not (
            0 <= size < MAX_SHARD_SIZE and (packed or nsamples <= max_samples(size) or not nsamples)
        ):
            raise self._error(f"shard {shard}: size {size} cannot hold {nsamples} samples")
        mtime = float(cols["mtime"][shard]) if flags & HAS_MTIME and "mtime" in cols else None
        if mtime is not None and not math.isfinite(mtime):
            raise self._error(f"shard {shard}: mtime {mtime} is not finite")
        etag = self._string("etag", shard) if flags & HAS_ETAG else None
        md5 = self._string("md5", shard) if flags & HAS_MD5 else None
        url = resolve_url(stored, self._root)
        origin = self.url if self.origin is None else self.origin
        refused = check_remote_ref(url, origin, self.allow_local_shards)
        if refused:
            raise UntrustedLocationError(f"shard {shard}: url {refused}", shard=self.url)
        if self.url_map:
            mapped = map_url(url, self.url_map)
            if mapped != url:  # the old store's etag and mtime are not the new one's
                return ShardInfo(mapped, nsamples, size, None, None, md5)
        return ShardInfo(url, nsamples, size, etag, mtime, md5)

    @property
    def nshards(self) -> int:
        """Number of shards."""
        return int(self._load()["n"])

    def sample_counts(self) -> np.ndarray:
        """Samples per shard (read-only int64 array, shared)."""
        return self._load()["cols"]["nsamples"]  # type: ignore[no-any-return]

    def cumulative_counts(self) -> np.ndarray:
        """``N + 1`` cumulative sample counts from 0 (read-only int64 array, shared)."""
        return self._load()["cols"]["cum"]  # type: ignore[no-any-return]

    def total_bytes(self) -> int:
        """Bytes of the shards whose size is recorded (one column sum, no record per shard)."""
        cols = self._load()["cols"]
        if "size" not in cols:
            return 0
        sized = (cols["flags"] & HAS_SIZE) != 0
        return int(cols["size"][sized].sum(dtype=np.int64))

    def shards_without_members(self) -> int:
        """How many shards were recorded without a member table (from the flags column)."""
        return int(np.count_nonzero((self._load()["cols"]["flags"] & HAS_MEMBERS) == 0))

    def url_blob(self) -> np.ndarray:
        """The shards' URLs as stored (relative or absolute), concatenated (uint8, read-only)."""
        return self._load()["cols"]["url_blob"]  # type: ignore[no-any-return]

    def shards_ending(self, names: Collection[str]) -> np.ndarray | None:
        """The shards whose URL, resolved, may have one of ``names`` as its last part.

        From the URL column, without a record per shard (:mod:`wids.index.lastpart`).

        Args:
            names: Last parts of URLs (no ``/``).

        Returns:
            Sorted shard numbers, a superset of those whose URL has such a last part; ``None``
            when only every shard's record can tell (a ``url_map`` prefix not ending in ``/``).
        """
        if renames(self.url_map):
            return None
        cols = self._load()["cols"]
        return blob_candidates(cols["url_blob"], cols["url_off"], names)

    # -- the reader protocol --------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The dataset's name (``""`` when none)."""
        return str(self._load()["name"])

    @property
    def shards(self) -> list[ShardInfo]:
        """All shards (one object each: for small indexes and tools; see :meth:`shard`)."""
        if self._shards is None:
            self._shards = [self.shard(i) for i in range(self.nshards)]
        return self._shards

    @property
    def components(self) -> list[Component]:
        """The main shard list and the sub-datasets."""
        return list(self._load()["components"])

    @property
    def report(self) -> dict[str, Any]:
        """The builder's report stored in the index."""
        return dict(self._load()["report"])

    @property
    def has_members(self) -> bool:
        """Whether any shard has a member table."""
        return bool(np.any(self._load()["cols"]["flags"] & HAS_MEMBERS))

    def shard_extra(self, shard: int) -> dict[str, Any]:
        """Extra keys recorded for a shard."""
        if not self._flags(shard) & HAS_EXTRA:
            return {}
        text = self._string("extra", shard)
        try:
            extra = json.loads(text) if text else None
        except (ValueError, RecursionError):
            extra = None
        if not isinstance(extra, dict):
            raise self._error(f"shard {shard}: extra keys are not a JSON object")
        return extra

    def members(self, shard: int) -> ShardMembers | None:
        """The member table of one shard, read and checked now.

        Returns:
            The table, or ``None`` when the shard was recorded without offsets.

        Raises:
            IndexFormatError: The table is malformed or disagrees with the shard's record.
        """
        if not self._flags(shard) & HAS_MEMBERS:
            return None
        state = self._load()
        cols = state["cols"]
        if "mem_off" not in cols:
            raise self._error(f"shard {shard}: has members but the file has no member columns")
        a, n = int(cols["mem_off"][shard]), int(cols["mem_len"][shard])
        if not (PREAMBLE.size <= a and 0 <= n and a + n <= state["end"]):
            raise self._error(f"shard {shard}: member table at {a}+{n} outside the file")
        mapped = state["map"]
        buf = mapped[a : a + n] if mapped is not None else state["src"].read_range(a, a + n)
        info = self.shard(shard)
        try:
            table = decode_members(buf)
            if bool(self._flags(shard) & IS_COMPRESSED) != (table.seek is not None):
                raise IndexFormatError("its flags and its member table disagree on compression")
            table.check_extent(info.size)
        except IndexFormatError as e:
            raise self._error(f"shard {shard}: {e.message}") from None
        if len(table) != info.nsamples:
            raise self._error(
                f"shard {shard}: {len(table)} samples in the member table, "
                f"{info.nsamples} in the index"
            )
        return table

    def close(self) -> None:
        """Release the map (views handed out stay valid until they are dropped)."""
        state, self._state = self._state, None
        if state is not None and state["src"] is not None:
            state["src"].close()

    def __enter__(self) -> TableIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
