"""Local copies of indexes for work without network: subsets and offline snapshots.

:func:`make_subset` copies some shards of an indexed dataset into a directory, in parallel,
and writes an index there whose shard URLs are the copies (relative paths) and whose member
tables are the original index's (no rescan). The subset then works with no network at all,
and a program moves to the full remote dataset by changing the index argument only::

    ShardListDataset("subset/train.json")                       # laptop, offline
    ShardListDataset("s3://bucket/train.json", cache_dir=...)   # the whole dataset

:func:`save_snapshot` / :func:`open_snapshot` keep a copy of a remote index's shard list
(absolute URLs, sizes, etags, components; no member tables) in the cache directory, so that
``offline=True`` works with the remote index's URL: shards come from the shard cache and their
member tables from scanning the cached copies.
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

__all__ = [
    "SubsetReport",
    "make_subset",
    "open_snapshot",
    "save_snapshot",
    "select_shards",
    "snapshot_path",
]

_SNAPSHOT = "wids-index-snapshot"


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
        if samples is None:
            raise ValueError("give shards or samples")
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


def snapshot_path(cache_dir: str | os.PathLike[str], url: str) -> str:
    """Where the snapshot of index ``url`` lives in ``cache_dir``."""
    from .cache import entry_key

    return os.path.join(os.fspath(cache_dir), "indexes", entry_key(url) + ".json")


def save_snapshot(
    reader: Any,
    url: str,
    cache_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
) -> str | None:
    """Keep a copy of the open index ``reader`` (read from ``url``) for offline use.

    Rewritten only when the remote index changed (its size/etag/mtime, one stat). Failures
    are logged, not raised: the snapshot is a convenience for later offline runs.

    Returns:
        The snapshot's path, or ``None`` if it could not be written.
    """
    import logging

    from .index_json import JsonIndexWriter
    from .remote import Source, redact_url

    path = snapshot_path(cache_dir, url)
    try:
        stat = Source(url, storage_options).info()
        ident = {
            "kind": _SNAPSHOT,
            "url": redact_url(url),
            "size": stat.size,
            "etag": stat.etag,
            "mtime": stat.mtime,
        }
        if os.path.exists(path) and _snapshot_ident(path) == ident:
            return path
        shards = list(reader.shards)
        with JsonIndexWriter(path, name=reader.name or None) as writer:
            for num, comp in enumerate(reader.components):
                if num > 0:
                    writer.start_component(comp.name or f"component{num}", comp.weight)
                for info in shards[comp.first_shard : comp.stop_shard]:
                    writer.add(info, None)
            writer.set_report(ident)
        return path
    except (OSError, ValueError) as e:
        logging.getLogger(__name__).warning(
            "could not save an offline copy of index %s: %s", redact_url(url), e
        )
        return None


def _snapshot_ident(path: str) -> dict[str, Any] | None:
    from .index_json import JsonIndex

    try:
        report = JsonIndex(path).report
    except (OSError, ValueError):
        return None
    return report if report.get("kind") == _SNAPSHOT else None


def open_snapshot(url: str, cache_dir: str | os.PathLike[str]) -> Any:
    """Open the offline copy of index ``url`` saved by :func:`save_snapshot`.

    Raises:
        OfflineError: There is none (the index was never opened online with this cache).
    """
    from .errors import OfflineError
    from .index_json import JsonIndex
    from .remote import redact_url

    path = snapshot_path(cache_dir, url)
    if not os.path.exists(path):
        raise OfflineError(
            f"offline, and no copy of this index in {os.fspath(cache_dir)} (open it online "
            f"once with this cache_dir, or use `wids subset`)",
            shard=redact_url(url),
        )
    return JsonIndex(path)
