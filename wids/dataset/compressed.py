"""Reading compressed shards (``.tar.gz``, ``.tar.zst``): by seek point, or decompressed whole.

The member table of a compressed shard holds offsets in its decompressed tar and its
:class:`~wids.compress.SeekPoints` (``members.seek``). Two readers serve it:

- :class:`SeekReader` (``access="range"``/``"auto"``, with seek points): a span of the tar is
  decoded from the seek points before it: the compressed bytes of the segments it covers
  (the codec's ``compressed_range``), read with one ``os.pread`` or one checked range
  request of the shard's ``Source`` (pinned to the indexed version), decoded, and kept
  (``SEGMENTS`` bytes per reader); the tar header before the span is checked in the decoded
  bytes, as for a plain remote tar.
- :func:`decompressed_reader` (``access="shard"``, offline, or no seek points): the whole tar,
  decompressed once into the shard cache (an entry of its own, keyed by the shard's URL with
  ``#decompressed``, as large as the tar; the budget counts it), verified by the format's own
  checks (gzip CRC) and by the member headers before it is published; without a cache
  directory, into memory up to ``max_sample_bytes``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ..compress import SeekPoints, codec_for
from ..errors import (
    CompressedDataError,
    CorruptReadError,
    IndexFormatError,
    ShortReadError,
    TooLargeError,
)
from ..index import Fingerprint
from ..storage import Check, IOStats, Source, redact_url
from .readers import CachedReader, ShardReader, download_check
from .wholeshard import MemoryReader, memory_bound

if TYPE_CHECKING:
    from ..index import ShardInfo, ShardMembers
    from .catalog import Catalog

__all__ = [
    "DECOMPRESSED",
    "SEGMENTS",
    "SeekReader",
    "cache_versions",
    "compressed_reader",
    "decompressed_reader",
]

SEGMENTS = 32 << 20
"""Bytes of decoded tar a :class:`SeekReader` keeps (per open shard and process)."""
WHOLE_SEGMENT = 64 << 20
"""Segments up to this size are decoded whole on their second touch (larger: as far as read)."""
ESTIMATE_MARGIN, ESTIMATE_SLACK = 1.25, 16 << 10
"""A read needing a segment's tar up to some byte reads its compressed bytes up to the same
share of the segment times the margin, plus the slack (short of it: the rest, a second read)."""
DECOMPRESSED = "#decompressed"
"""Appended to a shard's URL to name its decompressed copy in the shard cache."""


class SeekReader(ShardReader):
    """Spans of a compressed shard's tar, decoded from the seek points before them.

    The tar between two seek points (a *segment*, about one spacing) is fetched and decoded
    whole, and the last ``cache_bytes`` of decoded segments are kept: a read of a cached
    stretch costs a slice, and reads in tar order (chunked samplers) decode each segment once.
    A span over several segments fetches the missing ones with one read.

    Args:
        source: The compressed shard (local or remote, pinned to the indexed version).
        points: Its seek points (seekable).
        cache_bytes: Decoded segments kept (least recently used dropped first).
        max_decode: Most bytes one read may decode or fetch (from the seek point before the
            span to its end): an index whose points are far apart (hostile, or a huge
            ``--seek-spacing``) would otherwise decode a whole shard into memory for one
            sample. ``None``: no bound.
    """

    verifies = True  # every span's tar header is checked once decoded

    def __init__(
        self,
        source: Source,
        points: SeekPoints,
        cache_bytes: int = SEGMENTS,
        max_decode: int | None = None,
    ) -> None:
        if not points.seekable:
            raise ValueError("a seek reader needs seek points")
        self.max_decode = max_decode
        self.shard_source = source
        self.points = points
        self.codec = codec_for(points.kind)
        self.cache_bytes = cache_bytes
        self._segments: OrderedDict[int, bytes] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def _bounds(self, m: int) -> tuple[int, int]:
        """Segment ``m``'s tar bytes."""
        pts = self.points
        u0 = int(pts.uncompressed[m])
        u1 = int(pts.uncompressed[m + 1]) if m + 1 < len(pts) else pts.uncompressed_size
        return u0, u1

    def read_span(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """The tar's bytes ``[start, end)``: decoded segments (cached, or one read), checked."""
        name = redact_url(self.shard_source.url)
        try:
            k, j = self.points.cover(start, end)
        except ValueError as e:
            what = f"cannot read tar bytes {start}-{end}: {e}"
            raise CorruptReadError(what, shard=name) from None
        segs = range(k, max(j, k + 1))
        got: dict[int, bytes] = {}
        with self._lock:
            for m in segs:
                seg = self._segments.get(m)
                # a segment is decoded up to where a read needed it: the last one may be short
                if seg is not None and self._bounds(m)[0] + len(seg) >= min(
                    end, self._bounds(m)[1]
                ):
                    self._segments.move_to_end(m)
                    got[m] = seg
        missing = [m for m in segs if m not in got]
        c_start = -1
        if missing:
            c_start = self._fetch(missing, got, stats, name, end)
        base = self._bounds(k)[0]
        if len(segs) == 1:
            out = got[k][start - base : end - base]
        else:
            out = b"".join(got[m] for m in segs)[start - base : end - base]
        if check is not None:
            problem = check(out)
            if problem is not None:
                where = f" (from compressed byte {c_start})" if c_start >= 0 else " (cached)"
                raise CompressedDataError(
                    f"decoded tar bytes {start}-{end}{where} are not what the index "
                    f"records: {problem}",
                    shard=name,
                    offset=c_start if c_start >= 0 else None,
                )
        return out

    def _fetch(
        self,
        missing: list[int],
        got: dict[int, bytes],
        stats: IOStats | None,
        name: str,
        end: int,
    ) -> int:
        """Read and decode the ``missing`` segments (one read), cache them; their first byte.

        The last one is decoded only up to ``end`` on its first touch (a random read decodes
        half a spacing less on average), whole on the next one that needs more.
        """
        codec, pts = self.codec, self.points
        ranges = {m: codec.compressed_range(pts, *self._bounds(m)) for m in missing}
        c0 = min(a for a, _ in ranges.values())
        c1 = max(b for _, b in ranges.values())
        # the last segment is needed up to ``end`` only: its compressed bytes up to about
        # there (the segment's ratio, with a margin) are read; short of it, the rest next
        a, b = ranges[missing[-1]]
        u0, u1 = self._bounds(missing[-1])
        self._check_bound(c0, c1, self._bounds(missing[0])[0], end, name)
        with self._lock:
            again = missing[-1] in self._segments  # touched before, decoded short of this read
        if again and u1 - u0 <= WHOLE_SEGMENT:  # reads in tar order: decode it whole this time
            end = u1
        elif end < u1 and b > a and getattr(codec, "decodes_prefix", False):
            guess = a + int((end - u0) / (u1 - u0) * (b - a) * ESTIMATE_MARGIN) + ESTIMATE_SLACK
            c1 = max(c0, min(c1, guess))
        for attempt in (0, 1):
            data = self.shard_source.read_range(c0, c1, stats)
            try:
                for m in missing:
                    a, b = ranges[m]
                    u0, u1 = self._bounds(m)
                    stop = min(u1, max(end, u0))
                    got[m] = codec.decode(pts, data[a - c0 : b - c0], u0, stop)
                break
            except CompressedDataError as e:
                full = max(b for _, b in ranges.values())
                if attempt or c1 >= full:
                    raise e.for_shard(name) from None
                c1 = full  # the guess fell short: the whole segments, once
            except IndexFormatError as e:  # a stored window that does not inflate
                raise IndexFormatError(e.message, shard=e.shard or name) from None
        for m in missing:
            self._check_join(m, got[m], ranges[m][0], name)
        with self._lock:
            for m in missing:
                old = self._segments.pop(m, None)
                if old is not None and len(old) >= len(got[m]):
                    got[m] = old
                self._held += len(got[m]) - (len(old) if old is not None else 0)
                self._segments[m] = got[m]
            while self._held > self.cache_bytes and len(self._segments) > 1:
                _, old = self._segments.popitem(last=False)
                self._held -= len(old)
        return c0

    def _check_bound(self, c0: int, c1: int, u0: int, end: int, name: str) -> None:
        """A read decodes from the point before it: refused past :attr:`max_decode` bytes."""
        if self.max_decode is None:
            return
        if end - u0 > self.max_decode or c1 - c0 > self.max_decode:
            raise TooLargeError(
                f"reading tar bytes up to {end:,} decodes {end - u0:,} bytes from the seek "
                f"point before them (compressed bytes {c0:,}-{c1:,}), over the "
                f"{self.max_decode:,} bytes a read may decode (2x max_sample_bytes + 64 MiB): "
                "the index's seek points are too far apart; rebuild it with a smaller "
                "--seek-spacing, or read the shard whole (access='shard')",
                shard=name,
            )

    def _check_join(self, m: int, seg: bytes, c_start: int, name: str) -> None:
        """A whole segment ends with the next point's window (gzip: the tar before it).

        A span over a seek point joins the bytes decoded from two points; an index whose
        point (offset, bits, window) does not match the data would join shifted or other
        bytes after a correct tar header: a wrong sample. The next point's window is the
        tar's bytes before it, so a segment decoded to its end must end with them.

        Raises:
            CompressedDataError: It does not.
        """
        pts = self.points
        u0, u1 = self._bounds(m)
        if m + 1 >= len(pts) or len(seg) != u1 - u0:
            return
        try:
            window = pts.window(m + 1)
        except IndexFormatError as e:
            raise CompressedDataError(str(e), shard=name, offset=c_start) from None
        n = min(len(window), len(seg))
        if n and seg[len(seg) - n :] != window[len(window) - n :]:
            raise CompressedDataError(
                f"the tar decoded from seek point {m} (compressed byte {c_start}) does not "
                f"end with seek point {m + 1}'s window: the index's seek points do not match "
                "the shard",
                shard=name,
                offset=c_start,
            )

    def close(self) -> None:
        """Drop the decoded segments; close the shard's descriptor, if one was opened."""
        with self._lock:
            self._segments.clear()
            self._held = 0
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
    return SeekReader(source, points, max_decode=2 * memory_bound(catalog) + WHOLE_SEGMENT)


def cache_versions(url: str, fingerprint: Fingerprint) -> list[tuple[str, Fingerprint]]:
    """The cache entries a shard may have and the version each must be (``cache ls --index``).

    The shard's own copy, and a compressed shard's decompressed one (its size is the tar's,
    which the shard's record does not hold: its etag and date are compared).
    """
    whole = Fingerprint(None, fingerprint.etag, fingerprint.mtime, None)
    return [(url, fingerprint), (url + DECOMPRESSED, whole)]


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
    # pieces joined once: a stream may return a few KiB per read (zstd: one input step's
    # output), and growing one bytes object by each was quadratic (64 MB of tar: 2 minutes)
    parts: list[bytes] = []
    got = 0
    try:
        while got <= size:
            more = stream.read(min(size + 1 - got, 1 << 24))
            if not more:
                break
            parts.append(more)
            got += len(more)
    except CompressedDataError as e:
        raise e.for_shard(name) from None
    _check_size(got, size, name)
    return b"".join(parts)


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
