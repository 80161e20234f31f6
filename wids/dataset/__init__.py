"""The map-style dataset: ``ShardListDataset``, its catalog of shards and tables, its readers.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .description import DatasetComponent
    from .exclusions import (
        EXCLUDE_HEADER,
        SIDECAR,
        ExcludeSpec,
        index_exclusion,
        pair_parts,
        parse_exclude,
        read_exclude_file,
        resolve,
    )
    from .listdataset import ShardListDataset
    from .memberfile import MemberFile
    from .samplereader import SampleReader
    from .stats import DatasetStats
    from .workerstats import WorkerStats

# Imported on first use (PEP 562): ShardListDataset subclasses torch's Dataset when torch is
# installed, and ``wids show`` reads through SampleReader without importing torch.
_LAZY = {
    "DatasetComponent": "description",
    "DatasetStats": "stats",
    "EXCLUDE_HEADER": "exclusions",
    "ExcludeSpec": "exclusions",
    "MemberFile": "memberfile",
    "SIDECAR": "exclusions",
    "SampleReader": "samplereader",
    "ShardListDataset": "listdataset",
    "WorkerStats": "workerstats",
    "index_exclusion": "exclusions",
    "pair_parts": "exclusions",
    "parse_exclude": "exclusions",
    "read_exclude_file": "exclusions",
    "resolve": "exclusions",
}

__all__ = [
    "DatasetComponent",
    "DatasetStats",
    "EXCLUDE_HEADER",
    "ExcludeSpec",
    "MemberFile",
    "SIDECAR",
    "SampleReader",
    "ShardListDataset",
    "WorkerStats",
    "index_exclusion",
    "pair_parts",
    "parse_exclude",
    "read_exclude_file",
    "resolve",
]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())  # a name of _LAZY on first use
