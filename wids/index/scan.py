"""Scanning one shard: its headers, grouped into samples, as a member table.

- Local shards: headers only, member data is never read; archives of plain regular members
  with distinct keys in bulk (``tar.scan_local_headers``, ``samples.group_headers``), any
  other with the exact walker (``tar.scan_local_rows``, ``samples.group_columns``).
- Remote shards: the first :data:`PROBE` bytes (one request) show how large the members are
  (``tar.header_stride``). Large members (at least :data:`HOP_STRIDE` bytes of archive per
  header): hop from header to header with ranged reads (``tar.iter_members_hopping``), pinned
  to the stat's etag, reading a small fraction of the shard. Small members: one sequential
  streaming pass (``Source.open_stream``), never a request per member and nothing written to
  local disk. The member table is the same either way.
- A server that ignores ``Range`` (``python -m http.server``) answers the probe with the whole
  file (:class:`~wids.errors.RangeNotSupportedError`, refused from the announced length): the
  shard is then streamed once from its start, which such a server serves.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import numpy as np

from ..compress import sniff
from ..errors import CompressedDataError, RangeNotSupportedError
from ..samples import (
    DuplicatePolicy,
    GroupedColumns,
    SampleColumns,
    group_columns,
    group_headers,
    group_members,
)
from ..storage import FileStat, IOStats, Source, redact_url
from ..tar import (
    TarMember,
    header_stride,
    iter_members_hopping,
    iter_members_stream,
    scan_local_headers,
    scan_local_rows,
)
from .members import ShardMembers
from .scancompressed import DEFAULT_SPACING, scan_compressed

__all__ = ["HOP_STRIDE", "PROBE", "scan_shard"]

PROBE = 8192
"""Bytes read from the start of a remote shard to choose between hopping and streaming."""
HOP_STRIDE = 256 << 10
"""Archive bytes per header from which hopping pays: a request (a millisecond or more) costs
about what streaming this many bytes does, and each hop reads only ``tar.HOP_BLOCK``."""


def scan_shard(
    source: Source,
    *,
    duplicates: DuplicatePolicy = "error",
    stats: IOStats | None = None,
    hop: bool | None = None,
    seek_spacing: int = DEFAULT_SPACING,
) -> tuple[FileStat, ShardMembers, int]:
    """Scan one shard's headers and group its members into samples.

    Args:
        source: The shard.
        duplicates: Policy for repeated keys or fields (see ``samples.group_members``).
        stats: Counters for remote bytes and requests.
        hop: Remote shards: ``None`` chooses from the first headers, ``True`` hops from header
            to header, ``False`` streams the whole shard.
        seek_spacing: Compressed shards (recognised by their first bytes): uncompressed bytes
            between gzip seek points (:mod:`wids.index.scancompressed`).

    Returns:
        ``(stat, members, skipped)``: the shard's size/etag/mtime, its member table, and the
        number of regular members that belong to no sample.

    Raises:
        TarFormatError: The shard is not a valid tar.
        SampleLayoutError: Duplicates, with ``duplicates="error"``.
        ShardNotFoundError: The shard does not exist.
    """
    name = redact_url(source.url)
    if source.local_path is not None:
        kind = _local_compression(source.local_path, name)
        if kind is not None:
            return scan_compressed(
                source, kind, shard=name, duplicates=duplicates, spacing=seek_spacing
            )
        stat = source.info(stats)
        # Plain archives in bulk (numpy); any other, or repeated keys: the exact walker.
        headers = scan_local_headers(source.local_path, shard=name)
        fast = (
            None if headers is None else group_headers(headers, duplicates=duplicates, shard=name)
        )
        if fast is not None:
            return stat, _columns(fast), fast.skipped
        rows = scan_local_rows(source.local_path, shard=name)
        cols = group_columns(rows, duplicates=duplicates, shard=name)
        return stat, _table(cols), len(cols.skipped)
    else:
        got = _scan_remote(source, stats, name, hop)
        if isinstance(got, str):  # compressed: scanned from a local copy
            return scan_compressed(
                source, got, shard=name, duplicates=duplicates, stats=stats, spacing=seek_spacing
            )
        stat, members = got
        grouped = group_members(members, duplicates=duplicates, shard=name)
    return stat, ShardMembers.from_samples(grouped), len(grouped.skipped)


def _table(cols: GroupedColumns) -> ShardMembers:
    keys = cols.keys
    blob = "".join(keys)
    key_offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    if blob.isascii():
        np.cumsum(np.fromiter(map(len, keys), np.int64, len(keys)), out=key_offsets[1:])
        key_blob = blob.encode("ascii")
    else:
        encoded = [k.encode("utf-8", "surrogateescape") for k in keys]
        np.cumsum([len(k) for k in encoded], out=key_offsets[1:])
        key_blob = b"".join(encoded)
    return ShardMembers(
        fields=cols.fields,
        key_blob=key_blob,
        key_offsets=key_offsets,
        sample_start=np.array(cols.sample_start, dtype=np.int64),
        member_field=np.array(cols.member_field, dtype=np.int64),
        member_offset=np.array(cols.member_offset, dtype=np.int64),
        member_size=np.array(cols.member_size, dtype=np.int64),
    )


def _columns(cols: SampleColumns) -> ShardMembers:
    return ShardMembers(
        fields=cols.fields,
        key_blob=cols.key_blob,
        key_offsets=cols.key_offsets,
        sample_start=cols.sample_start,
        member_field=cols.member_field,
        member_offset=cols.member_offset,
        member_size=cols.member_size,
    )


def _local_compression(path: str, name: str) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        return None  # the scan below raises ShardNotFoundError
    except OSError:
        return None
    try:
        return sniff(head)
    except CompressedDataError as e:
        raise e.for_shard(name) from None


def _sniffed(head: bytes, name: str) -> str | None:
    try:
        return sniff(head)
    except CompressedDataError as e:
        raise e.for_shard(name) from None


def _scan_remote(
    source: Source, stats: IOStats | None, name: str, hop: bool | None
) -> tuple[FileStat, list[TarMember]] | str:
    """The remote shard's stat and members, or its compression kind (scanned elsewhere)."""
    if hop is not False:
        stat = source.info(stats)
        # Every read pinned to what was stat'ed: a shard replaced meanwhile fails, never mixes.
        pinned = source.store.source(source.url, size=stat.size, etag=stat.etag)
        try:
            try:
                head = pinned.read_range(0, min(stat.size, PROBE), stats)
            except RangeNotSupportedError:
                if hop:
                    raise  # asked to hop, which needs ranges
                head, hop = b"", False  # no ranges: one sequential stream (below)
            kind = _sniffed(head, name) if head else None
            if kind is not None:
                return kind
            if hop is None:
                stride = header_stride(head, stat.size, shard=name)
                hop = stride is None or stride >= HOP_STRIDE  # None: all headers are in head
            if hop:
                fetch = lambda start, end: pinned.read_range(start, end, stats)  # noqa: E731
                members = list(iter_members_hopping(fetch, stat.size, shard=name, head=head))
                return stat, members
        finally:
            pinned.close()
    with source.open_stream(stats) as stream:
        stat = stream.stat  # type: ignore[attr-defined]  # stat'ed once, by the stream
        head = stream.read(8)
        kind = _sniffed(head, name)
        if kind is not None:
            return kind
        prefixed: Any = _Prefixed(head, stream)
        return stat, list(iter_members_stream(prefixed, shard=name))


class _Prefixed:
    """A stream whose first bytes were read already (to recognise compression)."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head, self._stream = head, stream

    def read(self, n: int = -1) -> bytes:
        head = self._head
        if not head:
            return self._stream.read(n)
        self._head = b""
        if n is None or n < 0:
            return head + self._stream.read()
        if n <= len(head):
            self._head = head[n:]
            return head[:n]
        return head + self._stream.read(n - len(head))
