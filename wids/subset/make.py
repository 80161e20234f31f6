"""Making a subset: copy shards, verify each copy, write the subset's index.

:func:`make_subset` copies some shards of an indexed dataset into a directory, in parallel,
and writes an index there whose shard URLs are the copies (relative paths) and whose member
tables are the original index's (no rescan). The subset then works with no network at all,
and a program moves to the full remote dataset by changing the index argument only::

    ShardListDataset("subset/train.json")                       # laptop, offline
    ShardListDataset("s3://bucket/train.json", cache_dir=...)   # the whole dataset

A subset never deletes a file and never replaces one it did not create in this run: a
destination holding files of the names it writes is refused unless ``force``, the source index
and shards are never replaced, each copy is verified before it is published, and a failed run
removes what it created.

Offline snapshots of a remote index (``offline=True`` with the index's URL) live in the cache:
:mod:`wids.cache.snapshots`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import (
    CompressedDataError,
    ExclusionError,
    IndexFormatError,
    IndexMismatchError,
    OutputExistsError,
)
from ..index import IndexReader, ShardInfo, shard_getter, shard_sample_counts, shards_ending
from ..storage import Store, named_by, redact_url
from .destination import Plan, Run, check_destination, local_names, plan_paths

__all__ = [
    "SubsetReport",
    "make_subset",
    "select_shards",
]


@dataclass(frozen=True, slots=True)
class SubsetReport:
    """What :func:`make_subset` did.

    Attributes:
        index: Path of the subset's index.
        shards: Shards in the subset.
        samples: Samples in the subset.
        bytes: Bytes of the copied shards.
        copied: Shards copied now (every shard of the subset: none is reused from an earlier run).
        seconds: Wall time.
        excluded: Samples of the subset its index leaves out (``exclude``); ``samples``
            counts them too (they are in the copied shards).
    """

    index: str
    shards: int
    samples: int
    bytes: int
    copied: int
    seconds: float
    excluded: int = 0


def select_shards(
    lengths: Sequence[int] | np.ndarray, *, shards: slice | None = None, samples: int | None = None
) -> list[int]:
    """Shard numbers of a subset: a slice of the shard list, or those holding ``samples``.

    With ``samples``, the first shards up to the one that holds sample ``samples - 1``.
    ``lengths`` may be an index's sample-count column: nothing per shard is built here.

    Raises:
        ValueError: Neither or both given, or the selection is empty.
    """
    if (shards is None) == (samples is None):
        raise ValueError("give exactly one of shards= or samples=")
    if shards is not None:
        chosen = list(range(len(lengths))[shards])
    else:
        if samples is None:
            raise ValueError("give shards or samples")
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        # shard k is taken while the samples before it are fewer than asked for
        before = np.cumsum(np.asarray(lengths, dtype=np.int64)) - np.asarray(lengths)
        chosen = list(range(int(np.searchsorted(before, samples, side="left"))))
    if not chosen:
        raise ValueError("the selection names no shards")
    return chosen


def _check_copy(path: str, info: ShardInfo, stat: Any, members: Any) -> None:
    """Refuse a downloaded copy whose fingerprint, md5 or member headers differ from the index."""
    from ..cache import md5_file
    from ..index import Fingerprint
    from ..tar import header_mismatch

    name = redact_url(info.url)
    md5 = md5_file(path) if info.md5sum is not None else None
    problem = info.fingerprint.mismatch(Fingerprint(stat.size, stat.etag, stat.mtime, md5))
    if problem is not None:
        raise IndexMismatchError(f"the copy is not the indexed shard: {problem}", shard=name)
    if members is None or len(members) == 0:
        return
    with open(path, "rb") as f:

        def read(start: int, end: int) -> bytes:
            f.seek(start)
            return f.read(end - start)

        if members.seek is not None:  # compressed: headers are in the decoded tar
            from ..compress import tar_reader

            read = tar_reader(members.seek, read)  # type: ignore[assignment]
            if read is None:
                return  # no seek points: the fingerprint (and md5) above are the check
        for sample in {0, len(members) - 1}:
            fields = members.members(sample)
            for field, offset, size in (fields[0], fields[-1]):
                member = members.key(sample) + field
                try:
                    header = read(offset - 512, offset) if offset >= 512 else b""
                except CompressedDataError as e:  # codecs name no shard: they do no I/O
                    raise e.for_shard(name) from None
                except IndexFormatError as e:  # a seek point's stored window
                    raise IndexFormatError(e.message, shard=e.shard or name) from None
                problem = header_mismatch(header, member, size)
                if problem is not None:
                    raise IndexMismatchError(
                        f"the copy is not the indexed shard: at member {member!r} (byte "
                        f"{offset - 512}) there is {problem}",
                        shard=name,
                    )


def _fetch(info: ShardInfo, members: Any, path: str, store: Store) -> int:
    """Download one shard to ``path`` (a staging file), verify it and flush it; its size.

    Runs on the executor: the staging directory must be one the executor's workers share.
    """
    src = store.source(info.url)
    try:
        stat = src.download(path, expected_size=info.size)
        try:
            _check_copy(path, info, stat, members)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        return stat.size
    finally:
        src.close()


def make_subset(
    index: str,
    to: str | os.PathLike[str],
    *,
    shards: slice | None = None,
    samples: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    jobs: int = 8,
    progress: bool = False,
    force: bool = False,
    allow_local_shards: bool = False,
    executor: Executor | None = None,
    exclude: Any = None,
    exclude_strict: bool = False,
    where: str | None = None,
) -> SubsetReport:
    """Copy some shards of ``index`` into directory ``to`` and write a matching index there.

    Nothing in ``to`` is ever deleted, and no file is replaced unless ``force``: the
    destination must not already hold a file of a name the subset writes (its index
    ``<name>.json`` and member tables ``<name>.members/*.json``, or ``<name>.widx`` /
    ``<name>.sqlite`` for such a source, shard copies). The source index,
    its member tables and local source shards are never replaced, even with ``force``. Each
    copy is checked (size, etag and md5 where the index records them, and the tar headers of
    recorded members) before it is published atomically. If anything fails, the files and
    directories this call created are removed again.

    Args:
        index: Path or URL of the dataset's index (JSON or SQLite) or description.
        to: The subset's directory, local (created after the index was opened, if missing).
        shards: Which shards, as a slice of the shard list (``slice(0, 4)``).
        samples: Or: the shards that hold the first ``samples`` samples.
        storage_options: fsspec options for the index and the shards.
        jobs: Shards copied at once.
        progress: Show a progress bar (bytes) on stderr.
        force: Replace files of the names the subset writes (every shard is copied again).
            Other files in ``to`` are still left alone.
        allow_local_shards: Let an index read from a remote location name local files (by
            default refused with ``IndexFormatError``: a crafted index must not make the
            subset copy the user's files).
        executor: Where shards are downloaded and verified (e.g. a Dask cluster's
            ``distributed.Client.get_executor()``); its workers must share ``to``'s
            filesystem (each writes into a staging directory there). Default: ``jobs``
            threads here.
        exclude: Samples the subset's index leaves out, as ``ShardListDataset(exclude=...)``
            takes them (sample numbers are the source's). Written beside the index as
            ``<index>.exclude`` (``shard<TAB>key`` lines naming the copies), which opening
            that index applies; shards are copied whole. Bare keys are looked up in the
            chosen shards only; entries naming no sample of the subset are ignored with a
            warning (refused with ``exclude_strict``).
        exclude_strict: Refuse entries that name no sample of the subset.
        where: A filter over the index's metadata columns (``"width >= 256"``,
            ``docs/columns.md``): the chosen shards' samples it does not hold for are
            excluded as ``exclude`` excludes (added to it).

    Returns:
        What was done; ``index`` is the index written into ``to``, in the source's format
        (``.widx``, SQLite, else JSON).

    Raises:
        ValueError: A bad selection, or ``to`` is not a local directory.
        OutputExistsError: ``to`` holds files of the subset's names (without ``force``) or
            is part of the source dataset.
        IndexMismatchError: A shard's size, etag, md5 or member headers differ from the index.
    """
    from ..index import open_index

    t0 = time.monotonic()
    store = Store.of(storage_options, named=named_by(index))
    target = os.fspath(to)
    if "://" in target and not target.startswith("file://"):
        raise ValueError(f"the subset's directory must be local, got {redact_url(target)}")
    out_dir = os.path.abspath(os.path.expanduser(target.removeprefix("file://")))
    idx = open_index(index, store, allow_local_shards=allow_local_shards)
    try:
        chosen = select_shards(shard_sample_counts(idx), shards=shards, samples=samples)
        get = shard_getter(idx)
        infos = {k: get(k) for k in chosen}  # only the chosen shards' records
        names = local_names([infos[k].url for k in chosen])
        tables = [idx.members(k) for k in chosen]
        plan = plan_paths(out_dir, index, names, tables)
        check_destination(plan, index, [infos[k].url for k in chosen], force)
        sidecar = plan.index + ".exclude"
        if os.path.lexists(sidecar) and not force:
            raise OutputExistsError(f"{sidecar} exists (pass force to replace it)")
        exclude = _with_source_exclusion(index, idx, chosen, exclude, exclude_strict)
        if where is not None:
            exclude = _with_where(idx, chosen, where, exclude, exclude_strict)
        lines = _excluded_lines(idx, chosen, names, tables, exclude, exclude_strict)
        run = Run(force)
        try:
            run.makedirs(out_dir)
            picked = [(infos[k], t, d) for k, t, d in zip(chosen, tables, plan.shards, strict=True)]
            pool = executor or ThreadPoolExecutor(max(1, jobs))
            try:
                _copy_all(picked, store, run, progress, pool)
            finally:
                if executor is None:
                    pool.shutdown(wait=True)
            _write_index(plan, idx, chosen, [infos[k] for k in chosen], names, tables, run)
            if lines or os.path.lexists(sidecar):  # an old one must not apply to this index
                _write_exclusion(sidecar, lines, run)
        except BaseException:
            run.undo()
            raise
        run.finish()
    finally:
        idx.close()
    return SubsetReport(
        index=plan.index,
        shards=len(chosen),
        samples=sum(infos[k].nsamples for k in chosen),
        bytes=sum(os.path.getsize(p) for p in plan.shards),
        copied=len(chosen),
        seconds=time.monotonic() - t0,
        excluded=len(lines),
    )


def _with_source_exclusion(
    index: Any, idx: IndexReader, chosen: list[int], exclude: Any, strict: bool
) -> Any:
    """``exclude`` and what the source index's own exclusion file leaves out of ``chosen``.

    A local index ``P`` opens with ``P.exclude`` (``wids subset --exclude`` wrote it): a
    subset of it must leave out the same samples, or a subset of a subset brings back what
    was taken down. Only the chosen shards' samples are taken from it.
    """
    import dataclasses

    from ..dataset import index_exclusion, parse_exclude

    numbers = index_exclusion(index, idx)  # as opening the index applies it
    if numbers is None:
        return exclude
    counts = np.asarray(shard_sample_counts(idx), dtype=np.int64)
    starts = np.cumsum(counts)
    inside = np.isin(np.searchsorted(starts, numbers, side="right"), chosen)
    numbers = numbers[inside]
    spec = parse_exclude(exclude, strict=strict)
    if spec is None:
        return numbers if len(numbers) else None
    merged = np.union1d(spec.samples, numbers).astype(np.int64)
    return dataclasses.replace(spec, samples=merged)


def _with_where(idx: IndexReader, chosen: list[int], where: str, exclude: Any, strict: bool) -> Any:
    """``exclude`` and the samples of the chosen shards ``where`` leaves out."""
    import dataclasses

    from ..dataset import parse_exclude
    from ..dataset.columns import where_in_index

    numbers = where_in_index(idx, chosen, where)
    spec = parse_exclude(exclude, strict=strict)
    if spec is None:
        return numbers
    merged = np.union1d(spec.samples, numbers).astype(np.int64)
    return dataclasses.replace(spec, samples=merged)


def _excluded_lines(
    idx: IndexReader,
    chosen: list[int],
    names: list[str],
    tables: list[Any],
    exclude: Any,
    strict: bool,
) -> list[str]:
    """The subset's exclusion as ``copy<TAB>key`` lines, in subset order."""
    if exclude is None:
        return []
    import warnings

    from ..dataset import pair_parts, parse_exclude, resolve

    spec = parse_exclude(exclude, strict=strict)
    if spec is None:
        return []
    counts = np.asarray(shard_sample_counts(idx), dtype=np.int64)
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    get = shard_getter(idx)
    pos = {k: p for p, k in enumerate(chosen)}

    def table(k: int) -> Any:
        got = tables[pos[k]] if k in pos else idx.members(k)
        if got is None:
            raise ExclusionError(
                "the index records no member tables: exclude by key needs them "
                "(wids index create records them)"
            )
        return got

    among = shards_ending(idx, pair_parts(spec)) if spec.pairs else None  # not every shard
    excluded, unknown = resolve(
        spec, starts, lambda k: str(get(k).url), table, shards=chosen, among=among
    )
    shard_of = np.searchsorted(starts[1:], excluded, side="right")
    lines = []
    for g, k in zip(excluded.tolist(), shard_of.tolist(), strict=True):
        if k in pos:
            p = pos[k]
            lines.append(f"{names[p]}\t{table(k).key(g - int(starts[k]))}")
    outside = len(excluded) - len(lines)
    if strict and outside:
        raise ExclusionError(f"exclude: {outside} entries name samples outside the subset")
    if unknown or outside:
        warnings.warn(
            f"exclude: {unknown + outside} of {len(spec)} entries name no sample of the subset "
            "(ignored; exclude_strict refuses them)",
            stacklevel=3,
        )
    return lines


def _write_exclusion(path: str, lines: list[str], run: Run) -> None:
    """Publish the exclusion file beside the subset's index (atomically, undone on failure)."""
    from ..dataset import EXCLUDE_HEADER

    staged = os.path.join(run.staging(os.path.dirname(path)), os.path.basename(path))
    with open(staged, "w", encoding="utf-8", newline="\n") as f:
        f.write(EXCLUDE_HEADER + " (written by wids subset: shard<TAB>key per line)\n")
        f.writelines(line + "\n" for line in lines)
    run.place(staged, path)


def _write_index(
    plan: Plan,
    idx: IndexReader,
    chosen: list[int],
    records: list[ShardInfo],
    names: list[str],
    tables: list[Any],
    run: Run,
) -> None:
    """Write the subset's index in a staging directory, then publish sidecars, then the index."""
    from ..index import create_index_writer

    staging = run.staging(plan.out_dir)
    staged_index = os.path.join(staging, os.path.basename(plan.index))
    with create_index_writer(staged_index, name=idx.name or None) as writer:
        for c_num, comp in enumerate(idx.components):
            picked = [j for j, k in enumerate(chosen) if comp.first_shard <= k < comp.stop_shard]
            if not picked:
                continue
            if c_num > 0:
                writer.start_component(comp.name or f"component{c_num}", comp.weight)
            for j in picked:
                info = records[j]
                st = os.stat(plan.shards[j])
                local = ShardInfo(
                    names[j], info.nsamples, size=st.st_size, mtime=st.st_mtime, md5sum=info.md5sum
                )
                writer.add(local, tables[j], idx.shard_extra(chosen[j]) or None)  # columns
    staged: str = getattr(writer, "members_dir", "")  # a JSON index's sidecars
    written = sorted(os.listdir(staged)) if staged and os.path.isdir(staged) else []
    if written:
        run.makedirs(plan.members_dir)
    for name in written:  # what the writer wrote; the plan's names were for the early check
        run.place(os.path.join(staged, name), os.path.join(plan.members_dir, name))
    run.place(staged_index, plan.index)


def _copy_all(
    picked: list[tuple[ShardInfo, Any, str]],
    store: Store,
    run: Run,
    progress: bool,
    pool: Executor,
) -> None:
    bar: Any = None
    if progress:
        from tqdm import tqdm

        total = sum(info.size or 0 for info, _, _ in picked) or None
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="copying", leave=True)
    staging = run.staging(os.path.dirname(picked[0][2]))
    futures: dict[Future[int], tuple[str, str]] = {}
    try:
        for k, (info, table, dest) in enumerate(picked):
            staged = os.path.join(staging, f"{k}-{os.path.basename(dest)}")
            futures[pool.submit(_fetch, info, table, staged, store)] = (staged, dest)
        for fut in as_completed(futures):
            size = fut.result()  # the first failure: stop the rest, then undo what was published
            run.place(*futures[fut])
            if bar is not None:
                bar.update(size)
    finally:
        pending = [f for f in futures if not f.cancel()]
        wait(pending)  # nothing still writing into the staging directory once this returns
        if bar is not None:
            bar.close()
