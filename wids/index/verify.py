"""Verifying an index against its shards: fingerprints, a recorded header, or a rescan.

Each shard's check is a job (:func:`verify_shard`) that pickles, so it runs on any
``concurrent.futures`` executor, a Dask cluster's included; member tables are loaded (and a
damaged one reported) here, where the index is open.
"""

from __future__ import annotations

import concurrent.futures as cf
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..compress import tar_reader
from ..errors import RangeNotSupportedError, ShortReadError, WidsError
from ..storage import FileStat, RangeFallbackWarning, Source, Store, named_by, redact_url
from .access import count_shards, shard_getter
from .contents import ContentMemo, file_md5, index_digests_dir, settle
from .fingerprint import header_mismatch_at_spot
from .members import ShardMembers
from .model import ShardInfo
from .registry import open_index
from .scan import scan_shard

__all__ = ["ShardProblem", "check_shard", "verify_index", "verify_shard"]

_IN_FLIGHT = 256
"""Shards checked at once on an executor (a Dask cluster of many workers stays busy)."""


@dataclass(frozen=True, slots=True)
class ShardProblem:
    """One shard that does not match its index.

    Attributes:
        url: The shard (credentials removed).
        kind: ``"DAMAGED"`` (its member table cannot be read), ``"MISSING"`` (no shard where
            the index says) or ``"CHANGED"`` (the shard); for a note on a shard that matches,
            ``"COPY"``.
        message: What is wrong.
    """

    url: str
    kind: str
    message: str


def verify_shard(
    info: ShardInfo, members: ShardMembers | None, store: Store, deep: bool = False
) -> str | None:
    """What is wrong with one shard against its index entry and member table, if anything.

    Args:
        info: The shard's entry.
        members: Its member table, if the index has one.
        store: Storage options for the shard.
        deep: Rescan the shard and compare every offset.
    """
    return check_shard(info, members, store, deep)[0]


def check_shard(
    info: ShardInfo,
    members: ShardMembers | None,
    store: Store,
    deep: bool = False,
    memo: ContentMemo | None = None,
) -> tuple[str | None, str | None, str]:
    """:func:`verify_shard`, and a note on a shard that matches: ``(problem, note, kind)``.

    ``kind`` is the problem's (:class:`ShardProblem`): ``"MISSING"`` where no file answers,
    else ``"CHANGED"``.

    A local shard of the recorded size and MD5 but another modification time is a copy (its
    bytes are read once to tell, see :mod:`wids.index.contents`): no problem, a note.

    Args:
        info: The shard's entry.
        members: Its member table, if the index has one.
        store: Storage options for the shard.
        deep: Rescan the shard and compare every offset; a local shard whose MD5 the index
            records is also read whole and its MD5 compared.
        memo: Where MD5s read before are remembered (default: nowhere).
    """
    src = store.source(info.url)
    note = None
    try:
        stat = src.info()
        end = None if members is None else members.data_end
        memo = memo if memo is not None else ContentMemo()
        problem, copied = settle(info.fingerprint, stat, src.local_path, memo, data_end=end)
        if copied:
            note = "same size and md5 as indexed, another modification time (a copy)"
        if problem is None and members is not None:
            try:
                problem = _spot_check(members, src.read_range)
            except RangeNotSupportedError:  # python -m http.server: one streamed GET instead
                _warn_whole(info.url)
                problem = _spot_check(members, lambda start, end: _streamed(src, start, end))
        if problem is None and deep:
            _, now, _ = scan_shard(src)
            if members is not None and now.to_columns() != members.to_columns():
                problem = "its member offsets differ from the index (found by rescanning)"
            elif len(now) != info.nsamples:
                problem = f"it has {len(now)} samples where the index says {info.nsamples}"
            elif not copied and info.md5sum and src.local_path is not None:
                problem = _md5_problem(src.local_path, stat, info.md5sum)
    except WidsError as e:
        return e.message, None, "MISSING" if isinstance(e, FileNotFoundError) else "CHANGED"
    finally:
        src.close()
    return problem, (note if problem is None else None), "CHANGED"


def _md5_problem(path: str, stat: FileStat, recorded: str) -> str | None:
    """What a local shard's bytes say against the MD5 the index records (a deep check).

    Without it, a same-size rewrite whose modification time was set back (``touch -d``,
    ``rsync -a`` of a rewritten source) matched every recorded value, and a rewrite that kept
    the member layout passed the rescan too.
    """
    md5 = file_md5(path, stat)
    if md5.lower() == recorded.lower():
        return None
    return (
        f"its contents changed (same size, other bytes): its md5 is {md5} where the index "
        f"says {recorded} (found by reading it)"
    )


def _spot_check(members: ShardMembers, read: Callable[[int, int], bytes]) -> str | None:
    """The recorded header of one member (:func:`header_mismatch_at_spot`), read by ``read``."""
    if members.seek is not None:  # compressed: decode from the seek point before it
        read = tar_reader(members.seek, read)  # type: ignore[assignment]
    if read is None:  # no seek points: checked by a deep verify only
        return None
    return header_mismatch_at_spot(members, read)


def _streamed(src: Source, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a shard whose server ignores ``Range``.

    One streaming GET up to ``end``, holding at most a MiB beside what it returns.
    """
    with src.open_stream() as stream:
        left = start
        while left:
            skipped = stream.read(min(left, 1 << 20))
            if not skipped:
                break
            left -= len(skipped)
        parts, want = [], end - start
        while want:
            part = stream.read(want)
            if not part:
                break
            parts.append(part)
            want -= len(part)
    data = b"".join(parts)
    if len(data) != end - start:
        raise ShortReadError(f"bytes {start}-{end}: the stream ended early", shard=src.url)
    return data


def _warn_whole(url: str) -> None:
    """Say (once per server: the message names only the server) that a shard is read whole."""
    scheme, _, rest = redact_url(url).partition("://")
    warnings.warn(
        f"{scheme}://{rest.split('/', 1)[0]} ignores Range requests (it answers with the whole "
        "file): wids index verify streams its shards up to the member it checks instead",
        RangeFallbackWarning,
        stacklevel=3,
    )


def verify_index(
    index: str,
    storage_options: Mapping[str, Any] | Store | None = None,
    *,
    deep: bool = False,
    url_map: Mapping[str, str] | None = None,
    allow_local_shards: bool = False,
    executor: cf.Executor | None = None,
    notes: list[ShardProblem] | None = None,
) -> tuple[int, list[ShardProblem]]:
    """Check every shard of an index: fingerprint, a recorded member header, its member table.

    Args:
        index: Path or URL of the index.
        storage_options: fsspec options for the index and its shards.
        deep: Rescan every shard and compare its offsets.
        url_map: Prefix rewrites of shard URLs (mirrors).
        allow_local_shards: Let a remote index name local files.
        executor: Where the shards are checked (e.g. ``distributed.Client.get_executor()``);
            default: one at a time, here. At most a few hundred shards are in flight, so
            an index of 10^6 shards is checked in bounded memory.
        notes: A list to which shards that match with a remark are appended, in index
            order (kind ``"COPY"``: a local shard with the recorded size and md5 but a new
            modification time, as ``cp -r`` leaves it). What was read to tell is remembered
            in the ``*.members/`` directory of a local JSON index when checked here (no
            ``executor``) and it can be written.

    Returns:
        ``(shards, problems)``: how many shards the index has, and those that do not match,
        in index order.
    """
    store = Store.of(storage_options, named=named_by(index, url_map))
    idx = open_index(index, store, url_map=url_map, allow_local_shards=allow_local_shards)
    problems: dict[int, ShardProblem] = {}
    remarks: dict[int, ShardProblem] = {}
    futures: dict[cf.Future[tuple[str | None, str | None, str]], tuple[int, str]] = {}
    # remembered beside the index when checked here (an executor's workers may be elsewhere)
    memo = ContentMemo(index_digests_dir(index) if executor is None else None)

    def record(k: int, url: str, result: tuple[str | None, str | None, str]) -> None:
        problem, note, kind = result
        if problem:
            problems[k] = ShardProblem(url, kind, problem)
        elif note:
            remarks[k] = ShardProblem(url, "COPY", note)

    def collect(done: Iterable[cf.Future[tuple[str | None, str | None, str]]]) -> None:
        for fut in done:
            k, url = futures.pop(fut)
            record(k, url, fut.result())

    try:
        total = count_shards(idx)
        get = shard_getter(idx)
        for k in range(total):  # one record and member table at a time: 10^6 shards fit
            info = get(k)
            try:
                members = idx.members(k)  # every member table: a damaged one is reported
            except WidsError as e:
                problems[k] = ShardProblem(
                    redact_url(info.url), "DAMAGED", f"its member table: {e}"
                )
                continue
            if executor is None:
                record(k, redact_url(info.url), check_shard(info, members, store, deep, memo))
                continue
            if len(futures) >= _IN_FLIGHT:  # the executor holds a bounded window, not the index
                done, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
                collect(done)
            futures[executor.submit(check_shard, info, members, store, deep, memo)] = (
                k,
                redact_url(info.url),
            )
        collect(cf.as_completed(list(futures)))
    finally:
        for fut in futures:
            fut.cancel()
        idx.close()
    if notes is not None:
        notes.extend(remarks[k] for k in sorted(remarks))
    return total, [problems[k] for k in sorted(problems)]
