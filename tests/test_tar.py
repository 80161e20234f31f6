"""wids.tar against tarfile (the oracle), on real archives, through every entry point."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import random
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarfixtures import (
    Entry,
    make_samples,
    mixed_entries,
    require_gnu_tar,
    tarfile_members,
    write_shard,
    write_tar,
)

from wids import HeaderChecksumError, ShardNotFoundError, TarFormatError, TruncatedTarError
from wids import tar as wtar
from wids.tar import (
    TarMember,
    iter_members_fetch,
    iter_members_stream,
    scan_local,
    scan_local_rows,
    walk,
)

Row = tuple[str, int, int, str, int]


class _Trickle(io.RawIOBase):
    """A non-seekable stream that returns at most ``step`` bytes per read."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.pos, self.step = data, 0, step

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        n = min(len(b), self.step, len(self.data) - self.pos)
        b[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def _rows(members: Iterator[TarMember] | list[TarMember]) -> list[Row]:
    return [(m.name, m.offset, m.size, m.type, m.header_offset) for m in members]


def _via_bytes(path: Path, shard: str | None = None) -> list[Row]:
    data = path.read_bytes()
    return _rows(iter_members_fetch(lambda s, e: data[s:e], shard=shard))


def _via_bytes_sized(path: Path, shard: str | None = None) -> list[Row]:
    data = path.read_bytes()
    return _rows(iter_members_fetch(lambda s, e: data[s:e], shard=shard, file_size=len(data)))


def _via_pread(path: Path, shard: str | None = None) -> list[Row]:
    fd = os.open(path, os.O_RDONLY)
    try:
        fetch = lambda s, e: os.pread(fd, e - s, s)  # noqa: E731
        return _rows(iter_members_fetch(fetch, shard=shard, file_size=os.fstat(fd).st_size))
    finally:
        os.close(fd)


def _via_stream(path: Path, shard: str | None = None) -> list[Row]:
    with open(path, "rb") as f:
        return _rows(iter_members_stream(f, shard=shard))


def _via_trickle(path: Path, shard: str | None = None) -> list[Row]:
    stream = _Trickle(path.read_bytes(), 700)
    return _rows(iter_members_stream(stream, shard=shard))  # type: ignore[arg-type]


def _via_scan(path: Path, shard: str | None = None) -> list[Row]:
    return _rows(scan_local(path, shard=shard))


def _via_scan_rows(path: Path, shard: str | None = None) -> list[Row]:
    return scan_local_rows(path, shard=shard)


APIS: dict[str, Callable[..., list[Row]]] = {
    "fetch-bytes": _via_bytes,
    "fetch-bytes-sized": _via_bytes_sized,
    "fetch-pread": _via_pread,
    "stream": _via_stream,
    "stream-trickle": _via_trickle,
    "scan_local": _via_scan,
    "scan_local_rows": _via_scan_rows,
}


@pytest.fixture(params=sorted(APIS))
def api(request: pytest.FixtureRequest) -> Callable[..., list[Row]]:
    return APIS[request.param]


# ---------------------------------------------------------------------------------------------
# Agreement with tarfile


def test_fixture_matches_tarfile(tar_fixture: Path, api: Callable[..., list[Row]]) -> None:
    assert api(tar_fixture) == tarfile_members(tar_fixture)


def test_fixtures_cover_the_formats(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "a.tar", mixed_entries(), format="pax")
    names = {m.name for m in scan_local(path)}
    assert "données/é.txt" in names and "日本/ファイル.txt" in names
    assert any(len(os.fsencode(n)) > 255 for n in names)
    assert "latin1-caf\udce9.txt" in names
    members = scan_local(path)
    assert {m.type for m in members} == {"0", "1", "2", "5", "6"}
    assert any(m.size == 0 and m.isreg for m in members)
    assert any(m.size > 0 and m.size % 512 == 0 for m in members)


def test_member_value_object(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "s.tar", make_samples(2), format="gnu")
    m = scan_local(path)[0]
    assert m == TarMember("000000.jpg", 512, 2000, "0", 0)
    assert m.isreg and not TarMember("d", 512, 0, "5", 0).isreg
    assert TarMember("x", 512, 0, "7", 0).isreg and TarMember("x", 512, 0, "\0", 0).isreg
    with pytest.raises(AttributeError):
        m.size = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(m)) == m
    assert scan_local_rows(path)[0] == ("000000.jpg", 512, 2000, "0", 0)


@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
@pytest.mark.parametrize("writer", ["tarfile", "gnutar"])
def test_webdataset_shard(tmp_path: Path, fmt: str, writer: str) -> None:
    members = make_samples(50, prefix="train/", fields=(".jpg", ".cls", ".seg.png", ".json"))
    path = write_shard(tmp_path / "s.tar", members, format=fmt, writer=writer)
    got = scan_local(path)
    assert [m.name for m in got] == [n for n, _ in members]
    data = path.read_bytes()
    assert [data[m.offset : m.offset + m.size] for m in got] == [d for _, d in members]


def test_pax_x_applies_to_next_member_only_and_g_sticks(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, pax in (("a.txt", {"path": "renamed/a.txt"}), ("b.txt", {})):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = 3, pax
            tar.addfile(info, io.BytesIO(b"abc"))
    data = buf.getvalue()
    assert [m.name for m in iter_members_fetch(lambda s, e: data[s:e])] == [
        "renamed/a.txt",
        "b.txt",
    ]
    # A global record with a path renames every later member (tarfile agrees).
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"path": "g"}):
        pass
    glob = buf.getvalue()[:1024]  # the g header and its one data block
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("a", "b"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"z"))
    data = glob + body.getvalue()
    ours = _rows(iter_members_fetch(lambda s, e: data[s:e]))
    assert ours == tarfile_members(data) and [r[0] for r in ours] == ["g", "g"]


def _gnu_long(name: str) -> bytes:
    data = name.encode() + b"\0"
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, len(data)
    return info.tobuf(tarfile.USTAR_FORMAT) + data.ljust(-(-len(data) // 512) * 512, b"\0")


def _pax(path: str, typ: bytes = tarfile.XHDTYPE) -> bytes:
    body = f" path={path}\n"
    n = len(body) + len(str(len(body)))
    n = len(body) + len(str(n))
    record = f"{n}{body}".encode()
    info = tarfile.TarInfo("pax")
    info.type, info.size = typ, len(record)
    return info.tobuf(tarfile.USTAR_FORMAT) + record.ljust(-(-len(record) // 512) * 512, b"\0")


def _plain(name: str = "short", size: int = 3, typ: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, typ
    return info.tobuf(tarfile.USTAR_FORMAT) + (b"abc".ljust(512, b"\0") if size else b"")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_pax("from-x") + _gnu_long("from-L") + _plain(), id="x-then-L"),
        pytest.param(_gnu_long("from-L") + _pax("from-x") + _plain(), id="L-then-x"),
        pytest.param(_gnu_long("L1") + _gnu_long("L2") + _plain(), id="L-then-L"),
        pytest.param(_pax("x1") + _pax("x2") + _plain(), id="x-then-x"),
        pytest.param(
            _pax("g", tarfile.XGLTYPE) + _pax("x") + _plain() + _plain("second"), id="g-then-x"
        ),
        pytest.param(_pax("g", tarfile.XGLTYPE) + _gnu_long("L") + _plain(), id="g-then-L"),
        pytest.param(_gnu_long("dir//") + _plain("dir/", 0, tarfile.DIRTYPE), id="L-dir"),
        pytest.param(_pax("dir//") + _plain("dir/", 0, tarfile.DIRTYPE), id="x-dir"),
        pytest.param(_pax("file//") + _plain(), id="x-file-slashes"),
    ],
)
def test_chained_extension_records(body: bytes) -> None:
    """Which record wins when several precede one member: the first, as in tarfile."""
    data = body + bytes(1024)
    assert _rows(iter_members_fetch(lambda s, e: data[s:e])) == tarfile_members(data)
    assert _rows(iter_members_stream(io.BytesIO(data))) == tarfile_members(data)


def test_pax_size_overrides_header(tmp_path: Path) -> None:
    """A pax size wins over the header's (here the header says 0, as for huge members)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("big.bin")
        info.size = 1500
        tar.addfile(info, io.BytesIO(b"q" * 1500))
        info = tarfile.TarInfo("next.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    raw = bytearray(buf.getvalue())
    # Insert an x record {"size": "1500"} before big.bin and zero its header size field.
    record = b"13 size=1500\n"
    xinfo = tarfile.TarInfo("././@PaxHeader")
    xinfo.type, xinfo.size = tarfile.XHDTYPE, len(record)
    xhdr = bytearray(xinfo.tobuf(tarfile.USTAR_FORMAT))
    raw[124:136] = b"%011o\0" % 0
    _rechecksum(raw, 0)
    data = bytes(xhdr) + record.ljust(512, b"\0") + bytes(raw)
    assert _rows(iter_members_fetch(lambda s, e: data[s:e])) == tarfile_members(data)
    assert [(m.name, m.size) for m in iter_members_stream(io.BytesIO(data))] == [
        ("big.bin", 1500),
        ("next.txt", 2),
    ]


def test_signed_checksum_accepted(tmp_path: Path) -> None:
    """Old Sun/NeXT tars summed signed chars; tarfile accepts that, and so do we."""
    path = write_tar(tmp_path / "a.tar", [("é/ü.txt", b"hi")], format="ustar")
    raw = bytearray(path.read_bytes())
    block = raw[0:512]
    block[148:156] = b" " * 8
    signed = sum(b - 256 if b >= 128 else b for b in block)
    raw[148:156] = b"%06o\0 " % signed
    path.write_bytes(bytes(raw))
    assert _via_scan(path) == tarfile_members(path)
    assert _via_scan(path)[0][0] == "é/ü.txt"


def test_unusual_number_formatting(tmp_path: Path) -> None:
    """Space-padded and unterminated octal fields, as old tars write them."""
    path = write_tar(tmp_path / "a.tar", [("a", b"x" * 700), ("b", b"y")], format="ustar")
    raw = bytearray(path.read_bytes())
    raw[124:136] = b"        1274"  # 12 chars, no terminator
    _rechecksum(raw, 0, fmt=b" %06o\0")
    path.write_bytes(bytes(raw))
    assert _via_scan(path) == tarfile_members(path)


def _rechecksum(raw: bytearray, at: int, fmt: bytes = b"%06o\0 ") -> None:
    block = raw[at : at + 512]
    block[148:156] = b" " * 8
    raw[at + 148 : at + 156] = fmt % sum(block)


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_gnu_sparse_rejected(tmp_path: Path, fmt: str) -> None:
    exe = require_gnu_tar()
    src = tmp_path / "sparse"
    with open(src, "wb") as f:
        f.truncate(1 << 20)
        f.seek(1 << 19)
        f.write(b"data")
    out = tmp_path / "s.tar"
    import subprocess

    subprocess.run(
        [exe, f"--format={fmt}", "--sparse", "-cf", str(out), "-C", str(tmp_path), "sparse"],
        check=True,
    )
    with pytest.raises(TarFormatError, match="sparse"):
        scan_local(out)


# ---------------------------------------------------------------------------------------------
# Corrupt and non-tar input


def _small_tar(tmp_path: Path, fmt: str) -> Path:
    entries = [
        Entry("d", type="5"),
        Entry("d/000001.jpg", b"j" * 700),
        Entry("d/000001.cls", b"1"),
        Entry("x" * 130 + ".txt", b"long"),
        Entry("d/000002.jpg", b""),
        Entry("d/000002.cls", b"2" * 512),
    ]
    return write_tar(tmp_path / f"small-{fmt}.tar", entries, format=fmt)


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_truncation_never_gives_a_wrong_list(
    tmp_path: Path, fmt: str, api: Callable[..., list[Row]]
) -> None:
    full = _small_tar(tmp_path, fmt)
    data = full.read_bytes()
    expected = tarfile_members(full)
    headers = {r[4] for r in expected} | {r[1] - 512 for r in expected}
    end_block = max(r[1] + r[2] for r in expected)
    end_block = (end_block + 511) // 512 * 512
    cuts = set(range(0, len(data), 512)) | {h + d for h in headers for d in (1, 100, 300, 511)}
    cut_path = tmp_path / "cut.tar"
    for cut in sorted(cuts):
        cut_path.write_bytes(data[:cut])
        if cut >= end_block + 512:  # the end-of-archive block is complete: the full list
            assert api(cut_path) == expected, cut
            continue
        with pytest.raises(TarFormatError) as info:
            api(cut_path, shard="cut.tar")
        err = info.value
        assert err.shard == "cut.tar" and err.offset is not None, cut
        if cut > 0:
            assert isinstance(err, TruncatedTarError), (cut, err)
            assert 0 <= err.offset <= max(cut, 512) or api is _via_bytes, (cut, err)


def test_tarfile_reads_a_prefix_that_we_reject(tmp_path: Path) -> None:
    """The reason we are strict: tarfile lists a truncated archive as a shorter, valid one."""
    full = _small_tar(tmp_path, "gnu")
    expected = tarfile_members(full)
    cut = expected[3][4]  # the header of the fourth member: a member boundary
    data = full.read_bytes()[:cut]
    assert len(tarfile_members(data)) == 3
    with pytest.raises(TruncatedTarError, match="end-of-archive"):
        list(iter_members_fetch(lambda s, e: data[s:e]))


@pytest.mark.parametrize("field", ["checksum", "name", "size", "typeflag"])
def test_flipped_header_bytes(tmp_path: Path, field: str, api: Callable[..., list[Row]]) -> None:
    full = _small_tar(tmp_path, "pax")
    data = full.read_bytes()
    # Every header block: members' first headers (x records) and their own headers.
    blocks = sorted(
        {r[4] for r in tarfile_members(full)} | {r[1] - 512 for r in tarfile_members(full)}
    )
    pos = {"checksum": 150, "name": 3, "size": 130, "typeflag": 156}[field]
    bad = tmp_path / "bad.tar"
    for at in blocks:
        raw = bytearray(data)
        raw[at + pos] ^= 0x01
        bad.write_bytes(bytes(raw))
        with pytest.raises(HeaderChecksumError) as info:
            api(bad, shard="bad.tar")
        assert info.value.offset == at and info.value.shard == "bad.tar"
        assert "checksum" in str(info.value) and f"byte {at}" in str(info.value)


def test_random_bytes(tmp_path: Path, api: Callable[..., list[Row]]) -> None:
    rng = random.Random(3)
    for n in (1, 100, 511, 512, 513, 10_000):
        path = tmp_path / "random.bin"
        path.write_bytes(rng.randbytes(n))
        with pytest.raises(TarFormatError) as info:
            api(path, shard="random.bin")
        assert info.value.offset == 0 and info.value.shard == "random.bin"


def test_empty_file(tmp_path: Path, api: Callable[..., list[Row]]) -> None:
    path = tmp_path / "empty.tar"
    path.write_bytes(b"")
    with pytest.raises(TarFormatError, match="empty") as info:
        api(path, shard="empty.tar")
    assert info.value.offset == 0 and info.value.shard == "empty.tar"


def test_empty_archive_yields_nothing(tmp_path: Path, api: Callable[..., list[Row]]) -> None:
    path = tmp_path / "zeros.tar"
    for n in (512, 1024, 10240):
        path.write_bytes(bytes(n))
        assert api(path) == []


@pytest.mark.parametrize("size", ["tiny", "large"])
def test_gzip_is_named(tmp_path: Path, size: str, api: Callable[..., list[Row]]) -> None:
    src = _small_tar(tmp_path, "gnu") if size == "large" else None
    payload = src.read_bytes() if src else b""
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip.compress(payload))
    with pytest.raises(TarFormatError, match="gzip-compressed; wids reads uncompressed tar"):
        api(path, shard="a.tar.gz")


def test_stream_reads_every_byte_and_never_seeks(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "a.tar", mixed_entries(), format="gnu", writer="tarfile")
    data = path.read_bytes()
    for step in (7, 511, 512, 4096, 1 << 20):
        stream = _Trickle(data, step)
        assert not stream.seekable()
        rows = _rows(iter_members_stream(stream))  # type: ignore[arg-type]
        assert rows == tarfile_members(path)
        assert stream.pos == len(data)


def test_fetch_reads_only_headers(tmp_path: Path) -> None:
    members = make_samples(20, jpg_size=50_000)
    path = write_shard(tmp_path / "s.tar", members, format="pax")
    data = path.read_bytes()
    calls: list[tuple[int, int]] = []

    def fetch(s: int, e: int) -> bytes:
        calls.append((s, e))
        return data[s:e]

    list(iter_members_fetch(fetch, file_size=len(data)))
    assert sum(e - s for s, e in calls) < 60 * 3 * 512
    assert all(e - s <= 512 for s, e in calls)


def test_checksums_checked_across_batches(tmp_path: Path) -> None:
    """scan_local verifies checksums in batches; a bad header anywhere is still found first."""
    n = walk._BATCH * 2 + 100
    path = write_tar(
        tmp_path / "many.tar", [(f"{i:06d}.cls", b"1") for i in range(n)], format="gnu"
    )
    good = path.read_bytes()
    assert len(scan_local_rows(path)) == n
    for bad_index in (5, walk._BATCH - 1, walk._BATCH + 7, n - 1):
        raw = bytearray(good)
        at = bad_index * 1024
        raw[at + 2] ^= 0x01  # the name changes, the stored checksum does not
        path.write_bytes(bytes(raw))
        for api in (_via_scan_rows, _via_stream, _via_bytes):
            with pytest.raises(HeaderChecksumError) as info:
                api(path)
            assert info.value.offset == at
    # Two bad headers: the first is reported, even when the second derails the walk.
    raw = bytearray(good)
    raw[100 * 1024 + 130] = ord("7")  # member 100's size: its checksum fails, the walk jumps
    raw[50 * 1024 + 3] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(HeaderChecksumError) as info:
        scan_local_rows(path)
    assert info.value.offset == 50 * 1024


def test_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(ShardNotFoundError) as info:
        scan_local(tmp_path / "nope.tar")
    assert isinstance(info.value, FileNotFoundError) and "nope.tar" in str(info.value)


def test_huge_extension_record_refused(tmp_path: Path) -> None:
    """A pax header claiming gigabytes is refused, not read into memory."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, 1 << 40
    data = info.tobuf(tarfile.GNU_FORMAT) + bytes(1024)
    with pytest.raises(TarFormatError, match="extension record") as err:
        list(iter_members_fetch(lambda s, e: data[s:e]))
    assert err.value.offset == 0


def test_negative_base256_size(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "a.tar", [("a", b"x")], format="gnu")
    raw = bytearray(path.read_bytes())
    raw[124:136] = b"\xff" * 12
    _rechecksum(raw, 0)
    path.write_bytes(bytes(raw))
    with pytest.raises(TarFormatError, match="negative size"):
        scan_local(path)


def test_fetch_is_lazy(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "s.tar", make_samples(100), format="gnu")
    data = path.read_bytes()
    calls = []

    def fetch(s: int, e: int) -> bytes:
        calls.append(s)
        return data[s:e]

    first = next(iter_members_fetch(fetch))
    assert first.name == "000000.jpg" and len(calls) == 1


# ---------------------------------------------------------------------------------------------
# Property test: random layouts, every format, compared with tarfile

_SEGMENT = st.text(alphabet=st.sampled_from("abcxyz0189._-éü日本"), min_size=1, max_size=40).filter(
    lambda s: s not in (".", "..")
)
_NAMES = st.lists(_SEGMENT, min_size=1, max_size=8).map("/".join)
_SIZES = st.one_of(st.sampled_from([0, 1, 511, 512, 513, 1024, 1536]), st.integers(0, 3000))
_ENTRY = st.tuples(_NAMES, _SIZES, st.sampled_from("000000000552"))


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entries=st.lists(_ENTRY, max_size=12),
    fmt=st.sampled_from(["ustar", "gnu", "pax"]),
    global_pax=st.booleans(),
    step=st.sampled_from([100, 512, 1000, 1 << 20]),
)
def test_random_layouts_match_tarfile(
    tmp_path: Path, entries: list[tuple[str, int, str]], fmt: str, global_pax: bool, step: int
) -> None:
    buf = io.BytesIO()
    pax = {"comment": "é"} if global_pax and fmt == "pax" else None
    try:
        with tarfile.open(
            fileobj=buf, mode="w", format=getattr(tarfile, f"{fmt.upper()}_FORMAT"), pax_headers=pax
        ) as tar:
            for i, (name, size, typ) in enumerate(entries):
                info = tarfile.TarInfo(name)
                if typ == "5":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif typ == "2":
                    info.type, info.linkname = tarfile.SYMTYPE, name[::-1]
                    tar.addfile(info)
                else:
                    info.size = size
                    tar.addfile(info, io.BytesIO(bytes([i % 256]) * size))
    except ValueError:  # a name ustar cannot store
        return
    data = buf.getvalue()
    # tarfile cannot read back an archive that holds only a pax global header; it is empty.
    expected = tarfile_members(data) if entries else []
    assert _rows(iter_members_fetch(lambda s, e: data[s:e])) == expected
    assert _rows(iter_members_stream(_Trickle(data, step))) == expected  # type: ignore[arg-type]
    path = tmp_path / "h.tar"
    path.write_bytes(data)
    assert scan_local_rows(path) == expected


def test_header_mismatch_accepts_every_members_own_header(tar_fixture: Path) -> None:
    """Every regular member's own header (512 bytes before its data) passes, in every format."""
    data = tar_fixture.read_bytes()
    regular = [r for r in tarfile_members(tar_fixture) if r[3] in ("0", "7")]
    for name, offset, size, _, _ in regular:
        assert wtar.header_mismatch(data[offset - 512 : offset], name, size) is None, name


def test_header_mismatch_rejects_other_places(tar_fixture: Path) -> None:
    """Another member's header, another size, or member data never pass as a member's header."""
    data = tar_fixture.read_bytes()
    regular = [r for r in tarfile_members(tar_fixture) if r[3] in ("0", "7")]
    for (name, offset, size, _, _), (other, o_off, o_size, _, _) in zip(
        regular, regular[1:], strict=False
    ):
        h = data[offset - 512 : offset]
        assert wtar.header_mismatch(h, name, size + 1) is not None
        short = len(name) <= 100 and name.isascii()
        if short and other != name and o_size == size:
            assert wtar.header_mismatch(data[o_off - 512 : o_off], name, size) is not None
    assert wtar.header_mismatch(bytes(512), "a.txt", 0) is not None
    assert wtar.header_mismatch(b"x" * 512, "a.txt", 0) is not None
    assert wtar.header_mismatch(b"short", "a.txt", 0) is not None


def test_header_mismatch_names_what_differs(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "a.tar", [("dir/0001.cls", b"1\n"), ("dir/0002.cls", b"7\n")])
    data = path.read_bytes()
    (_, off1, _, _, _), (_, off2, _, _, _) = tarfile_members(path)
    assert wtar.header_mismatch(data[off1 - 512 : off1], "dir/0001.cls", 2) is None
    why = wtar.header_mismatch(data[off2 - 512 : off2], "dir/0001.cls", 2)
    assert why is not None and "dir/0002.cls" in why and "dir/0001.cls" in why
    assert "says 1000" in (
        wtar.header_mismatch(data[off1 - 512 : off1], "dir/0001.cls", 1000) or ""
    )
    assert "checksum" in (wtar.header_mismatch(data[off1 - 500 : off1 + 12], "x", 2) or "")
