"""Hostile inputs: crafted tars, crafted indexes (JSON and SQLite), huge values.

Every case asserts the typed error (never a raw ``OverflowError``, ``RecursionError``,
``MemoryError`` or a hang) and that its message names the file and what is wrong. All inputs
are generated here; no binary fixtures.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from tarfixtures import make_samples, write_shard

from wids.build import build_index
from wids.cli import main as wids_main
from wids.errors import TarFormatError
from wids.index import open_index
from wids.tar import iter_members_fetch, iter_members_stream, scan_local

# -------------------------------------------------------------------------------------------
# Tars


def _rechecksum(raw: bytearray, at: int) -> None:
    block = raw[at : at + 512]
    block[148:156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(block)


def _member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.USTAR_FORMAT)


def _all_parsers(path: Path) -> list:
    """One call per entry point: local scan, fetch callable, stream."""
    data = path.read_bytes()
    return [
        lambda: scan_local(path, shard=str(path)),
        lambda: list(iter_members_fetch(lambda s, e: data[s:e], shard=str(path))),
        lambda: list(
            iter_members_fetch(lambda s, e: data[s:e], shard=str(path), file_size=len(data))
        ),
        lambda: list(iter_members_stream(io.BytesIO(data), shard=str(path))),
    ]


def _base256_size_tar(path: Path, size: int) -> Path:
    """A shard whose second member's header says ``size`` in base-256 (GNU) notation."""
    write_shard(path, make_samples(2, fields=(".txt",)), format="gnu")
    raw = bytearray(path.read_bytes())
    raw[1024 + 124 : 1024 + 136] = b"\x80" + size.to_bytes(11, "big")
    _rechecksum(raw, 1024)
    path.write_bytes(bytes(raw))
    return path


def test_base256_size_2_80_is_a_tar_error_naming_shard_and_offset(tmp_path: Path) -> None:
    path = _base256_size_tar(tmp_path / "huge.tar", 2**80)
    for parse in _all_parsers(path):
        with pytest.raises(TarFormatError) as err:
            parse()
        assert err.value.offset == 1024
        assert "huge.tar" in str(err.value) and "size" in str(err.value)


def test_base256_size_past_the_end_is_truncation_not_overflow(tmp_path: Path) -> None:
    """A large but representable size: the archive is reported short, no C-long overflow."""
    path = _base256_size_tar(tmp_path / "big.tar", 2**61)
    for parse in _all_parsers(path):
        with pytest.raises(TarFormatError, match="big.tar"):
            parse()


def _pax_tar(path: Path, records: bytes) -> Path:
    """A pax ``x`` record with the given raw record data, then the member ``k.txt``."""
    xinfo = tarfile.TarInfo("././@PaxHeader")
    xinfo.type, xinfo.size = tarfile.XHDTYPE, len(records)
    pad = -len(records) % 512
    body = b"hi".ljust(512, b"\0")
    data = (
        xinfo.tobuf(tarfile.USTAR_FORMAT)
        + records
        + bytes(pad)
        + _member_header("k.txt", 2)
        + body
        + _member_header("k.cls", 2)
        + body
        + bytes(1024)
    )
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(b"20 path=sample.txt\n", id="one-too-large"),  # value "sample.txt\n"
        pytest.param(b"20 path=sample.txt\n11 size=2\n", id="too-large-before-another"),
        pytest.param(b"18 path=sample.txt\n", id="one-too-small"),
        pytest.param(b"12 path=sample.txt\n", id="much-too-small"),  # tarfile dropped the rest
        pytest.param(b"99 path=sample.txt\n", id="past-the-end"),
        pytest.param(b"19 path=sample.txt\n8 size=2\n", id="second-too-small"),
        pytest.param(b"19 path=sample.txt\ngarbage", id="trailing-garbage"),
        pytest.param(b"9" * 40 + b" path=x\n", id="absurd-digits"),
    ],
)
def test_bad_pax_record_length_is_a_tar_error(tmp_path: Path, records: bytes) -> None:
    path = _pax_tar(tmp_path / "pax.tar", records)
    for parse in _all_parsers(path):
        with pytest.raises(TarFormatError) as err:
            parse()
        assert err.value.offset == 0 and "pax.tar" in str(err.value)


def test_good_pax_record_with_nul_padding_still_parses(tmp_path: Path) -> None:
    path = _pax_tar(tmp_path / "pax.tar", b"19 path=sample.txt\n\0\0\0")
    for parse in _all_parsers(path):
        assert [m.name for m in parse()] == ["sample.txt", "k.cls"]


def test_skip_bad_skips_only_the_overflowing_shard(tmp_path: Path, capsys) -> None:
    good = [write_shard(tmp_path / f"good{i}.tar", make_samples(3, start=10 * i)) for i in (0, 1)]
    bad = _base256_size_tar(tmp_path / "bad.tar", 2**80)
    paxbad = _pax_tar(tmp_path / "paxbad.tar", b"20 path=sample.txt\n")
    shards = [str(good[0]), str(bad), str(paxbad), str(good[1])]
    out = tmp_path / "idx.json"
    assert (
        wids_main(["index", "create", *shards, "-o", str(out), "--skip-bad"]) == 1
    )  # 1: some skipped
    idx = open_index(str(out))
    assert [os.path.basename(s.url) for s in idx.shards] == ["good0.tar", "good1.tar"]
    report = json.loads(out.read_text())["wids_index"]["report"]
    bad_names = sorted(os.path.basename(b["url"]) for b in report["bad"])
    assert bad_names == ["bad.tar", "paxbad.tar"]
    # and through the Python API, without skip_bad, the error names the shard
    with pytest.raises(TarFormatError, match="bad.tar"):
        build_index([str(good[0]), str(bad)], str(tmp_path / "other.json"))


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_mutated_tars_only_give_tar_errors(tmp_path: Path, fmt: str) -> None:
    """Random header bytes (checksums fixed up): a result or a TarFormatError, nothing raw."""
    import random

    path = write_shard(tmp_path / "s.tar", make_samples(4, fields=(".txt", "." + "x" * 120)))
    if fmt == "pax":
        path = _pax_tar(tmp_path / "s.tar", b"19 path=sample.txt\n")
    clean = path.read_bytes()
    headers = [m.header_offset for m in scan_local(path)]
    rng = random.Random(7)
    for _ in range(300):
        raw = bytearray(clean)
        at = rng.choice(headers)
        for _ in range(rng.randint(1, 4)):
            raw[at + rng.choice([124, 125, 130, 135, 156, 0, 345, rng.randrange(512)])] = (
                rng.choice([0, 0x80, 0xFF, 0x30, 0x37, 0x20, rng.randrange(256)])
            )
        _rechecksum(raw, at)
        path.write_bytes(bytes(raw))
        for parse in _all_parsers(path):
            try:
                parse()
            except TarFormatError as e:
                assert "s.tar" in str(e)
