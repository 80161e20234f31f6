"""Scanning a compressed shard (``.tar.gz``, ``.tar.zst``): its member table and seek points.

One sequential pass decompresses the shard (:meth:`wids.compress.Codec.indexing`) and walks
the tar's headers in it (``tar.iter_members_stream``): the member table has the decompressed
tar's offsets, the seek points say how to reach them. The pass needs a seekable local file: a
remote shard is first downloaded to a private temporary directory (removed afterwards).
Compression is recognised by the first bytes (:func:`wids.compress.sniff`), never by name.
"""

from __future__ import annotations

import os
import tempfile

from ..compress import codec_for
from ..errors import CompressedDataError, TruncatedTarError
from ..samples import DuplicatePolicy, group_members
from ..storage import FileStat, IOStats, Source
from ..tar import iter_members_stream
from .members import ShardMembers

__all__ = ["DEFAULT_SPACING", "scan_compressed", "scan_compressed_file"]

DEFAULT_SPACING = 1 << 20
"""Uncompressed bytes between gzip seek points (see :mod:`wids.compress.gzipcodec`)."""


def scan_compressed_file(
    path: str,
    kind: str,
    *,
    shard: str,
    duplicates: DuplicatePolicy = "error",
    spacing: int = DEFAULT_SPACING,
) -> tuple[ShardMembers, int]:
    """Scan a local compressed shard: ``(members with seek points, skipped members)``.

    Raises:
        CompressedDataError: The compressed data is bad or truncated (names shard and byte).
        TarFormatError: The decompressed bytes are not a valid tar.
        ImportError: The codec's library is missing (names the ``compressed`` extra).
    """
    codec = codec_for(kind)
    try:
        with open(path, "rb") as f:
            indexing = codec.indexing(f, spacing)
            try:
                try:
                    found = list(iter_members_stream(indexing.stream, shard=shard))  # type: ignore[arg-type]
                except TruncatedTarError:
                    indexing.points()  # a truncated compressed file says so (offsets in it)
                    raise  # else the tar inside was cut before it was compressed
                points = indexing.points()
            finally:
                indexing.close()
    except CompressedDataError as e:
        raise e.for_shard(shard) from None
    grouped = group_members(found, duplicates=duplicates, shard=shard)
    return ShardMembers.from_samples(grouped).with_seek(points), len(grouped.skipped)


def scan_compressed(
    source: Source,
    kind: str,
    *,
    shard: str,
    duplicates: DuplicatePolicy = "error",
    stats: IOStats | None = None,
    spacing: int = DEFAULT_SPACING,
) -> tuple[FileStat, ShardMembers, int]:
    """Scan a compressed shard anywhere (a remote one through a temporary local copy)."""
    if source.local_path is not None:
        stat = source.info(stats)
        members, skipped = scan_compressed_file(
            source.local_path, kind, shard=shard, duplicates=duplicates, spacing=spacing
        )
        return stat, members, skipped
    with tempfile.TemporaryDirectory(prefix="wids-scan-") as tmp:
        dest = os.path.join(tmp, "shard")
        stat = source.download(dest, stats=stats)
        members, skipped = scan_compressed_file(
            dest, kind, shard=shard, duplicates=duplicates, spacing=spacing
        )
    return stat, members, skipped
