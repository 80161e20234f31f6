"""Builders of real tar files for tests, shared by the whole test suite.

Everything here writes genuine archives, with Python's :mod:`tarfile` (ustar, GNU and pax
formats) or with GNU tar through a subprocess (skipped cleanly where ``tar`` is not GNU tar).
Nothing binary is checked in.

The helpers most tests want:

- :func:`write_shard` — a WebDataset shard from ``[(name, bytes), ...]`` in a given format.
- :func:`make_samples` — WebDataset-like members (``prefix000001.jpg``, ``.cls``, ``.json``).
- :func:`write_tar` — any mix of :class:`Entry` (files, directories, links) with any writer.
- :func:`tarfile_members` — the oracle: what :mod:`tarfile` says about an archive.
- :data:`FIXTURES` and the ``tar_fixture`` pytest fixture — the named catalogue of archives
  (every format x writer, long and non-ASCII names, empty members, directories, links, pax
  global headers, sizes that are exact multiples of 512).
"""

from __future__ import annotations

import functools
import io
import json
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "FIXTURES",
    "FORMATS",
    "GNU_TAR_FORMATS",
    "Entry",
    "gnu_tar",
    "make_samples",
    "mixed_entries",
    "require_gnu_tar",
    "tar_fixture",
    "tarfile_members",
    "write_gnu_tar",
    "write_shard",
    "write_tar",
]

FORMATS = ("ustar", "gnu", "pax")
GNU_TAR_FORMATS = ("ustar", "gnu", "pax", "oldgnu", "v7")
_TARFILE_FORMATS = {
    "ustar": tarfile.USTAR_FORMAT,
    "gnu": tarfile.GNU_FORMAT,
    "pax": tarfile.PAX_FORMAT,
}
MTIME = 1_700_000_000


@dataclass(frozen=True)
class Entry:
    """One archive entry to write.

    ``type`` is ``"0"`` (file with ``data``), ``"5"`` (directory), ``"2"`` (symlink to
    ``linkname``), ``"1"`` (hard link to the earlier member ``linkname``) or ``"6"`` (fifo).
    """

    name: str
    data: bytes = b""
    type: str = "0"
    linkname: str = ""


def _entries(members: Iterable[Entry | tuple[str, bytes]]) -> list[Entry]:
    return [m if isinstance(m, Entry) else Entry(m[0], m[1]) for m in members]


def write_tar(
    path: str | os.PathLike[str],
    members: Iterable[Entry | tuple[str, bytes]],
    *,
    format: str = "pax",
    writer: str = "tarfile",
    pax_headers: dict[str, str] | None = None,
) -> Path:
    """Write an archive of ``members`` (``Entry`` or ``(name, bytes)``) and return its path.

    ``writer`` is ``"tarfile"`` (``format`` one of :data:`FORMATS`; ``pax_headers`` become a
    global ``g`` record) or ``"gnutar"`` (``format`` one of :data:`GNU_TAR_FORMATS`; skips the
    calling test if GNU tar is not installed).
    """
    entries = _entries(members)
    if writer == "gnutar":
        return write_gnu_tar(path, entries, format=format)
    if writer != "tarfile":
        raise ValueError(f"unknown writer {writer!r}")
    kwargs = {"pax_headers": pax_headers} if pax_headers else {}
    with tarfile.open(path, "w", format=_TARFILE_FORMATS[format], **kwargs) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mtime = MTIME
            info.mode = 0o755 if e.type == "5" else 0o644
            info.uname = info.gname = "wids"
            if e.type == "0":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {
                "5": tarfile.DIRTYPE,
                "2": tarfile.SYMTYPE,
                "1": tarfile.LNKTYPE,
                "6": tarfile.FIFOTYPE,
            }[e.type]
            info.linkname = e.linkname
            tar.addfile(info)
    return Path(path)


def write_shard(
    path: str | os.PathLike[str],
    members: Iterable[tuple[str, bytes]],
    *,
    format: str = "gnu",
    writer: str = "tarfile",
) -> Path:
    """Write a WebDataset shard: regular files in the given order, nothing else.

    Example:
        ``write_shard(tmp_path / "s.tar", make_samples(10), format="pax")``
    """
    return write_tar(path, members, format=format, writer=writer)


def make_samples(
    n: int,
    *,
    prefix: str = "",
    fields: Sequence[str] = (".jpg", ".cls", ".json"),
    start: int = 0,
    jpg_size: int = 2000,
    seed: int = 0,
) -> list[tuple[str, bytes]]:
    """WebDataset-like members: ``f"{prefix}{i:06d}{field}"`` for each sample and field.

    ``.jpg`` (and other image-like fields) get ``jpg_size`` random bytes, ``.cls`` the class as
    text, ``.json`` a small JSON object, ``.txt`` a line of text; other fields random bytes.
    """
    rng = random.Random(seed)
    out = []
    for i in range(start, start + n):
        key = f"{prefix}{i:06d}"
        for field in fields:
            last = field.rsplit(".", 1)[-1]
            if last == "cls":
                data = str(i % 1000).encode()
            elif last == "json":
                data = json.dumps({"key": key, "i": i}).encode()
            elif last == "txt":
                data = f"sample {key}\n".encode()
            else:
                data = rng.randbytes(jpg_size)
            out.append((key + field, data))
    return out


@functools.cache
def gnu_tar() -> str | None:
    """Path of a GNU tar executable, or None."""
    exe = shutil.which("tar")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return exe if "GNU tar" in out.stdout else None


def require_gnu_tar() -> str:
    """The GNU tar executable; skips the calling test if there is none."""
    exe = gnu_tar()
    if exe is None:
        pytest.skip("GNU tar is not installed")
    return exe


def write_gnu_tar(
    path: str | os.PathLike[str], members: Iterable[Entry | tuple[str, bytes]], *, format: str
) -> Path:
    """Write ``members`` with GNU tar (``tar --format=FORMAT``), in the given order."""
    exe = require_gnu_tar()
    entries = _entries(members)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for e in entries:
            target = root / e.name
            if e.type == "5":
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if e.type == "0":
                target.write_bytes(e.data)
            elif e.type == "2":
                os.symlink(e.linkname, target)
            elif e.type == "1":
                os.link(root / e.linkname, target)
            elif e.type == "6":
                os.mkfifo(target)
            else:
                raise ValueError(f"GNU tar writer cannot make type {e.type!r}")
        listing = root.parent / (root.name + ".list")
        listing.write_bytes(b"".join(os.fsencode(e.name) + b"\0" for e in entries))
        try:
            subprocess.run(
                [exe, f"--format={format}", "--no-recursion", f"--mtime=@{MTIME}",
                 "--owner=0", "--group=0", "--numeric-owner", "-cf", os.path.abspath(path),
                 "-C", str(root), "--null", "-T", str(listing)],
                check=True,
                capture_output=True,
            )  # fmt: skip
        finally:
            listing.unlink()
    return Path(path)


def tarfile_members(source: str | os.PathLike[str] | bytes) -> list[tuple[str, int, int, str, int]]:
    """The oracle: ``(name, offset_data, size, type, offset)`` per member, from :mod:`tarfile`.

    ``type`` is one character, with ``"\\0"`` normalised to ``"0"`` as wids does.
    """
    if isinstance(source, bytes):
        tar = tarfile.open(fileobj=io.BytesIO(source), mode="r:")
    else:
        tar = tarfile.open(source, mode="r:")
    with tar:
        return [
            (
                m.name,
                m.offset_data,
                m.size,
                "0" if m.type == tarfile.AREGTYPE else m.type.decode("latin-1"),
                m.offset,
            )
            for m in tar.getmembers()
        ]


# ---------------------------------------------------------------------------------------------
# The fixture catalogue

_LONG_SPLITTABLE = "long-" + "d" * 90 + "/" + "f" * 95 + ".bin"  # > 100, fits ustar prefix+name
_VERY_LONG = "v" * 150 + "/" + "w" * 150 + "/" + "é" * 20 + ".data.txt"  # > 255 bytes


def mixed_entries(*, ustar: bool = False, links: bool = True) -> list[Entry]:
    """The standard mix: dirs, WebDataset samples, empty, 512-multiple, long, non-ASCII, links.

    ``ustar=True`` leaves out names that ustar cannot store (over 255 bytes, or unsplittable).
    """
    rng = random.Random(7)
    entries = [
        Entry("data", type="5"),
        Entry("data/000001.jpg", rng.randbytes(20_000)),
        Entry("data/000001.cls", b"3"),
        Entry("data/000001.seg.png", rng.randbytes(700)),
        Entry("data/000002.jpg", rng.randbytes(512)),
        Entry("data/000002.cls", b"4"),
        Entry("data/000002.seg.png", rng.randbytes(1024)),
        Entry("data/empty.txt", b""),
        Entry("data/block.bin", rng.randbytes(512 * 3)),
        Entry("données", type="5"),
        Entry("données/é.txt", "café".encode()),
        Entry("日本/ファイル.txt", "日本語".encode()),
        Entry("latin1-caf\udce9.txt", b"not UTF-8: surrogateescape"),  # the raw byte 0xE9
        Entry(_LONG_SPLITTABLE, rng.randbytes(1000)),
        Entry("big.bin", rng.randbytes(300_000)),
    ]
    if links:
        entries += [
            Entry("data/link.jpg", type="2", linkname="000001.jpg"),
            Entry("data/hard.cls", type="1", linkname="data/000001.cls"),
            Entry("data/fifo", type="6"),
        ]
    if not ustar:
        entries += [
            Entry(_VERY_LONG, rng.randbytes(600)),
            Entry("n" * 120 + "/", type="5"),
            Entry("n" * 120 + "/" + "日本" * 30 + ".cls", b"5"),
        ]
    entries.append(Entry("last.txt", b"the end\n"))
    return entries


def _tarfile_fixture(fmt: str, *, pax_headers: dict[str, str] | None = None):
    def build(path: Path) -> Path:
        entries = mixed_entries(ustar=fmt == "ustar")
        if fmt != "ustar":
            # > 100 byte link targets need GNU K / pax linkpath records.
            entries.insert(-1, Entry("data/longlink", type="2", linkname="t" * 150))
        return write_tar(path, entries, format=fmt, pax_headers=pax_headers)

    return build


def _gnutar_fixture(fmt: str):
    def build(path: Path) -> Path:
        entries = mixed_entries(ustar=fmt in ("ustar", "v7"))
        if fmt in ("gnu", "pax", "oldgnu"):  # > 100 byte link targets: GNU K / pax linkpath
            entries.insert(-1, Entry("data/longlink", type="2", linkname="t" * 150))
        if fmt == "v7":  # v7 has no prefix field: names must fit in 100 bytes; no fifos
            entries = [e for e in entries if len(os.fsencode(e.name)) < 100 and e.type != "6"]
        return write_gnu_tar(path, entries, format=fmt)

    return build


def _base256_fixture(path: Path) -> Path:
    """GNU format with base-256 numbers: a huge uid from tarfile, and a size patched to base-256."""
    data = b"x" * 1234
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, uid in (("a.bin", 2**40), ("b.bin", 0)):
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.mtime = len(data), uid, MTIME
            tar.addfile(info, io.BytesIO(data))
    raw = bytearray(buf.getvalue())
    second = 512 + 1536  # b.bin's header: after a.bin's header and its 3 data blocks
    raw[second + 124 : second + 136] = b"\x80" + len(data).to_bytes(11, "big")
    _fix_checksum(raw, second)
    Path(path).write_bytes(bytes(raw))
    return Path(path)


def _fix_checksum(raw: bytearray, header: int) -> None:
    block = raw[header : header + 512]
    block[148:156] = b" " * 8
    raw[header + 148 : header + 156] = b"%06o\0 " % sum(block)


def _sizes_fixture(fmt: str):
    def build(path: Path) -> Path:
        rng = random.Random(1)
        sizes = (0, 1, 511, 512, 513, 1023, 1024, 1025, 4096, 10240, 0)
        return write_tar(
            path, [(f"s/{i:03d}.bin", rng.randbytes(n)) for i, n in enumerate(sizes)], format=fmt
        )

    return build


def _empty_archive(path: Path) -> Path:
    with tarfile.open(path, "w"):
        pass
    return Path(path)


FIXTURES: dict[str, Callable[[Path], Path]] = {
    **{f"tarfile-{f}": _tarfile_fixture(f) for f in FORMATS},
    "tarfile-pax-global": _tarfile_fixture("pax", pax_headers={"comment": "wids fixture é"}),
    **{f"tarfile-{f}-sizes": _sizes_fixture(f) for f in FORMATS},
    "tarfile-gnu-base256": _base256_fixture,
    "tarfile-empty-archive": _empty_archive,
    **{f"gnutar-{f}": _gnutar_fixture(f) for f in GNU_TAR_FORMATS},
}


@pytest.fixture(params=sorted(FIXTURES))
def tar_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Each archive of :data:`FIXTURES`, written to a temporary file (GNU tar ones may skip)."""
    return FIXTURES[request.param](tmp_path / f"{request.param}.tar")
