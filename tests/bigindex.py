"""A large shard-table index (``*.widx``) for tests of tools that must not touch every shard.

Shard ``k`` is ``s-<k>.tar`` beside the index. Only the shards passed as ``real`` exist on
disk (real tars); planning and counting never open the others. The first and last ``ends``
shards, and the real ones, have a member table (the real tar's); the others have none.
(``same=True``: every shard is the one real tar, so a verification finds them all.)
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from wids.index import ShardInfo, TableIndexWriter, scan_shard
from wids.storage import Source

SAMPLES = 4


def shard_name(k: int) -> str:
    return f"s-{k:07d}.tar"


def write_tar(path: Path) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for j in range(SAMPLES):
            for ext, data in ((".cls", str(j).encode()), (".txt", b"x" * (j + 1))):
                info = tarfile.TarInfo(f"{j:06d}{ext}")
                info.size, info.mtime = len(data), 0
                tf.addfile(info, io.BytesIO(data))


def write_big_index(
    path: Path,
    n: int,
    *,
    real: tuple[int, ...] = (),
    ends: int = 5,
    name: str = "big",
    same: bool = False,
) -> Path:
    """Write the index of ``n`` shards at ``path``; the shards in ``real`` exist.

    With ``same``, every shard is the one real tar ``s-0000000.tar`` (so all of them exist).
    """
    if same:
        real = (0,)
    d = path.parent
    d.mkdir(parents=True, exist_ok=True)
    proto = d / "proto.tar"
    write_tar(proto)
    stat, members, _ = scan_shard(Source(str(proto)))
    for k in real:
        write_tar(d / shard_name(k))
    os.unlink(proto)
    size = stat.size
    with_table = {*range(min(ends, n)), *range(max(0, n - ends), n), *real}

    def info(k: int) -> ShardInfo:
        return ShardInfo(shard_name(0 if same else k), SAMPLES, size)

    with TableIndexWriter(path, name=name) as w:
        k = 0
        while k < n:
            if k in with_table:
                w.add(info(k), members)
                k += 1
                continue
            stop = min([j for j in with_table if j > k] + [n])
            w.add_many([info(j) for j in range(k, stop)])
            k = stop
    return path
