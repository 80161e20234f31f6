"""The map-style dataset: ``ShardListDataset``, its catalog of shards and tables, its readers.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .description import DatasetComponent
from .listdataset import ShardListDataset
from .memberfile import MemberFile
from .stats import DatasetStats
from .workerstats import WorkerStats

__all__ = [
    "DatasetComponent",
    "DatasetStats",
    "MemberFile",
    "ShardListDataset",
    "WorkerStats",
]
