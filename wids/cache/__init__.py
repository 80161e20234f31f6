"""The local cache directory: its layout and marking, shard entries, promotion, scans, snapshots.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .layout import (
    MARKER,
    cache_state,
    cache_subdir,
    count_files,
)
from .promote import (
    Promoter,
)
from .scans import (
    scan_cached,
)
from .shards import (
    ShardCache,
    _md5_file,
    entry_key,
)
from .snapshots import (
    open_snapshot,
    save_snapshot,
    snapshot_path,
)

__all__ = [
    "MARKER",
    "Promoter",
    "ShardCache",
    "_md5_file",
    "cache_state",
    "cache_subdir",
    "count_files",
    "entry_key",
    "open_snapshot",
    "save_snapshot",
    "scan_cached",
    "snapshot_path",
]
