"""The local cache directory: the one owner of its layout, and everything stored in it.

Shard entries (:mod:`.shards`, :mod:`.entries`, :mod:`.handle`, :mod:`.download`), the budget
(:mod:`.budget`), promotion (:mod:`.promote`), scan-once member tables (:mod:`.scans`) and
offline index snapshots (:mod:`.snapshots`), all in the directory :mod:`.layout` marks and
checks. Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .download import (
    md5_file,
)
from .handle import (
    CachedShard,
)
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
)
from .snapshots import (
    open_snapshot,
    save_snapshot,
    snapshot_path,
)

__all__ = [
    "MARKER",
    "CachedShard",
    "Promoter",
    "ShardCache",
    "cache_state",
    "cache_subdir",
    "count_files",
    "md5_file",
    "open_snapshot",
    "save_snapshot",
    "scan_cached",
    "snapshot_path",
]
