"""Reading compressed shards (``.tar.gz``, ``.tar.zst``): by seek point, or decompressed whole.

The member table of a compressed shard holds offsets in its decompressed tar and its
:class:`~wids.compress.SeekPoints` (``members.seek``). Two readers serve it:

- :class:`SeekReader` (``access="range"``/``"auto"``, with seek points): a span of the tar is
  the compressed bytes from the seek point before it (the codec's ``compressed_range``), read
  with one ``os.pread`` or one checked range request of the shard's ``Source`` (pinned to the
  indexed version), then decoded; the tar header before the span is checked in the decoded
  bytes, as for a plain remote tar.
- :func:`decompressed_reader` (``access="shard"``, offline, or no seek points): the whole tar,
  decompressed once into the shard cache (an entry of its own, keyed by the shard's URL with
  ``#decompressed``, as large as the tar; the budget counts it), verified by the format's own
  checks (gzip CRC) and by the member headers before it is published; without a cache
  directory, into memory up to ``max_sample_bytes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..compress import SeekPoints, codec_for
from ..errors import CompressedDataError, CorruptReadError, ShortReadError, TooLargeError
from ..index import Fingerprint
from ..storage import Check, IOStats, Source, redact_url
from .readers import CachedReader, ShardReader, download_check
from .wholeshard import MemoryReader, memory_bound

if TYPE_CHECKING:
    from ..index import ShardInfo, ShardMembers
    from .catalog import Catalog

__all__ = ["DECOMPRESSED", "SeekReader", "compressed_reader", "decompressed_reader"]

DECOMPRESSED = "#decompressed"
"""Appended to a shard's URL to name its decompressed copy in the shard cache."""


class SeekReader(ShardReader):
    """Spans of a compressed shard's tar, each decoded from the seek point before it.

    Args:
        source: The compressed shard (local or remote, pinned to the indexed version).
        points: Its seek points (seekable).
    """

    verifies = True  # every span's tar header is checked once decoded

    def __init__(self, source: Source, points: SeekPoints) -> None:
        if not points.seekable:
            raise ValueError("a seek reader needs seek points")
        self.shard_source = source
        self.points = points
        self.codec = codec_for(points.kind)

    def read_span(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """The tar's bytes ``[start, end)``: one read of compressed bytes, decoded, checked."""
        name = redact_url(self.shard_source.url)
        try:
            c_start, c_stop = self.codec.compressed_range(self.points, start, end)
        except ValueError as e:
            what = f"cannot read tar bytes {start}-{end}: {e}"
            raise CorruptReadError(what, shard=name) from None
        data = self.shard_source.read_range(c_start, c_stop, stats)
        try:
            out = self.codec.decode(self.points, data, start, end)
        except CompressedDataError as e:
            raise e.for_shard(name) from None
        if check is not None:
            problem = check(out)
            if problem is not None:
                raise CompressedDataError(
                    f"decoded tar bytes {start}-{end} (from compressed bytes {c_start}-"
                    f"{c_stop}) are not what the index records: {problem}",
                    shard=name,
                    offset=c_start,
                )
        return out

    def close(self) -> None:
        """Close the shard's descriptor, if one was opened."""
        self.shard_source.close()

    def __repr__(self) -> str:
        return f"SeekReader({self.shard_source!r}, {self.points!r})"


def compressed_reader(
    catalog: Catalog,
    info: ShardInfo,
    members: ShardMembers,
    source: Source,
    check: bool,
    access: str,
) -> ShardReader:
    """A compressed shard's reader: by seek point, or whole (see the module's doc).

    Args:
        catalog: The dataset's catalog (cache settings, store, first-touch checks).
        info: The shard's record in the index.
        members: Its member table, with ``seek``.
        source: The shard, pinned to the indexed version.
        check: Check the shard's fingerprint first (first touch in this process).
        access: The dataset's access mode.
    """
    points, local = members.seek, catalog.local
    whole = access == "shard" or local.offline
    if points is None or not points.seekable or (whole and local.cache_dir is not None):
        if check:
            catalog.check_fingerprint(info, members.data_end)
        return decompressed_reader(catalog, source, info, members)
    local.check_online(info.url)
    if check:
        remote = None if source.is_local else source
        catalog.check_fingerprint(info, members.data_end, remote)
    return SeekReader(source, points)


def decompressed_reader(
    catalog: Catalog, source: Source, info: ShardInfo, members: ShardMembers
) -> ShardReader:
    """The whole decompressed tar: a cache entry, else (no cache directory) in memory.

    Raises:
        CompressedDataError: The shard does not decompress (names shard and byte).
        TooLargeError: No cache directory, and the tar is over ``max_sample_bytes``.
        IndexMismatchError: The shard is not the one the index records.
    """
    points = members.seek
    if points is None:
        raise ValueError("not a compressed shard")
    local, stats = catalog.local, catalog.store.stats
    name = redact_url(info.url)
    if local.cache_dir is not None:
        expected = Fingerprint(points.uncompressed_size, info.etag, info.mtime, None)
        verify = download_check(members, info.url)

        def download(dest: str) -> Any:
            return _decompress_to(source, points, dest, stats, name, verify)

        shard = local.shard_cache().open_with(info.url + DECOMPRESSED, download, expected=expected)
        return CachedReader(shard)
    local.check_online(info.url)
    bound = memory_bound(catalog)
    if points.uncompressed_size > bound:
        raise TooLargeError(
            f"a compressed shard without seek points decompresses to "
            f"{points.uncompressed_size:,} bytes, over the {bound:,} bytes wids holds in "
            "memory (max_sample_bytes); give the dataset a cache_dir to decompress it there",
            shard=name,
        )
    with _open(source, stats) as raw:
        stream = codec_for(points.kind).stream(raw)
        data = _read_bounded(stream, points.uncompressed_size, name)
    return MemoryReader(data)


def _open(source: Source, stats: IOStats | None) -> Any:
    if source.local_path is not None:
        return open(source.local_path, "rb")
    return source.open_stream(stats)


def _read_bounded(stream: Any, size: int, name: str) -> bytes:
    try:
        data: bytes = stream.read(size + 1)
        while len(data) <= size:
            more = stream.read(size + 1 - len(data))
            if not more:
                break
            data += more
    except CompressedDataError as e:
        raise e.for_shard(name) from None
    _check_size(len(data), size, name)
    return data


def _check_size(got: int, size: int, name: str) -> None:
    if got != size:
        raise ShortReadError(
            f"decompressed to {'more than ' if got > size else ''}{got:,} bytes; the index "
            f"records a {size:,}-byte tar",
            shard=name,
        )


def _decompress_to(
    source: Source,
    points: SeekPoints,
    dest: str,
    stats: IOStats | None,
    name: str,
    verify: Any,
) -> Any:
    """Write the decompressed tar to ``dest`` (bounded by its recorded size), then verify it."""
    stat = source.info(stats) if source.local_path is not None else None
    with _open(source, stats) as raw, open(dest, "wb") as out:
        stat = stat if stat is not None else getattr(raw, "stat", None)
        stream = codec_for(points.kind).stream(raw)
        limit = points.uncompressed_size
        got = 0
        try:
            while got <= limit:
                part = stream.read(min(1 << 20, limit + 1 - got))
                if not part:
                    break
                out.write(part)
                got += len(part)
        except CompressedDataError as e:
            raise e.for_shard(name) from None
    _check_size(got, limit, name)
    verify(dest)
    return stat
