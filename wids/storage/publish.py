"""Where an index is written: checks on the output, and publishing to any writable fsspec URL.

Index writers (:mod:`wids.index.jsonfile`, :mod:`wids.index.sqlitefile`) write local files. For an
output such as ``s3://bucket/train.json``, :func:`index_destination` hands the writer a path in
a temporary directory and, once the writer has closed, uploads the result:

- member-table sidecars first, the description last, so a reader never sees a description
  whose sidecars are not there yet;
- the description (or SQLite file) in one operation a reader sees whole: a single PUT on
  object stores (S3, GCS, Azure: an object appears complete or not at all), else a temporary
  name moved into place;
- sidecars of a previous build that the new description no longer names are removed last.

:func:`check_output` runs before any scanning: a read-only scheme (``http://``), an output
equal to one of the shards, or an existing file that is not an index is refused with one
line, so nothing a user made is ever overwritten. Local outputs are guarded by
:func:`wids.lock.writer_lock`, which leaves no lock file behind.

This is the write side of :mod:`wids.storage.source` (which only reads); fsspec is imported lazily.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import DestinationError, OutputExistsError, ShardNotFoundError
from .redact import redact_url
from .source import Store

__all__ = [
    "SQLITE_SUFFIXES",
    "check_output",
    "check_writable",
    "index_destination",
    "is_remote",
    "local_path",
    "output_dir",
    "put_file",
    "stored_url",
]

logger = logging.getLogger(__name__)

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
"""File name endings that select the SQLite backend; ``.json`` selects JSON."""

# fsspec protocols that read only (or that wids will not write through).
_READ_ONLY = frozenset(
    ("http", "https", "zip", "tar", "github", "git", "libarchive", "reference", "jlab")
)
# Object stores: one PUT replaces an object atomically; a "rename" would be copy + delete.
_OBJECT_STORES = frozenset(("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "oss"))
_HEAD_BYTES = 65536
_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_remote(url: str) -> bool:
    """Whether ``url`` names something other than a local file (``file://`` is local)."""
    return ("://" in url or "::" in url) and not url.startswith("file://")


def local_path(url: str) -> str:
    """A local output as a plain path (``file://`` removed)."""
    return url.removeprefix("file://")


def output_dir(url: str) -> str:
    """The directory of an output: an absolute local path, or a URL."""
    if is_remote(url):
        return url.rpartition("/")[0]
    return os.path.dirname(os.path.abspath(local_path(url)))


def stored_url(url: str, out_dir: str) -> str:
    """How an index in ``out_dir`` records a shard: relative when inside that directory.

    Args:
        url: The shard, as given or resolved (a path, ``file://`` path, or URL).
        out_dir: The index's directory: an absolute local path or a URL (``s3://bucket/x``).

    Example:
        >>> stored_url("s3://bucket/data/train-0.tar", "s3://bucket/data")
        'train-0.tar'
    """
    if is_remote(url):
        prefix = out_dir.rstrip("/") + "/"
        if is_remote(out_dir) and url.startswith(prefix) and "?" not in url:
            return url[len(prefix) :]
        return url
    path = os.path.abspath(local_path(url))
    if is_remote(out_dir):
        return "file://" + path  # a bare "/x" would resolve against the remote index's host
    rel = os.path.relpath(path, out_dir)
    return path if rel.startswith("..") else rel


def _same_place(a: str, b: str) -> bool:
    if is_remote(a) or is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(local_path(a)) == os.path.realpath(local_path(b))


def _check_scheme(output: str) -> None:
    import fsspec

    if "::" in output:
        raise DestinationError(
            "cannot write an index through a chained URL; give the target URL itself",
            shard=redact_url(output),
        )
    protocol = output.split("://", 1)[0].lower()
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as e:
        raise DestinationError(f"cannot write there: {e}", shard=redact_url(output)) from None
    from fsspec.archive import AbstractArchiveFileSystem

    names = {cls.protocol} if isinstance(cls.protocol, str) else set(cls.protocol)
    if protocol in _READ_ONLY or names & _READ_ONLY or issubclass(cls, AbstractArchiveFileSystem):
        raise DestinationError(
            f"{protocol}:// is read-only for wids; write the index to a local path or a "
            "writable store (s3://, gs://, ...) and serve it from there",
            shard=redact_url(output),
        )


def check_writable(url: str) -> None:
    """Refuse a destination URL that wids cannot or will not write (local paths pass).

    Raises:
        DestinationError: A read-only (``http://``), archive or chained scheme, or an unknown one.
    """
    if is_remote(url):
        _check_scheme(url)


def put_file(local: str, url: str, store: Store | None = None) -> None:
    """Upload one local file so that readers of ``url`` see the old object or the whole new one.

    On object stores that is one PUT (or a multipart upload, visible only once completed);
    elsewhere a temporary name beside ``url``, then a rename.
    """
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **dict((store or Store()).storage_options))
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    _put_whole(fs, local, path, bool(protocols & _OBJECT_STORES))
    fs.invalidate_cache(path)


def _looks_like_index(head: bytes, sqlite: bool) -> bool:
    """Whether the first bytes of a file are those of an index (ours or the reference's).

    A damaged index still counts (``index create --full`` repairs it); a file of the user's
    that merely has the same name does not.
    """
    if sqlite:
        return head.startswith(_SQLITE_MAGIC) and b"shards" in head and b"members" in head
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text.startswith(b"{") and any(
        key in text for key in (b'"__kind__"', b'"wids_index"', b'"shardlist"')
    )


def _check_existing(output: str, store: Store | None) -> None:
    where = redact_url(output)
    if not is_remote(output) and os.path.isdir(local_path(output)):
        raise OutputExistsError("is a directory; name the index file: train.json", shard=where)
    src = (store or Store()).source(output)
    try:
        size = src.info().size
        head = src.read_range(0, min(size, _HEAD_BYTES))
    except ShardNotFoundError:
        return
    finally:
        src.close()
    if not _looks_like_index(head, output.lower().endswith(SQLITE_SUFFIXES)):
        raise OutputExistsError(
            "exists and is not a wids index; not overwriting it (remove it or choose another name)",
            shard=where,
        )


def check_output(output: str, shards: Sequence[str], store: Store | None = None) -> None:
    """Refuse, before any work, an output that cannot or must not be written.

    Args:
        output: The index to write: a local path or a URL.
        shards: The shards that will be read (none of them may be the output).
        store: The storage options (and retry policy) for a remote output.

    Raises:
        DestinationError: Unknown suffix, read-only or chained scheme.
        OutputExistsError: The output is one of the shards, a directory, or an existing file
            that is not an index.
    """
    if not output.lower().split("?", 1)[0].endswith((".json", *SQLITE_SUFFIXES)):
        raise DestinationError(
            f"index file must end in .json or {'/'.join(SQLITE_SUFFIXES)}",
            shard=redact_url(output),
        )
    if is_remote(output):
        _check_scheme(output)
    for shard in shards:
        if _same_place(shard, output):
            raise OutputExistsError(
                "is one of the shards to index; not overwriting it", shard=redact_url(output)
            )
    _check_existing(output, store)


@contextlib.contextmanager
def index_destination(output: str, store: Store | None = None) -> Iterator[str]:
    """The local path an index writer should write; published to ``output`` when done.

    A local ``output`` is written in place (its writer publishes atomically) under an
    exclusive :func:`~wids.lock.writer_lock`. A remote one is written to a temporary
    directory and uploaded when the block exits without an error (see the module docstring).

    Args:
        output: Where the index goes (checked with :func:`check_output` first).
        store: The storage options for a remote ``output``.

    Yields:
        A local path ending like ``output``.

    Raises:
        LockTimeoutError: Another writer of the same local index is running.
    """
    from ..lock import writer_lock

    if not is_remote(output):
        with writer_lock(local_path(output), timeout=0):
            yield local_path(output)
        return
    with tempfile.TemporaryDirectory(prefix="wids-index-") as tmp:
        path = os.path.join(tmp, output.rstrip("/").rsplit("/", 1)[-1])
        yield path
        _publish(path, output, store)


def _publish(local: str, url: str, store: Store | None) -> None:
    import fsspec

    from ..index import _SIDECAR_NAME, _members_dir

    fs, path = fsspec.core.url_to_fs(url, **dict((store or Store()).storage_options))
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    atomic_put = bool(protocols & _OBJECT_STORES)
    members, rmembers = _members_dir(local), _members_dir(path)
    names: list[str] = []
    if not local.lower().endswith(SQLITE_SUFFIXES) and os.path.isdir(members):
        names = sorted(os.listdir(members))
        if names:
            fs.put([os.path.join(members, n) for n in names], [f"{rmembers}/{n}" for n in names])
    _put_whole(fs, local, path, atomic_put)
    logger.debug("published %s (%d sidecars)", redact_url(url), len(names))
    if names or local.lower().endswith(".json"):
        _remove_stale(fs, rmembers, set(names), _SIDECAR_NAME)
    fs.invalidate_cache()


def _put_whole(fs: Any, local: str, path: str, atomic_put: bool) -> None:
    """Put one file so that readers see the old object or the whole new one."""
    if atomic_put:
        fs.put_file(local, path)
        return
    head, _, name = path.rpartition("/")
    tmp = f"{head}/.{name}.{uuid.uuid4().hex[:12]}.tmp" if head else f".{name}.tmp"
    fs.put_file(local, tmp)
    try:
        fs.mv(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm_file(tmp)
        raise


def _remove_stale(fs: Any, directory: str, keep: set[str], pattern: Any) -> None:
    try:
        listed = fs.ls(directory, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return
    stale = [
        p
        for p in listed
        if pattern.match(p.rstrip("/").rsplit("/", 1)[-1])
        and p.rstrip("/").rsplit("/", 1)[-1] not in keep
    ]
    if stale:
        fs.rm(stale)
