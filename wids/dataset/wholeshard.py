"""Whole-shard reads for servers that ignore ``Range`` (``python -m http.server``).

Such a server answers a range request with the whole file; the storage layer refuses that
answer with :class:`~wids.errors.RangeNotSupportedError`. The reader pool then remembers the
server (its origin) in the dataset's ``RangeSupport`` (:mod:`.rangesupport`), warns once
about it, and reopens the shard with :func:`whole_reader`: through the shard cache when the
dataset has a ``cache_dir`` (as ``access="shard"`` does), else one streaming GET into memory
(:class:`MemoryReader`), for shards up to :func:`memory_bound` bytes; a larger shard is
refused with the same error, which says to set ``cache_dir``.

A warning (:class:`~wids.storage.RangeFallbackWarning`, through :mod:`warnings`) rather than a
log record: it reaches a user who configured no logging, shows once per server by default, and
can be filtered or turned into an error with the ``warnings`` machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import RangeNotSupportedError, ShortReadError
from ..storage import Check, IOStats, Source, redact_url
from .readers import CachedReader, ShardReader, download_check

if TYPE_CHECKING:
    from ..index import ShardInfo, ShardMembers
    from .catalog import Catalog
    from .localcache import LocalCache

__all__ = [
    "MEMORY_BOUND",
    "MemoryReader",
    "memory_bound",
    "probe_range",
    "whole_reader",
]

MEMORY_BOUND = 1 << 30
"""Largest shard read whole into memory when the dataset has no ``max_sample_bytes``."""


def probe_range(url: str, reader: ShardReader, local: LocalCache) -> bool:
    """Whether the server of ``url`` ignores ``Range`` (``local.ranges``, a ``RangeSupport``)."""
    return local.ranges.probe(url, reader, local.cache_dir)


def memory_bound(catalog: Catalog) -> int:
    """Largest shard read whole into memory: ``max_sample_bytes``, or :data:`MEMORY_BOUND`."""
    bound = catalog.max_sample_bytes
    return MEMORY_BOUND if bound is None else bound


class MemoryReader(ShardReader):
    """A whole shard held in memory, read with one streaming GET.

    Args:
        data: The shard's bytes.
    """

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read_span(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """Return exactly the bytes ``[start, end)`` of the shard."""
        if not 0 <= start <= end <= len(self.data):
            raise ValueError(f"bytes {start}-{end} are outside a shard of {len(self.data)}")
        return self.data[start:end]

    def close(self) -> None:
        """Drop the bytes."""
        self.data = b""

    def __repr__(self) -> str:
        return f"MemoryReader({len(self.data)} bytes)"


def whole_reader(
    catalog: Catalog,
    source: Source,
    info: ShardInfo,
    table: tuple[ShardMembers, int],
    check: bool,
) -> ShardReader:
    """A reader of a whole shard whose server ignores ``Range``: cached, else in memory.

    Args:
        catalog: The dataset's catalog (its cache settings, store and checks).
        source: The shard.
        info: Its record in the index (the fingerprint a copy must have).
        table: Its member table and the end of its last member's data.
        check: Check the shard's fingerprint first (first touch in this process).

    Raises:
        RangeNotSupportedError: No ``cache_dir`` and the shard is larger than
            :func:`memory_bound`.
        IndexMismatchError: The shard is not the one the index records.
    """
    local, stats = catalog.local, catalog.store.stats
    members, data_end = table
    if check:
        catalog.check_fingerprint(info, data_end)
    if local.cache_dir is not None:
        verify = download_check(members, info.url)
        shard = local.shard_cache().open(
            source, expected=info.fingerprint, stats=stats, verify=verify
        )
        return CachedReader(shard)
    local.check_online(info.url)
    bound = memory_bound(catalog)
    name = redact_url(info.url)
    if (info.size or 0) > bound:
        raise _over(info.size, bound, name)
    parts: list[bytes] = []
    got = 0
    with source.open_stream(stats) as stream:
        while got <= bound:
            part = stream.read(min(1 << 20, bound + 1 - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
    data = b"".join(parts)
    if len(data) > bound:
        raise _over(len(data), bound, name)
    if info.size is not None and len(data) != info.size:
        raise ShortReadError(
            f"read the shard whole and got {len(data):,} bytes; the index records {info.size:,}",
            shard=name,
        )
    return MemoryReader(data)


def _over(size: int | None, bound: int, name: str) -> RangeNotSupportedError:
    return RangeNotSupportedError(
        f"the server ignores Range and the shard is {size or 0:,} bytes or more, over the "
        f"{bound:,} bytes wids reads whole into memory (max_sample_bytes); give the dataset "
        "a cache_dir to read it through the shard cache",
        shard=name,
    )
