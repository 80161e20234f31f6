"""Seek points as a value and as stored bytes (hostile input), and recognition by magic bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from wids.compress import SeekPoints, codec_for, sniff
from wids.compress.points import MAGIC
from wids.errors import CompressedDataError, IndexFormatError, TarFormatError


def _points() -> SeekPoints:
    import zlib

    windows = [b"", zlib.compress(b"a" * 32768), zlib.compress(b"xyz" * 100)]
    return SeekPoints("gzip", 5000, 90000, [10, 1500, 3000], [0, 30000, 60000], [0, 3, 7], windows)


def test_points_round_trip_through_their_bytes():
    p = _points()
    q = SeekPoints.from_bytes(p.to_bytes())
    assert q == p and len(q) == 3 and q.seekable
    assert q.window(0) == b"" and q.window(1) == b"a" * 32768 and q.window(2) == b"xyz" * 100
    assert q.cover(0, 10) == (0, 1) and q.cover(30000, 30001) == (1, 2)
    assert q.cover(59999, 90000) == (1, 3)
    plain = SeekPoints("zstd", 100, 4096)  # a single frame: no points, read whole
    assert not plain.seekable and SeekPoints.from_bytes(plain.to_bytes()) == plain
    with pytest.raises(ValueError, match="no seek points"):
        plain.cover(0, 1)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda b: b[:20], "too short"),
        (lambda b: b"X" + b[1:], "bad magic"),
        (lambda b: b[:8] + struct.pack("<H", 2) + b[10:], "version 2"),
        (lambda b: b[:10] + b"\x09" + b[11:], "unknown compression"),
        (lambda b: b[:-1], "window offsets"),
        (lambda b: b + b"more", "window offsets"),
        (lambda b: b[:12] + struct.pack("<I", 1 << 30) + b[16:], "limit"),
        (lambda b: b[:12] + struct.pack("<I", 1000) + b[16:], "shorter than"),
    ],
)
def test_stored_points_are_validated(damage, match):
    data = _points().to_bytes()
    assert data.startswith(MAGIC)
    with pytest.raises(IndexFormatError, match=match):
        SeekPoints.from_bytes(damage(data))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"uncompressed": [0, 30000, 30000]}, "rise"),
        ({"compressed": [10, 9, 3000]}, "rise"),
        ({"compressed": [10, 1500, 6000]}, "outside"),
        ({"uncompressed": [0, 30000, 90000]}, "outside"),
        ({"bits": [0, 3, 8]}, "0-7"),
        ({"compressed": [0, 1500, 3000], "bits": [1, 0, 0]}, "byte before"),
    ],
)
def test_inconsistent_points_are_refused(kwargs, match):
    args = {"compressed": [10, 1500, 3000], "uncompressed": [0, 30000, 60000], "bits": [0, 3, 7]}
    args.update(kwargs)
    with pytest.raises(IndexFormatError, match=match):
        SeekPoints("gzip", 5000, 90000, **args)


def test_a_window_that_inflates_past_32_kib_is_refused():
    import zlib

    p = SeekPoints("gzip", 10, 100, [1], [0], [0], [zlib.compress(b"z" * 40000)])
    with pytest.raises(IndexFormatError, match="32768"):
        SeekPoints.from_bytes(p.to_bytes()).window(0)


def test_compression_is_recognised_by_magic_bytes():
    assert sniff(b"\x1f\x8b\x08\x00") == "gzip"
    assert sniff(b"\x28\xb5\x2f\xfd\x00") == "zstd"
    assert sniff(b"000000.jpg\x00\x00") is None and sniff(b"") is None
    for head, name in ((b"BZh91AY", "bzip2"), (b"\xfd7zXZ\x00\x00", "xz")):
        with pytest.raises(CompressedDataError, match=name) as e:
            sniff(head)
        assert isinstance(e.value, TarFormatError) and isinstance(e.value, ValueError)


def test_codecs_by_kind():
    assert codec_for("gzip").kind == "gzip"
    with pytest.raises(ValueError, match="unknown compression"):
        codec_for("lzma")
    assert np.array_equal(_points().bits, [0, 3, 7])
