"""gzip seek points from indexed_gzip and decoding from them, on real .tar.gz files."""

from __future__ import annotations

import gzip
import io
import random
import zlib

import pytest
from compressfixtures import compressible_samples, gnu_tar_czf, gunzip, tarfile_gz

from wids.compress import SeekPoints, codec_for
from wids.compress.gzipcodec import points_from_gzidx
from wids.errors import CompressedDataError

pytest.importorskip("indexed_gzip")

SPACING = 64 << 10


def _index(path, spacing=SPACING) -> SeekPoints:
    codec = codec_for("gzip")
    with open(path, "rb") as f:
        indexing = codec.indexing(f, spacing)
        try:
            while indexing.stream.read(1 << 20):
                pass
            return indexing.points()
        finally:
            indexing.close()


def _read(points: SeekPoints, blob: bytes, start: int, stop: int) -> bytes:
    codec = codec_for("gzip")
    c0, c1 = codec.compressed_range(points, start, stop)
    return codec.decode(points, blob[c0:c1], start, stop)


@pytest.mark.parametrize(
    "make, size",
    [(tarfile_gz, 6000), (gnu_tar_czf, 6000), (tarfile_gz, 60000)],
    ids=["tarfile", "gnutar", "stored-blocks"],
)
def test_any_range_decodes_to_the_tars_bytes(make, size, tmp_path):
    """Large random members make deflate write stored blocks, which realign to the input's
    bytes: decoding from a point inside a byte must keep that alignment (not shift)."""
    n = 300 if size < 10000 else 60
    path = make(tmp_path / "s.tar.gz", compressible_samples(n, size=size))
    tar, blob = gunzip(path), path.read_bytes()
    points = _index(path)
    assert points.uncompressed_size == len(tar) and points.compressed_size == len(blob)
    assert len(points) >= len(tar) // (2 * SPACING)  # a point at the next block after spacing
    assert set(points.bits.tolist()) - {0}, "no point inside a byte: priming is not tested"
    rng = random.Random(1)
    ranges = [(0, 1), (0, len(tar)), (len(tar) - 1, len(tar))]
    ranges += [(int(u), int(u) + 1) for u in points.uncompressed]  # at each point
    ranges += [(int(u) - 1, int(u) + 1) for u in points.uncompressed[1:]]  # across each
    for _ in range(200):
        a = rng.randrange(len(tar))
        ranges.append((a, min(len(tar), a + rng.choice([1, 512, 5000, 200_000]))))
    for a, b in ranges:
        assert _read(points, blob, a, b) == tar[a:b], (a, b)


def test_a_range_reads_about_one_spacing_of_compressed_bytes(tmp_path):
    path = tarfile_gz(tmp_path / "s.tar.gz", compressible_samples(300))
    points = _index(path)
    codec = codec_for("gzip")
    widths = [
        codec.compressed_range(points, int(u) + 100, int(u) + 200) for u in points.uncompressed[:-1]
    ]
    assert max(b - a for a, b in widths) <= 2 * SPACING  # one point's stretch, not the file


def test_several_gzip_members_in_one_file(tmp_path):
    """``cat a.gz b.gz`` (pigz, concatenated parts): ranges across the member boundary."""
    src = tarfile_gz(tmp_path / "whole.tar.gz", compressible_samples(200))
    tar = gunzip(src)
    cut = len(tar) // 2 + 123
    blob = gzip.compress(tar[:cut]) + gzip.compress(tar[cut:])
    path = tmp_path / "two.tar.gz"
    path.write_bytes(blob)
    points = _index(path)
    assert points.uncompressed_size == len(tar)
    for a, b in [(cut - 10, cut + 10), (cut - 1, cut), (cut, cut + 1), (0, len(tar)), (5, cut + 5)]:
        assert _read(points, blob, a, b) == tar[a:b]


def test_bad_and_truncated_data_are_typed_errors_with_offsets(tmp_path):
    path = tarfile_gz(tmp_path / "s.tar.gz", compressible_samples(200))
    tar, blob = gunzip(path), path.read_bytes()
    points = _index(path)
    codec = codec_for("gzip")
    a = int(points.uncompressed[2]) + 10
    c0, c1 = codec.compressed_range(points, a, a + 30000)
    with pytest.raises(CompressedDataError, match="short") as e:
        codec.decode(points, blob[c0 : c0 + (c1 - c0) // 4], a, a + 30000)  # truncated
    assert e.value.offset is not None and e.value.offset > c0
    bad = bytearray(blob[c0:c1])
    bad[2:60] = bytes(58)  # a zeroed stretch right after the point: no valid deflate
    try:
        out = codec.decode(points, bytes(bad), a, a + 30000)
    except CompressedDataError as e2:
        assert c0 <= e2.offset <= c1 and "does not decode" in str(e2)
    else:
        assert out != tar[a : a + 30000]  # decoded, but to other bytes: the header check's job
    # the whole-file stream checks CRC and length
    stream = codec.stream(io.BytesIO(blob[: len(blob) - 5]))
    with pytest.raises(CompressedDataError, match="truncated"):
        while stream.read(1 << 16):
            pass
    flipped = bytearray(blob)
    flipped[-6] ^= 0xFF  # the CRC
    stream = codec.stream(io.BytesIO(bytes(flipped)))
    with pytest.raises(CompressedDataError, match="corrupt"):
        while stream.read(1 << 16):
            pass


def test_indexing_a_truncated_file_is_a_typed_error(tmp_path):
    path = tarfile_gz(tmp_path / "s.tar.gz", compressible_samples(100))
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(CompressedDataError):
        _index(path)


def test_gzidx_parsing_refuses_other_layouts():
    with pytest.raises(CompressedDataError, match="too short"):
        points_from_gzidx(b"GZIDX", 10)
    with pytest.raises(CompressedDataError, match="layout"):
        points_from_gzidx(b"GZIDX\x02\x00" + bytes(28), 10)


def test_windows_are_stored_compressed(tmp_path):
    path = tarfile_gz(tmp_path / "s.tar.gz", compressible_samples(300))
    points = _index(path)
    raw = sum(len(points.window(k)) for k in range(len(points)))
    assert len(points.window_blob) < raw
    assert all(len(points.window(k)) in (0, 32768) for k in range(len(points)))
    assert zlib.decompress(points.window_blob[: int(points.window_end[1])] or zlib.compress(b""))


def test_an_index_claiming_a_huge_tar_costs_what_the_data_decodes_to(tmp_path):
    """A hostile index (a point 2**40 tar bytes before a sample) is a typed error, not 1 TiB."""
    path = tarfile_gz(tmp_path / "s.tar.gz", compressible_samples(50))
    blob = path.read_bytes()
    real = _index(path)
    huge = SeekPoints(
        "gzip",
        real.compressed_size,
        1 << 41,
        real.compressed[:1],
        real.uncompressed[:1],
        real.bits[:1],
        [b""],
    )
    codec = codec_for("gzip")
    start = 1 << 40
    c0, c1 = codec.compressed_range(huge, start, start + 100)
    with pytest.raises(CompressedDataError, match="short"):
        codec.decode(huge, blob[c0:c1], start, start + 100)


_NO_CTYPES_ZLIB = r"""
import ctypes.util, sys, tarfile, warnings, zlib
{setup}
sys.path.insert(0, {tests!r})
from wids import ShardListDataset, build_index
from wids.compress import zlibprime
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    build_index([{shard!r}], {index!r}, seek_spacing=64 << 10)
    ds = ShardListDataset({index!r}, transformations=[])
    got = {{}}
    for i in reversed(range(len(ds))):  # backwards: no decoded segment reused
        for k, v in ds[i].items():
            if not k.startswith("__"):
                got[ds[i]["__key__"] + k] = v
with tarfile.open({shard!r}) as tar:
    want = {{m.name: tar.extractfile(m).read() for m in tar if m.isfile()}}
assert not zlibprime.available()
assert got == want, "samples differ from tarfile's"
ours = [w for w in caught if "inflatePrime" in str(w.message)]
assert len(ours) == 1 and ours[0].category is RuntimeWarning, [str(w.message) for w in caught]
print("ok", len(ds))
"""


@pytest.mark.parametrize(
    "setup",
    [
        "ctypes.util.find_library = lambda name: None",  # no zlib library loadable
        "zlib.ZLIB_RUNTIME_VERSION = '1.0.0-other'",  # a libz of another version than Python's
    ],
    ids=["no-libz", "other-version"],
)
def test_without_inflate_prime_reads_are_right_and_say_so_once(setup, tmp_path):
    # the fallback (decode from the nearest byte-aligned point) raised RuntimeError at index
    # build and at every read; a libz whose version differs from Python's zlib was called
    # with zlib 1.x's z_stream layout. Now: every sample equals tarfile's, one RuntimeWarning
    import os
    import subprocess
    import sys

    shard = tarfile_gz(tmp_path / "a.tar.gz", compressible_samples(200, seed=3))
    code = _NO_CTYPES_ZLIB.format(
        setup=setup,
        tests=os.path.dirname(__file__),
        shard=str(shard),
        index=str(tmp_path / "i.json"),
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("ok 200")
    points = _index(shard)
    assert set(points.bits.tolist()) - {0}  # points inside bytes exist: the fallback was used


def test_byte_aligned_points_inflate_with_pythons_zlib_as_with_prime():
    # the Python path (points at bit 0) and the ctypes path give the same results
    from wids.compress import zlibprime

    if not zlibprime.available():
        pytest.skip("no ctypes zlib here")
    rng = random.Random(5)
    text = b" ".join(b"w%d" % rng.randrange(300) for _ in range(200_000))
    window = text[:32768]
    c = zlib.compressobj(6, zlib.DEFLATED, -15, zdict=window)
    raw = c.compress(text[32768:]) + c.flush()
    body = text[32768:]
    # a stream starting a byte: Python's zlib; the same stream one bit later: inflatePrime
    # (deflate fills bytes from the low bit: 7 bits of byte 0 are the top 7, after one junk)
    shifted = ((int.from_bytes(raw, "little") << 1) | 1).to_bytes(len(raw) + 1, "little")
    for data, nbits in ((raw + b"TRAILER!", 0), (shifted + b"TRAILER!", 7)):
        out, consumed, ended, err = zlibprime.inflate_from(data, nbits, window, len(body) + 10)
        assert (out, ended, err) == (body, True, None), nbits
        for need in (1, 1000, len(body) // 2):
            assert zlibprime.inflate_from(data, nbits, window, need)[0] == body[:need]
    assert zlibprime.inflate_from(raw, 0, window, len(body))[1] == len(raw)
    bad = zlibprime.inflate_from(b"\xff" * 100, 0, b"", 10)
    assert bad[3] is not None and bad[0] == b""
