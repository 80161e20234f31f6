"""The public API: what `import wids` offers, and what importing it does not do."""

from __future__ import annotations

import subprocess
import sys

import wids

EXPECTED = [
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


def test_export_list_is_pinned_and_sorted():
    assert wids.__all__ == EXPECTED
    assert sorted(wids.__all__) == wids.__all__
    for name in EXPECTED:
        assert getattr(wids, name) is not None


def test_every_error_is_a_wids_error_and_a_builtin():
    for name in EXPECTED:
        obj = getattr(wids, name)
        if isinstance(obj, type) and issubclass(obj, Warning):
            continue  # warnings are not errors (test_warnings_can_be_filtered)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not wids.WidsError:
            assert issubclass(obj, wids.WidsError)
            assert len([b for b in obj.__mro__ if b.__module__ == "builtins"]) > 2, name


def test_warnings_can_be_filtered():
    """The warnings wids gives are importable from ``wids`` (a filter needs the class) and are
    the classes the code warns with."""
    import warnings

    from wids.dataset.localcache import CacheThrashWarning
    from wids.storage import RangeFallbackWarning

    assert wids.CacheThrashWarning is CacheThrashWarning
    assert wids.RangeFallbackWarning is RangeFallbackWarning
    with warnings.catch_warnings():
        warnings.simplefilter("error", wids.CacheThrashWarning)
        try:
            warnings.warn("x", CacheThrashWarning, stacklevel=1)
        except wids.CacheThrashWarning:
            pass
        else:
            raise AssertionError("the filter did not apply")


def test_import_has_no_side_effects(tmp_path):
    """No torch/PIL/s3fs import, and no directory created (the reference made /tmp/_wids_cache)."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    code = (
        "import sys; import wids;"
        "heavy = [m for m in ('torch', 'PIL', 's3fs', 'gcsfs', 'aiohttp') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    env = {"HOME": str(home), "TMPDIR": str(tmp), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert list(home.iterdir()) == [] and list(tmp.iterdir()) == []
