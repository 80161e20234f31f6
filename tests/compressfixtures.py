"""Real compressed shards for the tests: gzip by GNU ``tar czf`` and by Python's ``tarfile``.

Members are partly compressible text and partly random bytes, so deflate writes Huffman
blocks whose boundaries fall at every bit position (seek points with ``bits`` 1-7) as well as
stored blocks; :func:`tar_oracle` is what ``tarfile`` reads from the same file.
"""

from __future__ import annotations

import gzip
import io
import os
import random
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tarfixtures import MTIME, require_gnu_tar

__all__ = ["compressible_samples", "gnu_tar_czf", "tar_oracle", "tarfile_gz"]


def compressible_samples(n: int, *, seed: int = 0, size: int = 6000) -> list[tuple[str, bytes]]:
    """``n`` samples of ``.txt`` (text, compressible), ``.bin`` (random) and ``.cls``."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(500)}" for _ in range(400)]
    out = []
    for i in range(n):
        key = f"s{i:06d}"
        text = " ".join(rng.choice(words) for _ in range(size // 5)).encode()[:size]
        out.append((key + ".txt", text))
        out.append((key + ".bin", rng.randbytes(rng.randrange(0, size))))
        out.append((key + ".cls", str(i % 7).encode()))
    return out


def tarfile_gz(path: str | os.PathLike[str], members: list[tuple[str, bytes]]) -> Path:
    """A ``.tar.gz`` written by Python's ``tarfile`` (``w:gz``)."""
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), MTIME
            tar.addfile(info, io.BytesIO(data))
    return Path(path)


def gnu_tar_czf(path: str | os.PathLike[str], members: list[tuple[str, bytes]]) -> Path:
    """A ``.tar.gz`` written by GNU ``tar czf`` (skips the test if GNU tar is missing)."""
    exe = require_gnu_tar()
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in members:
            Path(tmp, name).write_bytes(data)
        names = [name for name, _ in members]
        subprocess.run(
            [exe, "czf", os.path.abspath(path), "--format=gnu", f"--mtime=@{MTIME}",
             "--owner=0", "--group=0", "--numeric-owner", "-C", tmp, *names],
            check=True, capture_output=True,
        )  # fmt: skip
    return Path(path)


def tar_oracle(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every regular member's bytes, as ``tarfile`` reads the (compressed) file."""
    with tarfile.open(path, "r:*") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def gunzip(path: str | os.PathLike[str]) -> bytes:
    """The whole decompressed tar."""
    return gzip.decompress(Path(path).read_bytes())
