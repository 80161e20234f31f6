"""Scanning one shard: its headers, grouped into samples, as a member table.

- Local shards: headers only (``tar.scan_local_rows``), member data is never read.
- Remote shards: one sequential streaming pass (``Source.open_stream``), never a request per
  member and nothing written to local disk.
"""

from __future__ import annotations

from ..samples import DuplicatePolicy, group_members, group_regular
from ..storage import FileStat, IOStats, Source, redact_url
from ..tar import iter_members_stream, scan_local_rows
from .members import ShardMembers

__all__ = ["scan_shard"]

_REGULAR_TYPES = frozenset(("0", "7", "\0"))


def scan_shard(
    source: Source, *, duplicates: DuplicatePolicy = "error", stats: IOStats | None = None
) -> tuple[FileStat, ShardMembers, int]:
    """Scan one shard's headers and group its members into samples.

    Args:
        source: The shard.
        duplicates: Policy for repeated keys or fields (see ``samples.group_members``).
        stats: Counters for remote bytes and requests.

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
        stat = source.info(stats)
        rows = scan_local_rows(source.local_path, shard=name)
        regular = [(r[0], r[1], r[2]) for r in rows if r[3] in _REGULAR_TYPES]
        grouped = group_regular(regular, duplicates=duplicates, shard=name)
    else:
        with source.open_stream(stats) as stream:
            stat = stream.stat  # type: ignore[attr-defined]  # stat'ed once, by the stream
            members = list(iter_members_stream(stream, shard=name))
        grouped = group_members(members, duplicates=duplicates, shard=name)
    return stat, ShardMembers.from_samples(grouped), len(grouped.skipped)
