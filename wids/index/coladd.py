"""Adding metadata columns to an existing local index (``docs/columns.md``).

:func:`add_columns` takes the index's writer lock, as a build does, and rewrites the index
with the columns (:func:`wids.index.colcollect.add_columns_locked`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..errors import ColumnError
from .colcollect import add_columns_locked
from .columns import ColumnSpec, parse_specs

__all__ = ["add_columns"]


def add_columns(
    index: str | os.PathLike[str],
    columns: Sequence[str | ColumnSpec],
    *,
    storage_options: Any = None,
) -> int:
    """Collect columns for every shard of a local index and write them into it.

    The index is rewritten in its own format (atomically, as every index write) with the
    same shards, member tables, components and report; each shard's columns (these, plus
    the ones it already had under other names) go in its extra keys.

    Args:
        index: A local index (JSON, SQLite, shard table) with member tables.
        columns: Column specs (``"json:width"``, ``"size:.jpg"``, ``"w=json:meta.width"``).
        storage_options: fsspec options for remote shards (or a ``Store``).

    Returns:
        The number of shards.

    Raises:
        ColumnError: A malformed spec, a shard without a member table, or an unusable value.
        IndexFormatError: The index is malformed.
    """
    from ..storage import Store, is_remote, redact_url
    from .output import index_destination

    specs = parse_specs(columns)
    path = os.fspath(index)
    if is_remote(path):
        raise ColumnError(f"{redact_url(path)}: columns are added to a local index")
    store = Store.of(storage_options)
    with index_destination(os.path.abspath(path), store) as local:  # locked as a build is
        return add_columns_locked(local, specs, store)
