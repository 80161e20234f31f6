"""The exceptions wids raises.

Every error derives from :class:`WidsError` and also from the builtin exception a caller would
naturally catch, so ``except FileNotFoundError`` and ``except WidsError`` both work::

    WidsError(Exception)
    ├── TarFormatError(ValueError)            the bytes are not a valid tar
    │   ├── TruncatedTarError                 the archive ends inside a header or a member
    │   ├── CompressedDataError               a compressed shard's bytes do not decode
    │   └── HeaderChecksumError               a header's checksum does not match
    ├── SampleLayoutError(ValueError)         members do not group into samples cleanly
    ├── SampleTooLargeError(ValueError)       a sample is over the dataset's max_sample_bytes
    ├── ExclusionError(ValueError)            an exclusion list is malformed or names no sample
    ├── ColumnError(ValueError)               a metadata column or filter expression is unusable
    ├── IndexFormatError(ValueError)          an index or dataset description is malformed
    │   ├── NotAnIndexError                   the file is no index at all (nothing to repair)
    │   ├── UntrustedLocationError            a remote index names a local file (not allowed)
    │   └── PipeCommandError                  a ``pipe:`` shard URL wids does not map (never run)
    ├── IndexMismatchError(ValueError)        a shard changed since it was indexed
    ├── ShardNotFoundError(FileNotFoundError) a shard (or index) does not exist
    ├── RemoteError(OSError)                  reading from storage failed
    │   ├── PermanentRemoteError              retrying cannot help (403, 416, no bucket ...)
    │   │   ├── TooLargeError                 a whole-file read over its kind's bound
    │   │   └── RangeNotSupportedError        the server ignores Range (sends the whole file)
    │   ├── RetriesExhaustedError             transient failures outlasted the retry policy
    │   ├── ShortReadError                    fewer bytes arrived than were asked for
    │   └── CorruptReadError                  bytes arrived that are not the ones asked for
    ├── CacheError(OSError)                   the local shard cache cannot serve a request
    │   ├── CacheBudgetError                  an entry is larger than the cache's byte budget
    │   ├── CacheDirError                     a directory wids may not use as its cache
    │   └── OfflineError                      offline mode, and the data is not local
    ├── LockTimeoutError(TimeoutError)        a file lock was not acquired in time
    ├── OutputExistsError(FileExistsError)    writing would replace a file wids did not create
    ├── WriteError(OSError)                   a file cannot be written (disk full, read-only ...)
    │   └── WritePermissionError(PermissionError)   permission denied
    ├── DestinationError(ValueError)          an output wids cannot write (read-only scheme ...)
    ├── EncodeError(ValueError)               a field's value cannot be encoded by its extension
    ├── DecodeError(ValueError)               a field could not be decoded
    │   └── UnsafeDecodeError                 decoding would unpickle; not enabled
    ├── SamplerStateError(ValueError)         a sampler state from other data or other settings
    └── SamplerWrappedError(RuntimeError)     a framework re-split a per-rank sampler's indices

Errors that concern one shard carry its URL (with credentials removed) in ``.shard``.
"""

from __future__ import annotations

import contextlib
import copy
import errno as _errno
from collections.abc import Iterator
from typing import Any

__all__ = [
    "CacheBudgetError",
    "CacheDirError",
    "CacheError",
    "ColumnError",
    "CompressedDataError",
    "CorruptReadError",
    "DecodeError",
    "DestinationError",
    "EncodeError",
    "ExclusionError",
    "HeaderChecksumError",
    "IndexFormatError",
    "IndexMismatchError",
    "LockTimeoutError",
    "NotAnIndexError",
    "OfflineError",
    "OutputExistsError",
    "PermanentRemoteError",
    "PipeCommandError",
    "RangeNotSupportedError",
    "RemoteError",
    "RetriesExhaustedError",
    "SampleLayoutError",
    "SampleTooLargeError",
    "SamplerStateError",
    "SamplerWrappedError",
    "ShardNotFoundError",
    "ShortReadError",
    "TarFormatError",
    "TooLargeError",
    "TruncatedTarError",
    "UnsafeDecodeError",
    "UntrustedLocationError",
    "WidsError",
    "WriteError",
    "WritePermissionError",
]


class WidsError(Exception):
    """Root of every error raised by wids.

    Args:
        message: What went wrong, in one line.
        shard: The shard (or index) URL concerned, credentials removed; ``None`` if none.
    """

    def __init__(self, message: str, *, shard: str | None = None) -> None:
        self.shard = shard
        self.message = message
        super().__init__(f"{shard}: {message}" if shard else message)

    def __reduce__(self) -> tuple[Any, ...]:  # keep errors picklable across DataLoader workers
        return (_rebuild, (type(self), self.message, self.shard, self.__dict__))


def _rebuild(
    cls: type[WidsError], message: str, shard: str | None, state: dict[str, Any]
) -> WidsError:
    err = cls.__new__(cls)
    WidsError.__init__(err, message, shard=shard)
    err.__dict__.update(state)
    return err


class TarFormatError(WidsError, ValueError):
    """The bytes of a shard are not a valid tar archive.

    Attributes:
        offset: Byte offset in the shard where the problem was found, if known.
    """

    def __init__(self, message: str, *, shard: str | None = None, offset: int | None = None):
        self.offset = offset
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{message}{where}", shard=shard)


class TruncatedTarError(TarFormatError):
    """The archive ends inside a header or inside a member's data."""


class CompressedDataError(TarFormatError):
    """A compressed shard's bytes do not decode (corrupt or truncated gzip or zstd data).

    ``offset`` is the byte of the compressed file where decoding started or failed.
    """

    def for_shard(self, shard: str | None) -> CompressedDataError:
        """The same error, naming ``shard`` (codecs raise it without: they do no I/O)."""
        err = copy.copy(self)
        WidsError.__init__(err, self.message, shard=shard)
        return err


class HeaderChecksumError(TarFormatError):
    """A tar header's stored checksum does not match its bytes."""


class SampleLayoutError(WidsError, ValueError):
    """Members of a shard do not group into samples cleanly.

    Raised for a key that reappears after other keys, or a field that appears twice in one
    sample, unless a different ``duplicates`` policy was chosen.

    Attributes:
        problem: What is wrong, without the advice (the message adds it, in Python's terms).
        policies: The ``duplicates`` policies that accept this layout.
        sortable: Writing the tar sorted by name (``tar --sort=name``) would fix it.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: str | None = None,
        policies: tuple[str, ...] = (),
        sortable: bool = False,
    ) -> None:
        self.problem, self.policies, self.sortable = message, policies, sortable
        advice = []
        if policies:
            names = " or ".join(repr(p) for p in policies)
            advice.append(f"pass duplicates={names} to accept this")
        if sortable:
            advice.append("write the tar sorted by name (tar --sort=name)")
        super().__init__(
            "; ".join([message, ", or ".join(advice)] if advice else [message]), shard=shard
        )


class ExclusionError(WidsError, ValueError):
    """An exclusion (``ShardListDataset(exclude=...)``, ``wids subset --exclude``) is refused.

    An entry is not a key, ``shard/key`` pair or sample number; a shard name matches several
    shards; or, with ``strict``, entries name no sample of the dataset.
    """


class ColumnError(WidsError, ValueError):
    """A sample metadata column cannot be collected, stored or used.

    A malformed column spec or filter expression, a value of the wrong type (naming the shard
    and sample), a column the index does not have, or columns written by a newer wids.
    """


class SampleTooLargeError(WidsError, ValueError):
    """A sample's bytes are more than the dataset's ``max_sample_bytes`` (default 1 GiB).

    ``ds[i]`` reads a sample into memory whole; a sample larger than the bound (a crafted
    64 GiB member, or a long video) is refused before anything is read, naming the shard, the
    key and the size. Large members need streaming reads instead; or raise the bound
    (``ShardListDataset(..., max_sample_bytes=...)``, ``None`` for none).

    Attributes:
        key: The sample's key.
        size: The sample's bytes (from its first member's data to its last member's end).
    """

    key: str = ""
    size: int = 0


class IndexFormatError(WidsError, ValueError):
    """An index file or dataset description is malformed or of an unknown version."""


class NotAnIndexError(IndexFormatError):
    """The file is not an index at all: neither a wids index nor a reference description.

    Raised when a file given as an index (or found where an index should go) is, for example,
    a user's JSON config or an unrelated SQLite database. It never was an index, so no repair
    hint is given, and ``wids index create`` refuses to write over it.
    """


class UntrustedLocationError(IndexFormatError):
    """An index read from a remote location names a local file, path or in-process store.

    Refused unless the caller passes ``allow_local_shards=True`` (``--allow-local-shards``):
    a crafted index must not make wids serve or copy the user's files.
    """


class PipeCommandError(IndexFormatError):
    """A ``pipe:`` shard URL (written for webdataset) that is not one of the known fetches.

    wids never runs shell commands: only ``curl``, ``gsutil cat``, ``gcloud storage cat`` and
    ``aws s3 cp URL -`` of one URL, in their plain forms, are read as the URL they fetch.
    """


class IndexMismatchError(WidsError, ValueError):
    """A shard differs (size, etag, checksum) from what the index recorded."""


class ShardNotFoundError(WidsError, FileNotFoundError):
    """A shard or index file does not exist."""


class RemoteError(WidsError, OSError):
    """Reading from storage failed."""


class PermanentRemoteError(RemoteError):
    """A failure that retrying cannot fix (access denied, bad range, no such bucket)."""


class TooLargeError(PermanentRemoteError):
    """A file read whole (an index, a member table) is larger than the bound for its kind.

    The bounds are :class:`wids.ReadLimits`; the file is refused from its announced size, or
    once its body passes the bound, never read whole.
    """


class RangeNotSupportedError(PermanentRemoteError):
    """The server answered a range request with the whole file: it ignores ``Range``.

    ``python -m http.server`` is such a server. Index building then streams each shard once,
    and the dataset reads whole shards instead (see ``docs/storage.md``); this error reaches
    the caller only where neither is possible (a shard over the in-memory bound, for one).
    """


class RetriesExhaustedError(RemoteError):
    """Transient failures went on past the retry policy's count or time budget."""


class ShortReadError(RemoteError):
    """Storage returned fewer bytes than were requested."""


class CorruptReadError(RemoteError):
    """Storage answered with bytes that are not the ones asked for.

    A range read whose tar header (the 512 bytes before a sample's first member) is not that
    member's, or whose ``Content-Range`` is not the range requested: a server, proxy or cache
    layer sent bytes from elsewhere. Retried like a transient failure, then raised.
    """


class CacheError(WidsError, OSError):
    """The local shard cache cannot serve a request."""


class CacheBudgetError(CacheError):
    """A shard is larger than the cache's whole byte budget."""


class CacheDirError(CacheError):
    """A directory that wids may not use as a cache.

    Raised for a non-empty directory without the wids mark (wids writes to and deletes from
    only directories it created), a mark from an unknown layout version, and a subdirectory
    of the layout that is a symbolic link or not a directory.
    """


class OfflineError(CacheError):
    """Offline mode is on and the requested data is not available locally."""


class LockTimeoutError(WidsError, TimeoutError):
    """A file lock was not acquired within its timeout."""


class OutputExistsError(WidsError, FileExistsError):
    """Writing an output would replace a file that wids did not create in this run.

    Raised, for example, by ``wids subset`` when the destination already holds files of the
    names it would write, or is part of the source dataset, and by ``wids index create`` when
    the output is one of the shards, a directory, or a file that is not an index.
    """


class WriteError(WidsError, OSError):
    """A file could not be written (no space left, a quota, a read-only file system ...).

    Also a file too large, and permission denied (:class:`WritePermissionError`). The message
    names the file and its directory (a shard, an index, a cache entry) and the reason;
    ``errno`` is the system's error number (``errno.ENOSPC`` ...). Files wids was writing are
    removed; nothing half-written is published.
    """

    def __init__(self, message: str, *, shard: str | None = None, errno: int | None = None):
        super().__init__(message, shard=shard)
        self.errno = errno

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_write, (type(self), self.message, self.shard, self.errno))


def _rebuild_write(
    cls: type[WriteError], message: str, shard: str | None, errno: int | None
) -> WriteError:
    return cls(message, shard=shard, errno=errno)


class WritePermissionError(WriteError, PermissionError):
    """Writing a file was refused by the system (``EACCES``/``EPERM``): permission denied."""


class DestinationError(WidsError, ValueError):
    """An output that wids cannot or must not write.

    A read-only or chained URL scheme (``http://``), or a name that selects no index format.
    Raised before any work is done. (Refusing to replace a file is :class:`OutputExistsError`.)
    """


class EncodeError(WidsError, ValueError):
    """A sample's field cannot be written: its value's type does not fit its extension.

    Raised by :class:`~wids.encode.Encoder` (for example an ``int`` for a ``.jpg`` field, or a
    pickling extension without ``allow_pickle=True``); the message names the key and field.
    """


class DecodeError(WidsError, ValueError):
    """A field's bytes could not be decoded."""


class UnsafeDecodeError(DecodeError):
    """Decoding the field would unpickle data (which can run code), and that is not enabled."""


class SamplerStateError(WidsError, ValueError):
    """A sampler state cannot be loaded into this sampler.

    Raised by ``load_state_dict`` for something that is not a sampler state, a state saved
    over other data (other shard lengths or range), or with settings that give another order
    (chunking, shuffling, partition, ``drop_last``, mixing); the message names the setting.
    A state saved on another number of ranks is not an error: it resumes elastically.
    """


class SamplerWrappedError(WidsError, RuntimeError):
    """A training framework split a per-rank sampler's indices across ranks a second time.

    :class:`~wids.DistributedChunkedSampler` already gives each rank its own share of the
    epoch; a wrapper that keeps only every ``R``-th batch of that share (HF Accelerate's
    ``BatchSamplerShard``, from ``accelerator.prepare(loader)``) would silently drop
    ``(R - 1) / R`` of the samples. Raised when the sampler is first iterated under such a
    wrapper; the message says what to do instead.
    """


_WRITE_REASONS = {
    _errno.ENOSPC: "no space left on the device",
    _errno.EDQUOT: "disk quota exceeded",
    _errno.EROFS: "read-only file system",
    _errno.EFBIG: "file too large",
    _errno.EACCES: "permission denied",
    _errno.EPERM: "operation not permitted",
}


def write_error(
    error: BaseException, where: str, directory: str | None = None
) -> WriteError | None:
    """The :class:`WriteError` for ``error`` raised while writing ``where``; ``None`` if other.

    A system error of writing (``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EFBIG``, ``EACCES``,
    ``EPERM``) or SQLite's "database or disk is full" becomes one; anything else (a wids error,
    a bug) is left alone. The message names the file the system named (else ``where``) and its
    directory.

    Args:
        error: What was raised.
        where: The output being written (a shard, an index, a cache entry; credentials
            removed), the error's ``shard``.
        directory: The directory written in, when the system names no file (a cache's).
    """
    import os

    if isinstance(error, WidsError):
        return None
    if isinstance(error, OSError) and error.errno in _WRITE_REASONS:
        code = error.errno
    elif type(error).__module__ == "sqlite3" and "disk is full" in str(error):
        code = _errno.ENOSPC
    else:
        return None
    name = getattr(error, "filename", None)
    target = os.fsdecode(name) if isinstance(name, (str, bytes)) else where
    folder = directory or (os.path.dirname(os.path.abspath(target)) if "://" not in target else "")
    cls = WritePermissionError if code in (_errno.EACCES, _errno.EPERM) else WriteError
    what = "cannot write" if target == where else f"cannot write {target}"
    message = f"{what}: {_WRITE_REASONS[code]}" + (f" in {folder}" if folder else "")
    return cls(message, shard=where, errno=code)


@contextlib.contextmanager
def writing(where: str, directory: str | None = None) -> Iterator[None]:
    """Raise :func:`write_error`'s typed error for a failure of writing inside the block."""
    try:
        yield
    except Exception as e:
        typed = write_error(e, where, directory)
        if typed is None:
            raise
        raise typed from e
