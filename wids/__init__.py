"""wids: map-style random access to WebDataset tar shards wherever fsspec reaches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    CacheBudgetError,
    CacheDirError,
    CacheError,
    ColumnError,
    CompressedDataError,
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
    RangeNotSupportedError,
    RemoteError,
    RetriesExhaustedError,
    SampleLayoutError,
    SamplerStateError,
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

if TYPE_CHECKING:
    from .cache import ShardCache
    from .dataset import DatasetStats, MemberFile, ShardListDataset, WorkerStats
    from .dataset.localcache import CacheThrashWarning
    from .decode import Decoder, default_decoders
    from .encode import Encoder
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
    from .sampler import (
        BucketBatchSampler,
        ChunkedSampler,
        DistributedChunkedSampler,
        ShardedSampler,
    )
    from .shardwriter import ShardWriter
    from .storage import IOStats, RangeFallbackWarning, ReadLimits, RetryPolicy
    from .writer import TarWriter

# Where each public name lives, imported on first use (PEP 562): ``import wids`` and the
# ``wids`` command import only what they use, so numpy, fsspec and torch come with the names
# that need them (the dataset subclasses ``torch.utils.data.Dataset`` when torch is installed,
# ``DistributedChunkedSampler`` its ``DistributedSampler``). The errors are imported above.
_LAZY = {
    "BucketBatchSampler": "sampler",
    "BuildReport": "index",
    "CacheThrashWarning": "dataset.localcache",
    "ChunkedSampler": "sampler",
    "Component": "index",
    "DatasetStats": "dataset",
    "Decoder": "decode",
    "DistributedChunkedSampler": "sampler",
    "Encoder": "encode",
    "IOStats": "storage",
    "IndexReader": "index",
    "IndexWriter": "index",
    "JsonIndex": "index",
    "JsonIndexWriter": "index",
    "MemberFile": "dataset",
    "RangeFallbackWarning": "storage",
    "ReadLimits": "storage",
    "RetryPolicy": "storage",
    "ShardCache": "cache",
    "ShardInfo": "index",
    "ShardListDataset": "dataset",
    "ShardMembers": "index",
    "ShardWriter": "shardwriter",
    "ShardedSampler": "sampler",
    "Spec": "index",
    "SqliteIndex": "index",
    "SqliteIndexWriter": "index",
    "TableIndex": "index",
    "TableIndexWriter": "index",
    "TarWriter": "writer",
    "WorkerStats": "dataset",
    "build_index": "index",
    "convert_index": "index",
    "create_index_writer": "index",
    "default_decoders": "decode",
    "expand_braces": "index",
    "load_spec": "index",
    "open_index": "index",
    "write_index": "index",
}

__all__ = [
    "BucketBatchSampler",
    "BuildReport",
    "CacheBudgetError",
    "CacheDirError",
    "CacheError",
    "CacheThrashWarning",
    "ChunkedSampler",
    "ColumnError",
    "Component",
    "CompressedDataError",
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
    "RangeFallbackWarning",
    "RangeNotSupportedError",
    "ReadLimits",
    "RemoteError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SampleLayoutError",
    "SampleTooLargeError",
    "SamplerStateError",
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
    """A public name on first use (:data:`_LAZY`), the ``dataset`` package, ``__version__``.

    ``wids.__version__`` is read from the installed package's metadata: the version lives in one
    place, ``pyproject.toml``, and looking it up lazily keeps ``import wids`` free of file-system
    work.
    """
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name == "dataset":  # the submodule, as ``import wids.dataset`` would bind it
        return importlib.import_module(".dataset", __name__)
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
    """The public names and the module's dunders, the same before and after any is first used."""
    dunders = {n for n in globals() if n.startswith("__") and n != "__dir__"}
    return sorted({*dunders, "__version__", *__all__, "dataset"})
