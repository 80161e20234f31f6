"""Indexes: the model, fingerprints, the backends (JSON, SQLite, shard table), building, conversion.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .access import (
        count_shards,
        count_without_members,
        iter_shards,
        shard_bytes,
        shard_getter,
        shard_sample_counts,
        shards_ending,
    )
    from .build import BuildReport, build_index
    from .contents import ContentMemo, file_md5, index_digests_dir, mismatch_error, settle
    from .convert import convert_index
    from .fingerprint import Fingerprint, header_mismatch_at_spot, unchanged
    from .jsonformat import members_dir, sidecar_name
    from .jsonreader import JsonIndex
    from .jsonwriter import JsonIndexWriter
    from .members import ShardMembers
    from .model import (
        REPAIR_HINT,
        Component,
        IndexReader,
        IndexWriter,
        ShardInfo,
        check_entry,
        with_repair_hint,
    )
    from .output import check_output, index_destination
    from .registry import create_index_writer, is_sqlite_name, is_table_name, open_index
    from .scan import scan_shard
    from .spec import Spec, load_spec
    from .sqlitereader import SqliteIndex
    from .sqlitewriter import SqliteIndexWriter
    from .tablereader import TableIndex
    from .tablewriter import TableIndexWriter
    from .urls import check_url_map, expand_braces, map_url, resolve_url, unpipe_url
    from .verify import ShardProblem, check_shard, verify_index, verify_shard
    from .write import write_index

# Where each name lives, imported on first use (PEP 562): opening an index (wids index info)
# imports neither the builder nor fsspec; building imports what it needs.
_LAZY = {
    "BuildReport": "build",
    "Component": "model",
    "ContentMemo": "contents",
    "Fingerprint": "fingerprint",
    "IndexReader": "model",
    "IndexWriter": "model",
    "JsonIndex": "jsonreader",
    "JsonIndexWriter": "jsonwriter",
    "REPAIR_HINT": "model",
    "ShardInfo": "model",
    "ShardMembers": "members",
    "ShardProblem": "verify",
    "Spec": "spec",
    "SqliteIndex": "sqlitereader",
    "SqliteIndexWriter": "sqlitewriter",
    "TableIndex": "tablereader",
    "TableIndexWriter": "tablewriter",
    "build_index": "build",
    "check_entry": "model",
    "check_output": "output",
    "check_shard": "verify",
    "check_url_map": "urls",
    "convert_index": "convert",
    "count_shards": "access",
    "count_without_members": "access",
    "create_index_writer": "registry",
    "expand_braces": "urls",
    "file_md5": "contents",
    "header_mismatch_at_spot": "fingerprint",
    "index_destination": "output",
    "index_digests_dir": "contents",
    "is_sqlite_name": "registry",
    "is_table_name": "registry",
    "iter_shards": "access",
    "load_spec": "spec",
    "map_url": "urls",
    "members_dir": "jsonformat",
    "mismatch_error": "contents",
    "open_index": "registry",
    "resolve_url": "urls",
    "scan_shard": "scan",
    "settle": "contents",
    "shard_bytes": "access",
    "shard_getter": "access",
    "shard_sample_counts": "access",
    "shards_ending": "access",
    "sidecar_name": "jsonformat",
    "unchanged": "fingerprint",
    "unpipe_url": "urls",
    "verify_index": "verify",
    "verify_shard": "verify",
    "with_repair_hint": "model",
    "write_index": "write",
}

__all__ = [
    "REPAIR_HINT",
    "BuildReport",
    "Component",
    "ContentMemo",
    "Fingerprint",
    "IndexReader",
    "IndexWriter",
    "JsonIndex",
    "JsonIndexWriter",
    "ShardInfo",
    "ShardMembers",
    "ShardProblem",
    "Spec",
    "SqliteIndex",
    "SqliteIndexWriter",
    "TableIndex",
    "TableIndexWriter",
    "build_index",
    "check_entry",
    "check_output",
    "check_shard",
    "check_url_map",
    "convert_index",
    "count_shards",
    "count_without_members",
    "create_index_writer",
    "expand_braces",
    "file_md5",
    "header_mismatch_at_spot",
    "index_digests_dir",
    "index_destination",
    "is_sqlite_name",
    "is_table_name",
    "iter_shards",
    "load_spec",
    "map_url",
    "members_dir",
    "mismatch_error",
    "open_index",
    "resolve_url",
    "scan_shard",
    "settle",
    "shard_bytes",
    "shard_getter",
    "shard_sample_counts",
    "shards_ending",
    "sidecar_name",
    "unchanged",
    "unpipe_url",
    "verify_index",
    "verify_shard",
    "with_repair_hint",
    "write_index",
]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())  # a name of _LAZY on first use
