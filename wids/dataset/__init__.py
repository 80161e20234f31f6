"""The map-style dataset: ``ShardListDataset``, its catalog of shards and tables, its readers.

Other parts import from this package, not its modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    "parse_exclude",
    "read_exclude_file",
    "resolve",
]


def __getattr__(name: str) -> Any:
    """A name of :data:`_LAZY`, imported from its module on first use."""
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{_LAZY[name]}", __name__)
    value = module if _LAZY[name] == name else getattr(module, name)
    globals()[name] = value
    return value
