"""Writing to any writable fsspec URL: checks on a destination, and publishing files whole.

- :func:`check_writable` refuses, before any work, a scheme wids cannot or will not write
  (``http://``, archives, chained URLs);
- :func:`same_place` and :func:`read_head` let a caller check an output against its inputs
  and against what already exists there (:mod:`wids.index.output` does, for an index);
- :func:`put_file` uploads one file so that readers see the old object or the whole new one:
  a single PUT on object stores (S3, GCS, Azure: an object appears complete or not at all),
  else a temporary name moved into place;
- :func:`destination` hands a writer a local path and, once it has finished, publishes the
  result: in place under :func:`wids.lock.writer_lock` for a local output; for a remote one,
  from a temporary directory: sidecar files first, the main file last (a reader never sees a
  main file whose sidecars are not there yet), then sidecars of a previous version that the
  new one no longer has are removed.

This is the write side of :mod:`wids.storage.source` (which only reads); fsspec is imported lazily.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any

from ..errors import DestinationError, ShardNotFoundError
from .clients import filesystem
from .redact import redact_url
from .source import Store
from .urls import is_remote, local_path

__all__ = ["check_writable", "destination", "put_file", "read_head", "same_place"]

logger = logging.getLogger(__name__)

# fsspec protocols that read only (or that wids will not write through).
_READ_ONLY = frozenset(
    ("http", "https", "zip", "tar", "github", "git", "libarchive", "reference", "jlab")
)
# Object stores: one PUT replaces an object atomically; a "rename" would be copy + delete.
_OBJECT_STORES = frozenset(("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "oss"))


def same_place(a: str, b: str) -> bool:
    """Whether two outputs or inputs name the same file (local paths compared resolved)."""
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


def read_head(url: str, store: Store | None = None, size: int = 65536) -> bytes | None:
    """The first ``size`` bytes of an existing file (fewer if it is smaller); ``None`` if none."""
    src = (store or Store()).source(url)
    try:
        total = src.info().size
        return src.read_range(0, min(total, size))
    except ShardNotFoundError:
        return None
    finally:
        src.close()


def put_file(local: str, url: str, store: Store | None = None) -> None:
    """Upload one local file so that readers of ``url`` see the old object or the whole new one.

    On object stores that is one PUT (or a multipart upload, visible only once completed);
    elsewhere a temporary name beside ``url``, then a rename.
    """
    fs, path = filesystem(url, (store or Store()).options_for(url))
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    _put_whole(fs, local, path, bool(protocols & _OBJECT_STORES))
    fs.invalidate_cache(path)


@contextlib.contextmanager
def destination(
    output: str,
    store: Store | None = None,
    *,
    sidecar_dir: Callable[[str], str] | None = None,
    sidecar_name: re.Pattern[str] | None = None,
    placed: Collection[str] = (),
) -> Iterator[str]:
    """The local path a writer should write; published to ``output`` when the block exits.

    A local ``output`` is written in place (its writer publishes atomically) under an
    exclusive :func:`~wids.lock.writer_lock`. A remote one is written to a temporary
    directory and uploaded when the block exits without an error (see the module docstring).

    Args:
        output: Where the file goes (checked by the caller first).
        store: The storage options for a remote ``output``.
        sidecar_dir: The directory of the main file's sidecars, as a function of the main
            file's path (local or remote); ``None`` when it has none.
        sidecar_name: What a sidecar's file name looks like; others in that directory are
            never removed.
        placed: Names of sidecars already written at their remote place by someone else (a
            build's workers); kept, not removed as stale. Read when the block exits, so the
            caller may fill a set while writing.

    Yields:
        A local path ending like ``output``.

    Raises:
        LockTimeoutError: Another writer of the same local output is running.
    """
    from ..lock import writer_lock

    if not is_remote(output):
        with writer_lock(local_path(output), timeout=0):
            yield local_path(output)
        return
    with tempfile.TemporaryDirectory(prefix="wids-index-") as tmp:
        path = os.path.join(tmp, output.rstrip("/").rsplit("/", 1)[-1])
        yield path
        _publish(path, output, store, sidecar_dir, sidecar_name, placed)


def _publish(
    local: str,
    url: str,
    store: Store | None,
    sidecar_dir: Callable[[str], str] | None,
    sidecar_name: re.Pattern[str] | None,
    placed: Collection[str] = (),
) -> None:
    fs, path = filesystem(url, (store or Store()).options_for(url))
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    atomic_put = bool(protocols & _OBJECT_STORES)
    names: list[str] = []
    if sidecar_dir is not None:
        members, rmembers = sidecar_dir(local), sidecar_dir(path)
        if os.path.isdir(members):
            names = sorted(os.listdir(members))
        if names:
            fs.put([os.path.join(members, n) for n in names], [f"{rmembers}/{n}" for n in names])
    _put_whole(fs, local, path, atomic_put)
    logger.debug("published %s (%d sidecars)", redact_url(url), len(names))
    if sidecar_dir is not None and sidecar_name is not None:
        _remove_stale(fs, sidecar_dir(path), set(names) | set(placed), sidecar_name)
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


def _remove_stale(fs: Any, directory: str, keep: set[str], pattern: re.Pattern[str]) -> None:
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
