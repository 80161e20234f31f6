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
from .sampler import ChunkedSampler, DistributedChunkedSampler, ShardedSampler

__all__ = [
    "CacheBudgetError",
    "CacheError",
    "ChunkedSampler",
    "DatasetStats",
    "DecodeError",
    "Decoder",
    "DistributedChunkedSampler",
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
    "ShardedSampler",
    "ShortReadError",
    "TarFormatError",
    "TruncatedTarError",
    "UnsafeDecodeError",
    "WidsError",
    "default_decoders",
]
