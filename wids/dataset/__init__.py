"""The map-style dataset: ``ShardListDataset``, its catalog of shards and tables, its readers.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .listdataset import (
    DatasetStats,
    ShardListDataset,
)

__all__ = [
    "DatasetStats",
    "ShardListDataset",
]
