"""Indexes: the model (shards, member tables), the JSON and SQLite backends, building, conversion.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .build import (
    BuildReport,
    build_index,
    scan_shard,
)
from .convert import (
    convert_index,
    create_index_writer,
)
from .jsonfile import (
    _SIDECAR_NAME,
    JsonIndex,
    JsonIndexWriter,
    _members_dir,
    _sidecar_name,
)
from .model import (
    REPAIR_HINT,
    IndexReader,
    ShardInfo,
    ShardMembers,
    header_mismatch_at_spot,
    open_index,
    shard_mismatch,
    with_repair_hint,
)
from .spec import (
    Component,
    Spec,
    check_url_map,
    expand_braces,
    load_spec,
    map_url,
    resolve_url,
)
from .sqlitefile import (
    SqliteIndex,
    SqliteIndexWriter,
)

__all__ = [
    "BuildReport",
    "Component",
    "IndexReader",
    "JsonIndex",
    "JsonIndexWriter",
    "REPAIR_HINT",
    "ShardInfo",
    "ShardMembers",
    "Spec",
    "SqliteIndex",
    "SqliteIndexWriter",
    "_SIDECAR_NAME",
    "_members_dir",
    "_sidecar_name",
    "build_index",
    "check_url_map",
    "convert_index",
    "create_index_writer",
    "expand_braces",
    "header_mismatch_at_spot",
    "load_spec",
    "map_url",
    "open_index",
    "resolve_url",
    "scan_shard",
    "shard_mismatch",
    "with_repair_hint",
]
