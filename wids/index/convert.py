"""Converting indexes between backends (JSON, SQLite, shard table; any direction).

A reference description converts too (its shards then have no member tables): that is how a
description of 10^6 shards becomes a shard table (``wids index convert train.json -o
train.widx``), which opens without a Python object per shard.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import IndexFormatError
from ..storage import Store, named_by, output_dir, stored_url
from .model import IndexReader, IndexWriter, ShardInfo
from .output import check_output, index_destination
from .registry import create_index_writer, open_index

__all__ = ["convert_index"]


def convert_index(
    src: str,
    dst: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | Store | None = None,
) -> None:
    """Convert an index between backends (JSON, SQLite, shard table; any direction).

    Shards (with size, etag, mtime, md5sum and extra keys), member tables, components and
    the report are preserved. Shard URLs are rewritten so they resolve to the same shards
    from the destination: relative when inside its directory, absolute otherwise. A reference
    description (no member tables) converts too; its shards then have none.

    Args:
        src: Path or URL of the source index (backend detected from its content).
        dst: The index to write, a local path or any writable fsspec URL (uploaded as
            :mod:`wids.index.output` describes); its ending selects the backend.
        storage_options: fsspec options for a remote ``src`` or ``dst``.

    Raises:
        IndexFormatError: The source is malformed.
        DestinationError: ``dst`` names no backend or has a read-only scheme.
        OutputExistsError: ``dst`` is the source, or an existing file that is not an index.
    """
    dest = os.fspath(dst)
    store = Store.of(storage_options, named=named_by(src, dest))
    check_output(dest, [src], store)
    reader = open_index(src, store)
    try:
        with index_destination(dest, store) as path:
            _copy(reader, src, create_index_writer(path, name=reader.name or None), dest)
    finally:
        reader.close()


class _Stored:
    """:func:`~wids.storage.stored_url` with a fast path for the common case (10^6 shards).

    A normalised absolute local path under the destination's directory is stored as the rest
    of it; anything else goes through ``stored_url``.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.prefix = out_dir.rstrip("/") + "/" if out_dir.startswith("/") else None

    def __call__(self, url: str) -> str:
        prefix = self.prefix
        if prefix is not None and url.startswith(prefix):
            rest = url[len(prefix) :]
            if rest and "//" not in rest and "/." not in "/" + rest and ":" not in rest:
                return rest
        return stored_url(url, self.out_dir)


def _restored(info: ShardInfo, url: str) -> ShardInfo:
    if url == info.url:
        return info
    return ShardInfo(url, info.nsamples, info.size, info.etag, info.mtime, info.md5sum)


def _copy(reader: IndexReader, src: str, writer: IndexWriter, dest: str) -> None:
    out_dir = output_dir(dest)
    try:
        # one record at a time when the reader can (a shard table), else its list
        shard = getattr(reader, "shard", None) or reader.shards.__getitem__
        nshards = getattr(reader, "nshards", None)
        if nshards is None:
            nshards = len(reader.shards)
        stored = _Stored(out_dir)
        comps = reader.components
        starts = [c.first_shard for c in comps]
        stops = [c.stop_shard for c in comps]
        if starts[:1] + stops != [0] + starts[1:] + [nshards]:
            raise IndexFormatError("components do not cover the shards in order", shard=src)
        for k, comp in enumerate(comps):
            is_main = k == 0 and comp.name == (reader.name or "") and comp.weight is None
            if not is_main:
                writer.start_component(comp.name, comp.weight)
            add_many = getattr(writer, "add_many", None)
            if add_many is not None and not reader.has_members:
                # a description of many shards: one column at a time
                infos = [shard(i) for i in range(comp.first_shard, comp.stop_shard)]
                extras = [reader.shard_extra(i) for i in range(comp.first_shard, comp.stop_shard)]
                add_many(infos, [stored(s.url) for s in infos], extras)
                continue
            for i in range(comp.first_shard, comp.stop_shard):
                info = shard(i)
                info = _restored(info, stored(info.url))
                writer.add(info, reader.members(i), reader.shard_extra(i) or None)
        writer.set_report(reader.report)
    except BaseException:
        writer.abort()
        raise
    writer.close()
