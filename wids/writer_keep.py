"""What a :class:`~wids.ShardWriter` keeps of the shards and index already at its destination.

A writer of ``pattern`` owns the names ``pattern % n``. The index at its destination is kept,
never silently replaced:

- An index that lists any other shard (another writer's, or a second pattern with the same
  stem in the same folder) is refused with :class:`~wids.errors.OutputExistsError` unless
  ``overwrite=True`` (which writes a new index of only the new shards).
- ``start_shard=k`` extends the index on purpose: the shards it lists below ``k`` stay in it,
  each checked against its entry (fingerprint and a recorded header; a changed shard is
  scanned again, a missing one is :class:`~wids.errors.ShardNotFoundError`).
- A shard it lists from ``k`` on would be written again: refused unless ``resume=True``,
  which keeps the consecutive whole shards from ``k`` on (their member tables from the old
  index where it still describes them, else scanned) and continues after them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from .errors import OutputExistsError, ShardNotFoundError, WidsError
from .index import IndexReader, ShardMembers
from .storage import Store

__all__ = ["whole_shards"]

logger = logging.getLogger(__name__)


def whole_shards(
    pattern: str,
    start: int,
    index: str | None,
    store: Store,
    *,
    resume: bool = True,
    overwrite: bool = False,
) -> Iterator[tuple[str, Any, ShardMembers]]:
    """The shards a writer of ``pattern`` from ``start`` on keeps, with their member tables.

    First the shards the existing ``index`` lists below ``start`` (``pattern % n``,
    ``n < start``: extending a dataset on purpose), each checked against its entry (else
    scanned again); then, with ``resume``, the shards ``pattern % n`` that exist from
    ``start`` up to the first missing one, from the old index where its entry still describes
    the file (fingerprint and a recorded header), else scanned.

    Yields:
        ``(url, stat, members)`` in shard order.

    Raises:
        OutputExistsError: The existing index lists a shard that is not ``pattern % n`` (of
            another writer), or, without ``resume``, one this writer would write again
            (``n >= start``), or it exists but cannot be read (without ``overwrite``).
        ShardNotFoundError: A shard the index lists below ``start`` is missing.
    """
    reader, known = _old_index(index, store, strict=not overwrite)
    try:
        numbers = _shard_numbers(known, pattern, index)
        if not resume and any(n >= start for n in numbers.values()):
            raise OutputExistsError(
                f"lists shards from {pattern % start} on, which this writer would write again; "
                "pass resume=True to continue after the whole shards, overwrite=True to "
                "replace the index, or start_shard= past them",
                shard=_redact(index or ""),
            )
        kept = sorted((n, url) for url, n in numbers.items() if n < start)
        for _, url in kept:
            yield _kept_shard(url, reader, known[url], store, index or "")
        if resume:
            yield from _consecutive(pattern, start, reader, known, store)
    finally:
        if reader is not None:
            reader.close()


def _consecutive(
    pattern: str, start: int, reader: IndexReader | None, known: dict[str, int], store: Store
) -> Iterator[tuple[str, Any, ShardMembers]]:
    """The shards ``pattern % n`` that exist from ``start`` up to the first missing one."""
    n = start
    while True:
        url = pattern % n
        src = store.source(url)
        try:
            stat = src.info()
        except ShardNotFoundError:
            return
        i = known.get(_resolved(url))
        got = None if i is None or reader is None else _reusable(reader, i, stat, src)
        stat, members = got if got is not None else _scan(src)
        src.close()
        yield url, stat, members
        n += 1


def _kept_shard(
    url: str, reader: IndexReader | None, i: int, store: Store, index: str
) -> tuple[str, Any, ShardMembers]:
    """A shard the old index lists below ``start_shard``: checked, or scanned again."""
    src = store.source(url)
    try:
        try:
            stat = src.info()
        except ShardNotFoundError:
            raise ShardNotFoundError(
                f"is listed in the existing index {_redact(index)} but missing; restore it, or "
                "pass overwrite=True to write a new index of only the new shards",
                shard=_redact(url),
            ) from None
        got = None if reader is None else _reusable(reader, i, stat, src)
        if got is None:
            logger.info("%s changed since it was indexed; scanning it again", _redact(url))
        stat, members = got if got is not None else _scan(src)
        return url, stat, members
    finally:
        src.close()


def _shard_numbers(known: dict[str, int], pattern: str, index: str | None) -> dict[str, int]:
    """``n`` of every URL in the old index that is ``pattern % n``; any other is refused."""
    out: dict[str, int] = {}
    for url in known:
        n = next(
            (
                int(m.group())
                for m in re.finditer(r"\d+", url)
                if _resolved(pattern % int(m.group())) == url
            ),
            None,
        )
        if n is None:
            raise OutputExistsError(
                f"lists {_redact(url)}, which is not one of this writer's shards ({pattern}); "
                "name another index (index=), or pass overwrite=True to replace it",
                shard=_redact(index or ""),
            )
        out[url] = n
    return out


def _old_index(
    index: str | None, store: Store, *, strict: bool = True
) -> tuple[IndexReader | None, dict[str, int]]:
    """The old index and its shards' numbers by URL (read one record at a time), if any.

    An index that exists but cannot be read whole (damaged, or a ``source_url`` of it missing
    now) is :class:`~wids.errors.OutputExistsError`: it may list shards this writer would drop
    from it. Only with ``strict`` off (``overwrite=True``) is it a warning, and no index.
    """
    from .index import iter_shards, open_index
    from .storage import is_remote

    if index is None or not _exists(index, store, is_remote(index)):
        return None, {}
    reader = None
    try:
        reader = open_index(index, store)
        if len(reader.components) > 1:
            raise OutputExistsError(
                "has sub-datasets; a writer extends only an index of its own shards (name "
                "another index, or pass overwrite=True to replace it)",
                shard=_redact(index),
            )
        # every record read now, so a damaged index is noticed here
        return reader, {info.url: i for i, info in enumerate(iter_shards(reader))}
    except OutputExistsError:
        if reader is not None:
            reader.close()
        raise
    except WidsError as e:
        if reader is not None:
            reader.close()
        if strict:
            raise OutputExistsError(
                f"exists and cannot be read ({e}); pass overwrite=True to replace it",
                shard=_redact(index),
            ) from None
        logger.warning("existing index %s unusable (%s); scanning shards", index, e)
    return None, {}


def _exists(index: str, store: Store, remote: bool) -> bool:
    """Whether the index file itself is there (a missing ``source_url`` in it is not this)."""
    if not remote:
        return os.path.exists(index)
    src = store.source(index)
    try:
        src.info()
    except ShardNotFoundError:
        return False
    finally:
        src.close()
    return True


def _scan(src: Any) -> tuple[Any, ShardMembers]:
    """A shard's stat (with the md5 of a local one, as ``wids index create``) and members."""
    from dataclasses import replace

    from .index import file_md5, scan_shard

    stat, members, _ = scan_shard(src)
    if src.local_path is not None:
        stat = replace(stat, md5=file_md5(src.local_path, stat))
    return stat, members


def _reusable(reader: IndexReader, i: int, stat: Any, src: Any) -> tuple[Any, ShardMembers] | None:
    """A shard's stat (with its recorded md5) and old member table, if still its own."""
    from dataclasses import replace

    from .index import shard_getter, unchanged
    from .storage import redact_url

    info = shard_getter(reader)(i)
    try:
        members = reader.members(i)
        if members is None or not unchanged(info.fingerprint, members, stat, src.read_range):
            return None
        return replace(stat, md5=info.md5sum or stat.md5), members
    except Exception as e:  # a damaged entry: scan the shard instead
        logger.warning("not reusing the index entry of %s: %s", redact_url(info.url), e)
        return None


def _redact(url: str) -> str:
    """``url`` without credentials, for messages."""
    from .storage import redact_url

    return redact_url(url)


def _resolved(url: str) -> str:
    """A shard URL as an index reader returns it (a local path made absolute)."""
    from .storage import is_remote, local_path

    return url if is_remote(url) else os.path.abspath(local_path(url))
