"""One protocol for every compressed-shard format, recognition by magic bytes, the registry.

A :class:`Codec` is pure: it maps an uncompressed range to the compressed bytes to fetch
(:meth:`Codec.compressed_range`) and turns those bytes into the range (:meth:`Codec.decode`);
the caller does the I/O (``os.pread`` or a checked range request) and checks the tar header
in what it gets, as for a plain tar. :meth:`Codec.stream` decompresses a whole shard
sequentially (the scan, and the whole-shard copy in the cache), verifying what the format
can (gzip's CRC and length).

Shards are recognised by their first bytes (:func:`sniff`), never by their name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import IO, Protocol

from ..errors import CompressedDataError
from .points import SeekPoints

__all__ = ["Codec", "Indexing", "codec_for", "sniff", "tar_reader"]

_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
_UNSUPPORTED = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x04\x22\x4d\x18": "lz4",
}
_MODULES = {"gzip": "gzipcodec", "zstd": "zstdcodec"}


class Codec(Protocol):
    """How to read one compression kind (``codec_for(kind)``).

    Attributes:
        kind: ``"gzip"`` or ``"zstd"`` (:data:`wids.compress.points.KINDS`).

    A codec may also set ``decodes_prefix = True``: its ``decode`` accepts a prefix of the
    compressed range and raises :class:`~wids.errors.CompressedDataError` when it is too
    short; readers then read up to an estimate of where a span ends (gzip).
    """

    kind: str

    def compressed_range(self, points: SeekPoints, start: int, stop: int) -> tuple[int, int]:
        """The file's bytes ``[c_start, c_stop)`` from which ``decode`` yields ``[start, stop)``.

        Raises:
            ValueError: The points are not seekable, or the range is outside the tar.
        """
        ...

    def decode(self, points: SeekPoints, data: bytes, start: int, stop: int) -> bytes:
        """The tar's bytes ``[start, stop)`` from ``data``, the file's ``compressed_range``.

        Raises:
            CompressedDataError: ``data`` does not decode (without ``.shard``: the caller
                adds it), with ``offset`` the compressed byte where it failed.
        """
        ...

    def indexing(self, fileobj: IO[bytes], spacing: int) -> Indexing:
        """Start indexing a whole shard: its decompressed stream, then its seek points.

        Args:
            fileobj: The compressed shard, a seekable local file positioned at 0.
            spacing: About how many uncompressed bytes apart points should be (a format
                whose points are fixed by the file, zstd frames, ignores it).

        Raises:
            ImportError: The library this kind needs to index is missing (names the extra).
        """
        ...

    def stream(self, fileobj: IO[bytes]) -> IO[bytes]:
        """The whole decompressed tar, read sequentially from ``fileobj`` (a file or stream).

        Reads raise :class:`~wids.errors.CompressedDataError` on bad or truncated data.
        """
        ...


class Indexing(Protocol):
    """One pass over a compressed shard: read ``stream`` to its end, then ask ``points()``."""

    stream: IO[bytes]

    def points(self) -> SeekPoints:
        """The shard's seek points (after ``stream`` was read to its end)."""
        ...

    def close(self) -> None:
        """Release what the pass holds (not ``fileobj``)."""
        ...


def sniff(head: bytes) -> str | None:
    """The compression of a shard from its first bytes: ``"gzip"``, ``"zstd"``, or ``None``.

    Raises:
        CompressedDataError: A compression wids cannot read (bzip2, xz, lz4).
    """
    if head.startswith(_GZIP):
        return "gzip"
    if head.startswith(_ZSTD):
        return "zstd"
    for magic, name in _UNSUPPORTED.items():
        if head.startswith(magic):
            raise CompressedDataError(
                f"a {name}-compressed shard; wids reads .tar, .tar.gz and .tar.zst shards "
                "(decompress it, or recompress it with gzip or zstd)",
                offset=0,
            )
    return None


def tar_reader(
    points: SeekPoints, fetch: Callable[[int, int], bytes]
) -> Callable[[int, int], bytes] | None:
    """``read(start, stop)`` of the decompressed tar over ``fetch`` of the compressed file.

    ``None`` when the shard has no seek points (it can only be decompressed whole).
    """
    if not points.seekable:
        return None
    codec = codec_for(points.kind)

    def read(start: int, stop: int) -> bytes:
        c_start, c_stop = codec.compressed_range(points, start, stop)
        return codec.decode(points, fetch(c_start, c_stop), start, stop)

    return read


def codec_for(kind: str) -> Codec:
    """The codec of ``kind`` (its module imported on first use).

    Raises:
        ValueError: An unknown kind.
        ImportError: The library the kind needs is missing (names the extra to install).
    """
    name = _MODULES.get(kind)
    if name is None:
        raise ValueError(f"unknown compression {kind!r}")
    module = importlib.import_module(f"{__package__}.{name}")
    codec: Codec = module.CODEC
    return codec
