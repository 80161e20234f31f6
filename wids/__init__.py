"""wids: map-style random access to WebDataset tar shards wherever fsspec reaches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cache import ShardCache
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
    ExclusionError,
    HeaderChecksumError,
    IndexFormatError,
    IndexMismatchError,
    LockTimeoutError,
    NotAnIndexError,
    OfflineError,
    OutputExistsError,
    PermanentRemoteError,
    PipeCommandError,
    RemoteError,
    RetriesExhaustedError,
    SampleLayoutError,
    SamplerWrappedError,
    SampleTooLargeError,
    ShardNotFoundError,
    ShortReadError,
    TarFormatError,
    TooLargeError,
    TruncatedTarError,
    UnsafeDecodeError,
    UntrustedLocationError,
    WidsError,
    WriteError,
    WritePermissionError,
)
from .index import (
    BuildReport,
    Component,
    IndexReader,
    IndexWriter,
    JsonIndex,
    JsonIndexWriter,
    ShardInfo,
    ShardMembers,
    Spec,
    SqliteIndex,
    SqliteIndexWriter,
    TableIndex,
    TableIndexWriter,
    build_index,
    convert_index,
    create_index_writer,
    expand_braces,
    load_spec,
    open_index,
    write_index,
)
from .sampler import ChunkedSampler, ShardedSampler
from .shardwriter import ShardWriter
from .storage import IOStats, ReadLimits, RetryPolicy
from .writer import TarWriter

if TYPE_CHECKING:
    from .dataset import DatasetStats, MemberFile, ShardListDataset, WorkerStats
    from .sampler import DistributedChunkedSampler

# Imported on first use: the dataset subclasses ``torch.utils.data.Dataset`` when torch is
# installed, and ``import wids`` must not import torch.
_FROM_DATASET = ("DatasetStats", "MemberFile", "ShardListDataset", "WorkerStats")
# Imported on first use too: it subclasses ``torch.utils.data.DistributedSampler`` when torch is
# installed, so frameworks recognise it as already distributed.
_FROM_SAMPLER = ("DistributedChunkedSampler",)

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
    "ExclusionError",
    "HeaderChecksumError",
    "IOStats",
    "IndexFormatError",
    "IndexMismatchError",
    "IndexReader",
    "IndexWriter",
    "JsonIndex",
    "JsonIndexWriter",
    "LockTimeoutError",
    "MemberFile",
    "NotAnIndexError",
    "OfflineError",
    "OutputExistsError",
    "PermanentRemoteError",
    "PipeCommandError",
    "ReadLimits",
    "RemoteError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SampleLayoutError",
    "SampleTooLargeError",
    "SamplerWrappedError",
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
    "TableIndex",
    "TableIndexWriter",
    "TarFormatError",
    "TarWriter",
    "TooLargeError",
    "TruncatedTarError",
    "UnsafeDecodeError",
    "UntrustedLocationError",
    "WidsError",
    "WorkerStats",
    "WriteError",
    "WritePermissionError",
    "build_index",
    "convert_index",
    "create_index_writer",
    "default_decoders",
    "expand_braces",
    "load_spec",
    "open_index",
    "write_index",
]


def __getattr__(name: str) -> Any:
    """Names resolved on first use: the dataset's (importing torch if installed), ``__version__``.

    ``wids.__version__`` is read from the installed package's metadata: the version lives in one
    place, ``pyproject.toml``, and looking it up lazily keeps ``import wids`` free of file-system
    work.
    """
    if name in _FROM_DATASET or name == "dataset":
        # ``from .dataset import`` imports the submodule, which binds ``wids.dataset`` too.
        from .dataset import DatasetStats, MemberFile, ShardListDataset, WorkerStats

        globals().update(
            DatasetStats=DatasetStats,
            MemberFile=MemberFile,
            ShardListDataset=ShardListDataset,
            WorkerStats=WorkerStats,
        )
        return globals()[name]
    if name in _FROM_SAMPLER:
        from .sampler import DistributedChunkedSampler

        globals()["DistributedChunkedSampler"] = DistributedChunkedSampler
        return DistributedChunkedSampler
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("wids-shards")
    except PackageNotFoundError:  # running from a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found


def __dir__() -> list[str]:
    """As if the dataset were imported eagerly, without this module's own helpers."""
    helpers = {"Any", "TYPE_CHECKING", "_FROM_DATASET", "_FROM_SAMPLER", "__dir__"}
    return sorted({*globals(), *_FROM_DATASET, *_FROM_SAMPLER, "dataset"} - helpers)
