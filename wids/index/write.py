"""Writing an index from member offsets already known: :func:`write_index`.

Tools that write shards (or parse them their own way) know every member's offset and size, and
need no scan to index them. :func:`write_index` is their entry point: the same checks on the
output as ``wids index create`` (:func:`~wids.index.output.check_output`), the backend chosen
by the name (:func:`~wids.index.registry.create_index_writer`), every shard checked as it is
added (:func:`~wids.index.model.check_entry`), and the index published whole when the block
ends: atomically in place for a local path, uploaded (sidecars first) for a URL. An error in
the block publishes nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from ..storage import Store
from .model import IndexWriter
from .output import check_output, index_destination
from .registry import create_index_writer

__all__ = ["write_index"]


@contextlib.contextmanager
def write_index(
    output: str | os.PathLike[str],
    *,
    name: str | None = None,
    storage_options: Mapping[str, Any] | Store | None = None,
) -> Iterator[IndexWriter]:
    """Write an index whose member offsets are already known, without scanning any shard.

    Inside the block, ``writer.add(ShardInfo(...), ShardMembers.from_samples(...))`` records
    one shard, in dataset order; ``writer.start_component(name, weight)`` starts a
    sub-dataset. A shard's ``url`` is stored as given: relative to the index's directory, or
    absolute. The result is the same index ``wids index create`` writes for those shards, and
    ``ShardListDataset(output)`` reads it.

    Args:
        output: ``*.json``, ``*.sqlite`` (also ``.sqlite3``, ``.db``) or ``*.widx``: a local
            path or a writable fsspec URL (``s3://bucket/train.json``).
        name: The dataset's name.
        storage_options: fsspec options for a remote ``output``.

    Yields:
        The writer (:class:`~wids.index.model.IndexWriter`).

    Raises:
        IndexFormatError: From ``writer.add``: a record or member table that is malformed or
            does not fit the shard (a member past ``size``, overlapping members, a negative
            size, ``nsamples`` differing from the table). The index is not published.
        DestinationError: ``output``'s name selects no backend, or its scheme is read-only.
        OutputExistsError: ``output`` exists and is not an index (or is a directory).
        LockTimeoutError: Another writer of the same local index is running.

    Example:
        >>> from wids import ShardInfo, ShardMembers, write_index
        >>> members = ShardMembers.from_samples([("000000", [(".txt", 512, 5)])])
        >>> with write_index("train.json", name="train") as writer:  # doctest: +SKIP
        ...     writer.add(ShardInfo("train-000000.tar", 1, size=2048), members)
    """
    store = Store.of(storage_options)
    out = os.fspath(output)
    check_output(out, [], store)
    with index_destination(out, store) as path:
        writer = create_index_writer(path, name=name)
        try:
            yield writer
        except BaseException:
            writer.abort()
            raise
        writer.close()
