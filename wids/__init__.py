"""wids: map-style random access to WebDataset tar shards wherever fsspec reaches."""

from __future__ import annotations

from .cache import ShardCache
from .dataset import DatasetStats, ShardListDataset
from .decode import Decoder, default_decoders
from .encode import Encoder
from .errors import (
    CacheBudgetError,
    CacheDirError,
    CacheError,
    CorruptReadError,
    DecodeError,
    DestinationError,
    EncodeError,
    HeaderChecksumError,
    IndexFormatError,
    IndexMismatchError,
    LockTimeoutError,
    OfflineError,
    OutputExistsError,
    PermanentRemoteError,
    PipeCommandError,
    RemoteError,
    RetriesExhaustedError,
    SampleLayoutError,
    ShardNotFoundError,
    ShortReadError,
    TarFormatError,
    TruncatedTarError,
    UnsafeDecodeError,
    UntrustedLocationError,
    WidsError,
)
from .index import (
    BuildReport,
    Component,
    IndexReader,
    JsonIndex,
    JsonIndexWriter,
    ShardInfo,
    ShardMembers,
    Spec,
    SqliteIndex,
    SqliteIndexWriter,
    build_index,
    convert_index,
    create_index_writer,
    expand_braces,
    load_spec,
    open_index,
)
from .sampler import ChunkedSampler, DistributedChunkedSampler, ShardedSampler
from .shardwriter import ShardWriter
from .storage import IOStats, RetryPolicy
from .writer import TarWriter

__all__ = [
    "BuildReport",
    "CacheBudgetError",
    "CacheDirError",
    "CacheError",
    "ChunkedSampler",
    "Component",
    "CorruptReadError",
    "DatasetStats",
    "DecodeError",
    "Decoder",
    "DestinationError",
    "DistributedChunkedSampler",
    "EncodeError",
    "Encoder",
    "HeaderChecksumError",
    "IOStats",
    "IndexFormatError",
    "IndexMismatchError",
    "IndexReader",
    "JsonIndex",
    "JsonIndexWriter",
    "LockTimeoutError",
    "OfflineError",
    "OutputExistsError",
    "PermanentRemoteError",
    "PipeCommandError",
    "RemoteError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SampleLayoutError",
    "ShardCache",
    "ShardInfo",
    "ShardListDataset",
    "ShardMembers",
    "ShardNotFoundError",
    "ShardWriter",
    "ShardedSampler",
    "ShortReadError",
    "Spec",
    "SqliteIndex",
    "SqliteIndexWriter",
    "TarFormatError",
    "TarWriter",
    "TruncatedTarError",
    "UnsafeDecodeError",
    "UntrustedLocationError",
    "WidsError",
    "build_index",
    "convert_index",
    "create_index_writer",
    "default_decoders",
    "expand_braces",
    "load_spec",
    "open_index",
]


def __getattr__(name: str) -> str:
    """``wids.__version__``, read from the installed package's metadata on first use.

    The version lives in one place, ``pyproject.toml``; looking it up lazily keeps
    ``import wids`` free of file-system work.
    """
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("wids-shards")
    except PackageNotFoundError:  # running from a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
