"""Building member-offset indexes: scan shards once, record every member's offset and size.

Each shard is scanned by :func:`wids.index.scan.scan_shard`:

- Local shards: headers only (``tar.scan_local_rows``), member data is never read; several
  shards are scanned at once in worker processes.
- Remote shards: one sequential streaming pass each (``Source.open_stream``), never a request
  per member and nothing written to local disk; shards are scanned in threads.
- Incremental: an existing index at the output path is reused for shards whose fingerprint
  (size and etag, or mtime) is unchanged and whose recorded member header is still in place
  (:func:`wids.index.fingerprint.unchanged`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardNotFoundError, WidsError
from ..samples import DuplicatePolicy
from ..storage import FileStat, IOStats, Source, Store, redact_url
from .fingerprint import unchanged
from .members import ShardMembers
from .model import IndexReader, ShardInfo
from .registry import create_index_writer, open_index
from .scan import scan_shard

__all__ = ["BuildReport", "build_index", "expand_shard_args"]

logger = logging.getLogger(__name__)


@dataclass
class BuildReport:
    """What a build did.

    Attributes:
        output: The index written.
        shards: Shards in the index.
        samples: Samples in the index.
        bytes: Total size of the indexed shards.
        scanned: Shards scanned in this run.
        reused: Shards taken unchanged from the existing index.
        bad: ``(url, error)`` of shards skipped with ``skip_bad``.
        skipped_members: Regular members that belong to no sample (no ``key.field`` name).
        bytes_read: Bytes read from remote shards while scanning.
        requests: Requests made to remote storage while scanning.
        seconds: Wall time of the build.
    """

    output: str
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    scanned: int = 0
    reused: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)
    skipped_members: int = 0
    bytes_read: int = 0
    requests: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The report as stored in the index (``report`` key)."""
        return {
            "shards": self.shards,
            "samples": self.samples,
            "bytes": self.bytes,
            "bad": [{"url": u, "error": e} for u, e in self.bad],
            "skipped_members": self.skipped_members,
        }


def expand_shard_args(args: Iterable[str]) -> list[str]:
    """Expand shard arguments: brace patterns, and ``@listfile`` (one shard per line).

    Example:
        >>> expand_shard_args(["s3://b/train-{000000..000002}.tar"])
        ['s3://b/train-000000.tar', 's3://b/train-000001.tar', 's3://b/train-000002.tar']
    """
    from .urls import expand_braces

    out: list[str] = []
    for arg in args:
        if arg.startswith("@"):
            with open(arg[1:], encoding="utf-8") as f:
                lines = [ln.strip() for ln in f]
            out += expand_shard_args(ln for ln in lines if ln and not ln.startswith("#"))
        else:
            out += expand_braces(arg)
    return out


def _scan_job(
    url: str, store: Store, duplicates: DuplicatePolicy
) -> tuple[FileStat, ShardMembers, int, int, int]:
    stats = IOStats()
    stat, members, skipped = scan_shard(store.source(url), duplicates=duplicates, stats=stats)
    return stat, members, skipped, stats.bytes_read, stats.requests


def _open_existing(output: str, store: Store) -> IndexReader | None:
    from ..storage import is_remote

    if not is_remote(output) and not os.path.exists(output):
        return None
    try:
        return open_index(output, store if is_remote(output) else None)
    except ShardNotFoundError:
        return None
    except (WidsError, OSError) as e:
        logger.warning("existing index %s is unreadable (%s); rebuilding it", redact_url(output), e)
        return None


def _executor(local: bool, jobs: int) -> cf.Executor:
    if local and jobs > 1 and sys.platform.startswith("linux"):
        # Header scans are CPU-bound Python: processes use both cores. fork starts in
        # milliseconds, which matters when a whole local build takes a fraction of a second.
        return cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"))
    return cf.ThreadPoolExecutor(jobs)


def build_index(
    shards: Sequence[str] | str,
    output: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    jobs: int | None = None,
    skip_bad: bool = False,
    duplicates: DuplicatePolicy = "error",
    incremental: bool = True,
    name: str | None = None,
    progress: bool | Callable[[int, int], None] = False,
) -> BuildReport:
    """Scan shards and write a member-offset index (JSON or SQLite, by ``output``'s suffix).

    Args:
        shards: Shard paths/URLs, brace patterns, or ``@listfile`` arguments.
        output: ``*.json`` or ``*.sqlite`` (also ``.sqlite3``, ``.db``): a local path or any
            writable fsspec URL (``s3://bucket/train.json``); a remote index is built in a
            temporary directory and uploaded, sidecars first and the description last.
        storage_options: fsspec options for remote shards (e.g. ``{"anon": True}``).
        jobs: Shards scanned at once (default: CPU count for local, 16 for remote).
        skip_bad: Record unreadable shards in the index's report and go on, instead of failing.
        duplicates: Policy for repeated keys or fields (``"error"``, ``"split"``,
            ``"keep_first"``).
        incremental: Reuse entries of an existing ``output`` whose shard is unchanged.
        name: Dataset name stored in the index.
        progress: ``True`` for a progress bar on stderr, or a callback ``(done, total)``.

    Returns:
        What was done.

    Raises:
        WidsError: The first bad shard, unless ``skip_bad`` (the error names the shard).
        LockTimeoutError: Another build of the same local ``output`` is running.
        DestinationError: ``output`` has an unknown suffix or a read-only scheme.
        OutputExistsError: ``output`` is one of the shards, a directory, or an existing file
            that is not an index (both checked before scanning).
        ValueError: No shards given.

    Example:
        >>> build_index("data/train-{000000..000031}.tar", "data/train.json")  # doctest: +SKIP
    """
    from .output import check_output, index_destination

    t0 = time.monotonic()
    urls = expand_shard_args([shards] if isinstance(shards, str) else shards)
    if not urls:
        raise ValueError("no shards given")
    store = Store.of(storage_options)
    check_output(output, urls, store)
    # Locked: two builders of one index would each publish, and delete the other's sidecars.
    with index_destination(output, store) as path:
        report = _build_locked(
            urls,
            path,
            output,
            store,
            jobs,
            skip_bad,
            duplicates,
            incremental,
            name,
            progress,
        )
    report.seconds = time.monotonic() - t0
    return report


def _build_locked(
    urls: list[str],
    output: str,
    dest: str,
    store: Store,
    jobs: int | None,
    skip_bad: bool,
    duplicates: DuplicatePolicy,
    incremental: bool,
    name: str | None,
    progress: bool | Callable[[int, int], None],
) -> BuildReport:
    from ..storage import output_dir

    out_dir = output_dir(dest)  # ``output`` is where the writer writes, ``dest`` where it goes
    report = BuildReport(output=dest)

    previous: dict[str, tuple[ShardInfo, ShardMembers]] = {}
    old = _open_existing(dest, store) if incremental else None
    local = all(Source(u).local_path is not None for u in urls)
    if old is not None:
        try:
            for i, info in enumerate(old.shards):
                members = old.members(i)
                if members is not None:
                    previous[info.url] = (info, members)
        finally:
            old.close()

    results: list[tuple[FileStat, ShardMembers] | None] = [None] * len(urls)
    todo = list(range(len(urls)))
    if previous:
        todo = _reuse(urls, store, previous, results, report)

    bar = _progress(progress, len(urls), done=len(urls) - len(todo))
    njobs = jobs or (os.cpu_count() or 1 if local else 16)
    with _executor(local, min(njobs, max(1, len(todo)))) as pool:
        futures = {pool.submit(_scan_job, urls[i], store, duplicates): i for i in todo}
        for fut in cf.as_completed(futures):
            i = futures[fut]
            try:
                stat, members, skipped, nread, nreq = fut.result()
            except WidsError as e:
                if not skip_bad:
                    for f in futures:
                        f.cancel()
                    raise
                logger.warning("skipping bad shard: %s", e)
                report.bad.append((redact_url(urls[i]), str(e)))
                bar(0)
            else:
                results[i] = (stat, members)
                report.scanned += 1
                report.skipped_members += skipped
                report.bytes_read += nread
                report.requests += nreq
                bar(len(members))

    _write(output, urls, results, out_dir, name, report)
    return report


def _reuse(
    urls: Sequence[str],
    store: Store,
    previous: Mapping[str, tuple[ShardInfo, ShardMembers]],
    results: list[tuple[FileStat, ShardMembers] | None],
    report: BuildReport,
) -> list[int]:
    """Fill ``results`` from the old index where the shard is unchanged; return the rest."""
    todo = []
    for i, url in enumerate(urls):
        src = store.source(url)
        local = src.local_path
        prev = previous.get(os.path.abspath(local) if local is not None else url)
        if prev is not None:
            try:
                stat = src.info()
                same = unchanged(prev[0].fingerprint, prev[1], stat, src.read_range)
            finally:
                src.close()
            if same:
                results[i] = (stat, prev[1])
                report.reused += 1
                continue
        todo.append(i)
    return todo


def _write(
    output: str,
    urls: Sequence[str],
    results: Sequence[tuple[FileStat, ShardMembers] | None],
    out_dir: str,
    name: str | None,
    report: BuildReport,
) -> None:
    from ..storage import stored_url

    writer = create_index_writer(output, name=name)
    try:
        for url, result in zip(urls, results, strict=True):
            if result is None:
                continue
            stat, members = result
            info = ShardInfo(
                url=stored_url(url, out_dir),
                nsamples=len(members),
                size=stat.size,
                etag=stat.etag,
                mtime=stat.mtime,
            )
            writer.add(info, members)
            report.shards += 1
            report.samples += len(members)
            report.bytes += stat.size
        writer.set_report(report.as_dict())
    except BaseException:
        writer.abort()
        raise
    writer.close()


def _progress(
    progress: bool | Callable[[int, int], None], total: int, done: int
) -> Callable[[int], None]:
    """A ``step(nsamples)`` callback driving a tqdm bar or the caller's callback."""
    if callable(progress):
        state = [done]

        def count(_n: int) -> None:
            state[0] += 1
            progress(state[0], total)

        return count
    if not progress:
        return lambda _n: None
    from tqdm import tqdm

    bar = tqdm(total=total, initial=done, unit="shard", desc="indexing", leave=True)
    t0, samples = time.monotonic(), [0]

    def step(n: int) -> None:
        samples[0] += n
        bar.update(1)
        bar.set_postfix(samples=samples[0], rate=f"{samples[0] / (time.monotonic() - t0):.0f}/s")
        if bar.n >= total:
            bar.close()

    return step
