"""Building member-offset indexes: scan shards once, record every member's offset and size.

Each shard is scanned by :func:`wids.index.scan.scan_shard`:

- Local shards: headers only (``tar.scan_local_rows``), member data is never read; several
  shards are scanned at once in worker processes.
- Remote shards: one sequential streaming pass each (``Source.open_stream``), never a request
  per member and nothing written to local disk; shards are scanned in threads.
- On a given executor (``executor=``, e.g. a Dask cluster's): the jobs of :mod:`.jobs`; for a
  JSON index each writes its shard's sidecar at its final place and keeps one that still
  matches, so a rerun after a crash scans only the shards that were lost.
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
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardNotFoundError, WidsError
from ..samples import DuplicatePolicy
from ..storage import Source, Store, redact_url
from .fingerprint import unchanged
from .jobs import JobResult, ShardJob, run_job
from .jsonformat import members_dir, sidecar_name
from .jsonwriter import JsonIndexWriter
from .members import ShardMembers
from .model import IndexReader, ShardInfo
from .registry import create_index_writer, open_index, writer_for
from .scancompressed import DEFAULT_SPACING

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


def expand_shard_args(
    args: Iterable[str], storage_options: Store | Mapping[str, Any] | None = None
) -> list[str]:
    """Expand shard arguments: brace patterns, wildcards, ``@listfile`` (one per line), indexes.

    Braces expand first, then each result's wildcards (``*``, ``?``, ``[...]``, on any
    filesystem: ``s3://bucket/train-*.tar``), whose matches come in natural order
    (``train-2`` before ``train-10``; :func:`wids.storage.expand_glob`). A local index named
    as it is (JSON, SQLite or ``.widx``, by its first bytes; a reference description too)
    stands for the shards it lists.

    Args:
        args: Paths/URLs, patterns, ``@listfile`` names.
        storage_options: fsspec options for listing remote wildcards.

    Raises:
        ShardNotFoundError: A wildcard matches nothing.

    Example:
        >>> expand_shard_args(["s3://b/train-{000000..000002}.tar"])
        ['s3://b/train-000000.tar', 's3://b/train-000001.tar', 's3://b/train-000002.tar']
    """
    from ..storage import expand_glob
    from .urls import expand_braces

    store = Store.of(storage_options)
    out: list[str] = []
    for arg in args:
        if arg.startswith("@"):
            with open(arg[1:], encoding="utf-8") as f:
                lines = [ln.strip() for ln in f]
            out += expand_shard_args((ln for ln in lines if ln and not ln.startswith("#")), store)
        elif _names_an_index(arg):  # named as it is: a wildcard matching one is no shard
            out += _listed_shards(arg, store)
        else:
            for url in expand_braces(arg):
                out += expand_glob(url, store)
    return out


def _names_an_index(url: str) -> bool:
    """Whether ``url`` is a local index: by its name, then its first bytes.

    The bytes decide: a shard may be named ``*.json`` too.
    """
    from ..storage import is_local, local_file
    from .recognise import HEAD_BYTES, is_index_head
    from .registry import INDEX_SUFFIXES

    if not url.lower().endswith(INDEX_SUFFIXES) or not is_local(url):
        return False
    if not os.path.isfile(local_file(url)):
        return False
    with open(local_file(url), "rb") as f:
        head = f.read(HEAD_BYTES)
    return any(is_index_head(head, kind) for kind in ("json", "sqlite", "table"))


def _listed_shards(index: str, store: Store) -> list[str]:
    """The shards an index lists, where it stands among shard arguments.

    ``wids index create old.json -o train.json`` gives a reference description (no member
    offsets) its member tables; a remote index naming local files is refused as anywhere.
    Only the shards are taken, as one list: not the name, nor the sub-datasets.
    """
    from .registry import open_index

    return [info.url for info in open_index(index, store).shards]


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
    executor: cf.Executor | None = None,
    md5: bool = True,
    columns: Sequence[str] | None = None,
    seek_spacing: int = DEFAULT_SPACING,
) -> BuildReport:
    """Scan shards and write a member-offset index (JSON or SQLite, by ``output``'s suffix).

    Args:
        shards: Shard paths/URLs, brace patterns, wildcards (``s3://b/train-*.tar``, in
            natural order), or ``@listfile`` arguments.
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
        executor: Where shards are scanned, e.g. a Dask cluster's
            ``distributed.Client.get_executor()``; by default processes (local shards) or
            threads (remote) of this machine, ``jobs`` at once. With an executor, each job of
            a JSON index writes its shard's member sidecar straight to its final place (which
            the executor's workers must be able to write: a shared path or a URL), so a crash
            loses at most the shards in flight, and an incremental rerun keeps every sidecar
            whose shard is unchanged; the description is written last, here. A SQLite index
            is written whole here (the jobs return member tables). What jobs carry must
            pickle: shard URLs and the storage options.
        md5: Record each local shard's MD5 (``md5sum``, as the reference's ``widsindex``
            does), so a copy with new timestamps (``cp -r``) is told from a rewrite of the
            same size; it reads every byte, where the scan reads only headers. ``False``
            skips it. Remote shards record their store's MD5 when it gives one (GCS).
        columns: Sample metadata columns to collect into the index (``"json:width"``,
            ``"size:.jpg"``, ``"has:.txt"``, ``"NAME=json:a.b"``; ``docs/columns.md``), after
            the scan, for every shard (also the ones an incremental build kept). A local
            ``output`` only.
        seek_spacing: ``.tar.gz`` shards: uncompressed bytes between seek points (1 MiB: a
            random read decodes half of that more than it needs, on average; the points
            cost about 32 KiB each in the index). Compressed shards are recognised by their
            first bytes and need a JSON index (docs/compressed.md).

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
    store = Store.of(storage_options)
    specs = _column_specs(columns, output)  # checked before anything is read
    urls = expand_shard_args([shards] if isinstance(shards, str) else shards, store)
    if not urls:
        raise ValueError("no shards given")
    check_output(output, urls, store)
    if not specs:
        from .colcollect import warn_if_dropped

        warn_if_dropped(output, "this build collects none")
    placed: set[str] = set()  # sidecars written at their remote place by the jobs
    # Locked: two builders of one index would each publish, and delete the other's sidecars.
    with index_destination(output, store, placed) as path:
        report = _build_locked(
            urls,
            path,
            output,
            store,
            _Options(
                jobs,
                skip_bad,
                duplicates,
                incremental,
                name,
                progress,
                executor,
                md5,
                seek_spacing,
            ),
            placed,
        )
        if specs:
            from .colcollect import add_columns_locked

            add_columns_locked(path, specs, store)
    report.seconds = time.monotonic() - t0
    return report


def _column_specs(columns: Sequence[str] | None, output: str) -> list[Any]:
    """The checked column specs, before anything is scanned (a local ``output`` only)."""
    if not columns:
        return []
    from ..errors import ColumnError
    from ..storage import is_remote
    from .columns import parse_specs

    if is_remote(output):
        raise ColumnError(f"{redact_url(output)}: columns are collected into a local index")
    return parse_specs(columns)


@dataclass(frozen=True)
class _Options:
    jobs: int | None
    skip_bad: bool
    duplicates: DuplicatePolicy
    incremental: bool
    name: str | None
    progress: bool | Callable[[int, int], None]
    executor: cf.Executor | None
    md5: bool = True
    seek_spacing: int = DEFAULT_SPACING


def _build_locked(
    urls: list[str],
    output: str,
    dest: str,
    store: Store,
    opts: _Options,
    placed: set[str],
) -> BuildReport:
    from ..storage import is_remote, output_dir, stored_url

    out_dir = output_dir(dest)  # ``output`` is where the writer writes, ``dest`` where it goes
    report = BuildReport(output=dest)
    # Jobs write JSON sidecars where they finally go, and check them there: on a given
    # executor (whose workers may be other machines), and for a local index (the encoding is
    # then spread over the processes that scan). A remote index built here is uploaded whole.
    sidecars = writer_for(output) is JsonIndexWriter and (
        opts.executor is not None or not is_remote(dest)
    )
    stored = [stored_url(u, out_dir) for u in urls]
    build = uuid.uuid4().hex
    where = members_dir(dest if is_remote(dest) else output)
    job_list = [
        ShardJob(
            url,
            st,
            f"{where}/{sidecar_name(st)}" if sidecars else None,
            opts.duplicates,
            opts.incremental,
            build,
            opts.md5,
            opts.seek_spacing,
        )
        for url, st in zip(urls, stored, strict=True)
    ]

    previous: dict[str, tuple[ShardInfo, ShardMembers]] = {}
    old = _open_existing(dest, store) if opts.incremental and not sidecars else None
    local = all(Source(u).local_path is not None for u in urls)
    if old is not None:
        try:
            for i, info in enumerate(old.shards):
                members = old.members(i)
                if members is not None:
                    previous[info.url] = (info, members)
        finally:
            old.close()

    results: list[JobResult | None] = [None] * len(urls)
    todo = list(range(len(urls)))
    if previous:
        todo = _reuse(urls, stored, store, previous, results, report, opts.md5)

    bar = _progress(opts.progress, len(urls), done=len(urls) - len(todo))
    # A local sidecar folder this run creates is its own to remove if the build fails (one that
    # was there holds an index's or an interrupted build's sidecars: kept). An interrupted
    # build (Ctrl-C) and one on a given executor, whose jobs may still be running elsewhere,
    # keep their sidecars for a rerun.
    fresh = sidecars and opts.executor is None and not is_remote(dest)
    fresh = fresh and not os.path.exists(where)
    try:
        if opts.executor is not None:
            _run(opts.executor, job_list, todo, store, results, report, opts.skip_bad, bar)
        else:
            njobs = opts.jobs or (os.cpu_count() or 1 if local else 16)
            with _executor(local, min(njobs, max(1, len(todo)))) as pool:
                _run(pool, job_list, todo, store, results, report, opts.skip_bad, bar)
        if sidecars:
            placed.update(sidecar_name(r.info.url) for r in results if r is not None)
        _write(output, results, opts.name, report)
    except Exception:
        if fresh:
            _remove_sidecars(where, [sidecar_name(st) for st in stored])
        raise
    return report


def _remove_sidecars(folder: str, names: Sequence[str]) -> None:
    """Remove this build's sidecars from the folder it created, then the folder if empty."""
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass
    try:
        os.rmdir(folder)
    except FileNotFoundError:  # no job got as far as writing a sidecar
        pass
    except OSError:  # not empty (a file that is not ours): left as it is
        logger.warning("left %s: it holds files this build did not write", folder)


def _run(
    pool: cf.Executor,
    jobs: Sequence[ShardJob],
    todo: Sequence[int],
    store: Store,
    results: list[JobResult | None],
    report: BuildReport,
    skip_bad: bool,
    bar: Callable[[int], None],
) -> None:
    """Run the jobs ``todo`` on ``pool``, filling ``results`` and ``report`` as they finish."""
    futures = {pool.submit(run_job, jobs[i], store): i for i in todo}
    try:
        for fut in cf.as_completed(futures):
            i = futures[fut]
            try:
                result = fut.result()
            except WidsError as e:
                if not skip_bad:
                    raise
                logger.warning("skipping bad shard: %s", e)
                report.bad.append((redact_url(jobs[i].url), str(e)))
                bar(0)
                continue
            results[i] = result
            if result.scanned:
                report.scanned += 1
            else:
                report.reused += 1
            report.skipped_members += result.skipped
            report.bytes_read += result.bytes_read
            report.requests += result.requests
            bar(result.info.nsamples)
    except BaseException:
        # Jobs already running finish (their sidecars are kept for a rerun); wait for them,
        # so that nothing is still writing once this raises. (A Dask executor's futures
        # always cancel: its workers may finish a running job after this.)
        cf.wait([f for f in futures if not f.cancel()])
        raise


def _reuse(
    urls: Sequence[str],
    stored: Sequence[str],
    store: Store,
    previous: Mapping[str, tuple[ShardInfo, ShardMembers]],
    results: list[JobResult | None],
    report: BuildReport,
    md5: bool,
) -> list[int]:
    """Fill ``results`` from the old index where the shard is unchanged; return the rest.

    A local shard the old index records no MD5 for is scanned again when ``md5`` is wanted.
    """
    todo = []
    for i, url in enumerate(urls):
        src = store.source(url)
        local = src.local_path
        prev = previous.get(os.path.abspath(local) if local is not None else url)
        if prev is not None and (prev[0].md5sum is not None or local is None or not md5):
            try:
                stat = src.info()
                same = unchanged(prev[0].fingerprint, prev[1], stat, src.read_range)
            finally:
                src.close()
            if same:
                info = ShardInfo(
                    stored[i], len(prev[1]), stat.size, stat.etag, stat.mtime, prev[0].md5sum
                )
                results[i] = JobResult(info, prev[1], False)
                report.reused += 1
                continue
        todo.append(i)
    return todo


def _write(
    output: str,
    results: Sequence[JobResult | None],
    name: str | None,
    report: BuildReport,
) -> None:
    writer = create_index_writer(output, name=name)
    try:
        for result in results:
            if result is None:
                continue
            info = result.info
            if result.members is None:  # a JSON sidecar the job wrote at its final place
                if not isinstance(writer, JsonIndexWriter):
                    raise TypeError(f"{type(writer).__name__} cannot take a written sidecar")
                writer.add_written(info, result.tar_size)
            else:
                writer.add(info, result.members)
            report.shards += 1
            report.samples += info.nsamples
            report.bytes += info.size or 0
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
