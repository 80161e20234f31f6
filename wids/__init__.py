"""wids: map-style random access to WebDataset tar shards wherever fsspec reaches."""

from __future__ import annotations

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
    "DecodeError",
    "HeaderChecksumError",
    "IndexFormatError",
    "IndexMismatchError",
    "LockTimeoutError",
    "OfflineError",
    "PermanentRemoteError",
    "RemoteError",
    "RetriesExhaustedError",
    "SampleLayoutError",
    "ShardNotFoundError",
    "ShortReadError",
    "TarFormatError",
    "TruncatedTarError",
    "UnsafeDecodeError",
    "WidsError",
]
