"""Compressed shards: seek points and codecs (pure; the caller does the I/O).

- :mod:`.points` — :class:`SeekPoints`, where decoding of a shard may start, and their bytes
  as every index backend stores them.
- :mod:`.codec` — the :class:`Codec` protocol, :func:`sniff` (magic bytes), :func:`codec_for`.
- :mod:`.gzipcodec` — ``.tar.gz``; ``.zstdcodec`` — seekable ``.tar.zst``.
"""

from __future__ import annotations

from .codec import Codec, Indexing, codec_for, sniff, tar_reader
from .points import KINDS, SeekPoints

__all__ = ["KINDS", "Codec", "Indexing", "SeekPoints", "codec_for", "sniff", "tar_reader"]
