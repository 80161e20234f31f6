"""Local subsets of a dataset, for development without network (``wids subset``).

:func:`make_subset` copies some shards of an indexed dataset into a directory, in parallel,
and writes an index there whose shard URLs are the copies (relative paths) and whose member
tables are the original index's (no rescan). The subset then works with no network at all,
and a program moves to the full remote dataset by changing the index argument only::

    ShardListDataset("subset/train.json")                       # laptop, offline
    ShardListDataset("s3://bucket/train.json", cache_dir=...)   # the whole dataset
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .errors import IndexMismatchError
from .index import ShardInfo
from .lock import TempFile

__all__ = ["SubsetReport", "make_subset", "select_shards"]


@dataclass(frozen=True, slots=True)
class SubsetReport:
    """What :func:`make_subset` did.

    Attributes:
        index: Path of the subset's index.
        shards: Shards in the subset.
        samples: Samples in the subset.
        bytes: Bytes of the copied shards.
        copied: Shards copied now (the others were already there, unchanged).
        seconds: Wall time.
    """

    index: str
    shards: int
    samples: int
    bytes: int
    copied: int
    seconds: float


def select_shards(
    lengths: list[int], *, shards: slice | None = None, samples: int | None = None
) -> list[int]:
    """Shard numbers of a subset: a slice of the shard list, or those holding ``samples``.

    With ``samples``, the first shards up to the one that holds sample ``samples - 1``.

    Raises:
        ValueError: Neither or both given, or the selection is empty.
    """
    if (shards is None) == (samples is None):
        raise ValueError("give exactly one of shards= or samples=")
    if shards is not None:
        chosen = list(range(len(lengths)))[shards]
    else:
        assert samples is not None
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        chosen, total = [], 0
        for k, n in enumerate(lengths):
            if total >= samples:
                break
            chosen.append(k)
            total += n
    if not chosen:
        raise ValueError("the selection names no shards")
    return chosen


def _local_names(urls: list[str]) -> list[str]:
    """File names for the copies: the basename, made unique with a hash where they clash."""
    bases = [u.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "shard.tar" for u in urls]
    bases = ["".join(c if c.isalnum() or c in "-_." else "_" for c in b).lstrip(".") for b in bases]
    seen: dict[str, int] = {}
    for b in bases:
        seen[b] = seen.get(b, 0) + 1
    out = []
    for u, b in zip(urls, bases, strict=True):
        if seen[b] > 1:
            b = f"{hashlib.sha256(u.encode()).hexdigest()[:12]}-{b}"
        out.append(b)
    return out


def _copy(
    info: ShardInfo,
    dest: str,
    storage_options: Mapping[str, Any],
    progress: Callable[[int], None],
) -> bool:
    """Copy one shard to ``dest`` (atomically, verified); ``False`` if already there."""
    from .cache import _md5_file
    from .remote import Source, redact_url

    if info.size is not None and os.path.exists(dest) and os.path.getsize(dest) == info.size:
        progress(info.size)
        return False
    src = Source(info.url, storage_options)
    with TempFile(os.path.dirname(dest), os.path.basename(dest)) as tmp:
        src.download(tmp.path, expected_size=info.size)
        if info.md5sum is not None:
            actual = _md5_file(tmp.path)
            if actual != info.md5sum.lower():
                raise IndexMismatchError(
                    f"md5 is {actual}, the index says {info.md5sum}", shard=redact_url(info.url)
                )
        progress(os.path.getsize(tmp.path))
        tmp.publish(dest)
    return True


def make_subset(
    index: str,
    to: str | os.PathLike[str],
    *,
    shards: slice | None = None,
    samples: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    jobs: int = 8,
    progress: bool = False,
) -> SubsetReport:
    """Copy some shards of ``index`` into directory ``to`` and write a matching index there.

    Args:
        index: Path or URL of the dataset's index (JSON or SQLite) or description.
        to: The subset's directory (created if missing). Shards already there with the
            recorded size are not copied again.
        shards: Which shards, as a slice of the shard list (``slice(0, 4)``).
        samples: Or: the shards that hold the first ``samples`` samples.
        storage_options: fsspec options for the index and the shards.
        jobs: Shards copied at once.
        progress: Show a progress bar (bytes) on stderr.

    Returns:
        What was done; ``index`` is the JSON index written into ``to``.

    Raises:
        ValueError: A bad selection.
        IndexMismatchError: A shard's size or md5 differs from the index.
    """
    from .index import open_index
    from .index_json import JsonIndexWriter

    t0 = time.monotonic()
    options = dict(storage_options or {})
    out_dir = os.path.abspath(os.fspath(to))
    os.makedirs(out_dir, exist_ok=True)
    idx = open_index(index, options)
    try:
        infos = list(idx.shards)
        chosen = select_shards([s.nsamples for s in infos], shards=shards, samples=samples)
        names = _local_names([infos[k].url for k in chosen])
        copied = _copy_all(infos, chosen, names, out_dir, options, jobs, progress)
        stem = os.path.basename(index.split("?", 1)[0].rstrip("/")) or "index"
        stem = stem.rsplit(".", 1)[0] if "." in stem else stem
        out = os.path.join(out_dir, f"{stem}.json")
        components = list(idx.components)
        with JsonIndexWriter(out, name=idx.name or None) as writer:
            for c_num, comp in enumerate(components):
                picked = [
                    (k, n)
                    for k, n in zip(chosen, names, strict=True)
                    if comp.first_shard <= k < comp.stop_shard
                ]
                if not picked:
                    continue
                if c_num > 0:
                    writer.start_component(comp.name or f"component{c_num}", comp.weight)
                for k, name in picked:
                    info = infos[k]
                    size = os.path.getsize(os.path.join(out_dir, name))
                    local = ShardInfo(name, info.nsamples, size=size, md5sum=info.md5sum)
                    writer.add(local, idx.members(k))
    finally:
        idx.close()
    return SubsetReport(
        index=out,
        shards=len(chosen),
        samples=sum(infos[k].nsamples for k in chosen),
        bytes=sum(os.path.getsize(os.path.join(out_dir, n)) for n in names),
        copied=copied,
        seconds=time.monotonic() - t0,
    )


def _copy_all(
    infos: list[ShardInfo],
    chosen: list[int],
    names: list[str],
    out_dir: str,
    options: Mapping[str, Any],
    jobs: int,
    progress: bool,
) -> int:
    import threading

    bar: Any = None
    if progress:
        from tqdm import tqdm

        total = sum(infos[k].size or 0 for k in chosen) or None
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="copying", leave=True)
    mutex = threading.Lock()

    def step(n: int) -> None:
        if bar is not None:
            with mutex:
                bar.update(n)

    try:
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            futures = [
                pool.submit(_copy, infos[k], os.path.join(out_dir, n), options, step)
                for k, n in zip(chosen, names, strict=True)
            ]
            return sum(f.result() for f in futures)
    finally:
        if bar is not None:
            bar.close()
