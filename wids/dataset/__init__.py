"""The map-style dataset: ``ShardListDataset``, its catalog of shards and tables, its readers.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .description import DatasetComponent
from .exclusions import (
    EXCLUDE_HEADER,
    SIDECAR,
    ExcludeSpec,
    parse_exclude,
    read_exclude_file,
    resolve,
)
from .listdataset import ShardListDataset
from .memberfile import MemberFile
from .stats import DatasetStats
from .workerstats import WorkerStats

__all__ = [
    "EXCLUDE_HEADER",
    "SIDECAR",
    "DatasetComponent",
    "DatasetStats",
    "ExcludeSpec",
    "MemberFile",
    "ShardListDataset",
    "WorkerStats",
    "parse_exclude",
    "read_exclude_file",
    "resolve",
]
