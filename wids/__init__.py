"""wids: map-style random access to WebDataset tar shards wherever fsspec reaches."""

from __future__ import annotations

from .dataset import DatasetStats, ShardListDataset
from .decode import Decoder, default_decoders
from .errors import (
    CacheBudgetError,
    CacheError,
    DecodeError,
    HeaderChecksumError,
    IndexFormatError,
    IndexMismatchError,
    LockTimeoutError,
    OfflineError,
    PermanentRemoteError,
    RemoteError,
    RetriesExhaustedError,
    SampleLayoutError,
    ShardNotFoundError,
    ShortReadError,
    TarFormatError,
    TruncatedTarError,
    UnsafeDecodeError,
    WidsError,
)

__all__ = [
    "CacheBudgetError",
    "CacheError",
    "DatasetStats",
    "DecodeError",
    "Decoder",
    "HeaderChecksumError",
    "IndexFormatError",
    "IndexMismatchError",
    "LockTimeoutError",
    "OfflineError",
    "PermanentRemoteError",
    "RemoteError",
    "RetriesExhaustedError",
    "SampleLayoutError",
    "ShardListDataset",
    "ShardNotFoundError",
    "ShortReadError",
    "TarFormatError",
    "TruncatedTarError",
    "UnsafeDecodeError",
    "WidsError",
    "default_decoders",
]
