"""All fsspec I/O: stat, exact range reads, sequential streams, downloads, timeouts.

A :class:`Store` carries the storage options, the retry policy and the I/O counters; a
:class:`Source` (``store.source(url)``) is one file reachable through fsspec (or a plain local
path) read under its store. It keeps only ``(url, store)``; its filesystem (or, for local
files, a file descriptor read with ``os.pread``) is opened lazily in each process and dropped
when pickled.

Every remote request runs under a :class:`~wids.storage.retry.RetryPolicy`: failures are sorted
into *not found*, *permanent* and *transient* (retried with backoff) as
:mod:`wids.storage.retry` describes; the asynchronous retry loop, which drives fsspec's event
loop, is here.

Range reads are checked end to end where the transport lets us: over HTTP and S3 each answer's
``Content-Range`` must be the range asked for (and its total the shard's known size), and a
caller's ``check`` (the dataset's tar-header check) must accept the bytes; a wrong answer is
:class:`~wids.errors.CorruptReadError`, retried like a transient failure. A source knows the
version of the file it reads (``etag``, from the index or else from its first answer): over
HTTP every range request carries ``If-Match`` that etag and over S3 ``IfMatch``, and an answer
with another etag is refused, so a file replaced while it is read raises
:class:`~wids.errors.IndexMismatchError` instead of mixing bytes of two versions. Other stores
(GCS, chained URLs) are read with fsspec's ``_cat_file``, which exposes neither.

Exceptions that are none of these (programming errors) propagate unchanged. Error messages
never contain credentials: URLs are passed through :func:`~wids.storage.redact.redact_url` and
secret values of the storage options are masked; the backend's exception is described, not chained.
:class:`RetryPolicy` and :func:`redact_url` are re-exported from here.
"""

from __future__ import annotations

import asyncio
import errno
import importlib
import io
import os
import shutil
import stat as stat_mod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from types import MappingProxyType
from typing import Any, BinaryIO, TypeVar

import fsspec
import fsspec.asyn

from ..errors import (
    CorruptReadError,
    IndexMismatchError,
    PermanentRemoteError,
    ShardNotFoundError,
    ShortReadError,
)
from .redact import _secret_values, redact_url
from .retry import RetryPolicy, _Attempts, _retry_sync
from .retry import _classify as _classify  # tests import it from here

__all__ = [
    "FileStat",
    "IOStats",
    "RetryPolicy",
    "Source",
    "Store",
    "comparable_etag",
    "is_local",
    "read_ranges",
    "redact_url",
]

T = TypeVar("T")
Check = Callable[[bytes], "str | None"]
"""A check of the bytes of one range read: ``None`` if they are right, else what is wrong."""

_LOCAL_BLOCK = 1 << 20
_REMOTE_BLOCK = 16 << 20
_HTTP_CHUNK = 1 << 20  # one timed read from the streaming response


@dataclass
class IOStats:
    """Mutable I/O counters; keep one per dataset per process.

    Attributes:
        requests: Attempts made (every retry is one more request).
        bytes_read: Payload bytes received and accepted.
        retries: Attempts repeated after a transient failure.
        errors: Operations that ended by raising an error to the caller.
    """

    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class FileStat:
    """What one stat of a file says.

    Attributes:
        size: Size in bytes.
        etag: The storage's entity tag (quotes removed), if it has one.
        mtime: Modification time as a POSIX timestamp, if known.
    """

    size: int
    etag: str | None
    mtime: float | None


# ---------------------------------------------------------------------------------------------
# Local paths


def is_local(url: str) -> bool:
    """Whether ``url`` is a plain local path or a ``file://`` URL."""
    if url.startswith("file://"):
        return True
    return "://" not in url and "::" not in url


def _local_path(url: str) -> str:
    path = url[len("file://") :] if url.startswith("file://") else url
    return os.path.abspath(os.path.expanduser(path))


async def _start_session(fs: Any) -> None:
    """Create the backend's client before the first timed attempt.

    Creating it is mostly CPU work (botocore loads its service models: ~0.5 s, more on a busy
    machine) that blocks the event loop, so a per-attempt timeout cannot cut it short anyway;
    counted against the first attempt it would only cause spurious timeouts.
    """
    for name in ("set_session", "_set_session"):
        setter = getattr(fs, name, None)
        if setter is not None and asyncio.iscoroutinefunction(setter):
            await setter()
            return


_timeout_cm = getattr(asyncio, "timeout", None)


async def _retry_async(
    attempts: _Attempts, fn: Callable[[], Awaitable[T]], size: Callable[[T], int], fs: Any
) -> T:
    while True:
        timeout = attempts.begin()
        try:
            await _start_session(fs)
            # asyncio.timeout (3.11+) bounds the attempt without wrapping it in a new task,
            # which wait_for does: a measurable cost at thousands of ranges per second.
            if _timeout_cm is not None:
                async with _timeout_cm(timeout):
                    result = await fn()
            else:
                result = await asyncio.wait_for(fn(), timeout)
        except Exception as exc:
            await asyncio.sleep(attempts.failed(exc))
            continue
        attempts.done(size(result))
        return result


def _nbytes(data: bytes) -> int:
    return len(data)


def _zero(_: object) -> int:
    return 0


def _check_length(source: Source, data: bytes, start: int, end: int) -> bytes:
    n = end - start
    if len(data) < n:
        raise ShortReadError(
            f"range {start}-{end}: got {len(data)} of {n} bytes", shard=redact_url(source.url)
        )
    if len(data) > n:
        raise PermanentRemoteError(
            f"range {start}-{end}: got {len(data)} bytes for {n}; the server ignores Range",
            shard=redact_url(source.url),
        )
    return data


def _no_such_file(path: str) -> str:
    """Say "no such file", and why when the name holds a wildcard the shell did not expand."""
    if any(c in path for c in "*?["):
        return (
            "no such file (wildcards like * are not expanded here: let the shell expand them, "
            "list the files, or use a brace pattern such as train-{000000..000009}.tar)"
        )
    return "no such file"


def _check_range(start: int, end: int) -> None:
    if not (isinstance(start, int) and isinstance(end, int)):
        raise TypeError(f"start and end must be int, not {type(start)} and {type(end)}")
    if start < 0 or end < start:
        raise ValueError(f"bad range {start}-{end}")


# ---------------------------------------------------------------------------------------------
# Default storage options that make the backends honour our timeouts and leave retries to us


def _with_defaults(url: str, options: Mapping[str, Any], policy: RetryPolicy) -> dict[str, Any]:
    if "::" in url:
        return dict(options)
    protocol = url.split("://", 1)[0].lower()
    opts = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("connect_timeout", policy.timeout)
        config.setdefault("read_timeout", policy.timeout)
        config.setdefault("retries", {"total_max_attempts": 1})  # our loop retries, not botocore
        config.setdefault("max_pool_connections", 32)  # botocore's 10 would queue read_ranges
        opts["config_kwargs"] = config
    elif protocol in ("http", "https"):
        client = dict(opts.get("client_kwargs") or {})
        if "timeout" not in client:
            aiohttp = importlib.import_module("aiohttp")  # what fsspec's HTTP filesystem needs
            client["timeout"] = aiohttp.ClientTimeout(
                total=None, sock_connect=policy.timeout, sock_read=policy.timeout
            )
        opts["client_kwargs"] = client
    elif protocol in ("gs", "gcs"):
        opts.setdefault("requests_timeout", policy.timeout)
    return opts


def _mtime(info: Mapping[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "Last-Modified", "updated", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        try:
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, datetime):
                return value.timestamp()
            if isinstance(value, str):
                if value[:1].isdigit():
                    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
                return parsedate_to_datetime(value).timestamp()
        except (ValueError, TypeError, OverflowError):
            continue
    return None


def comparable_etag(etag: str | None) -> str | None:
    """An etag reduced to what identifies the bytes: no weak ``W/`` prefix, no quotes.

    Backends and proxies disagree on quoting and weakness for the same object; compare etags
    (index vs storage vs cache record) only through this.
    """
    if etag is None:
        return None
    return etag.strip().removeprefix("W/").strip('"')


def _etag(info: Mapping[str, Any]) -> str | None:
    for key in ("ETag", "etag", "Etag", "generation", "md5Hash"):
        value = info.get(key)
        if value:
            text = str(value)
            weak = text.startswith("W/")
            return ("W/" if weak else "") + text[2 if weak else 0 :].strip('"')
    return None


# ---------------------------------------------------------------------------------------------
# Source


class Store:
    """Where files are read from: fsspec storage options, the retry policy and I/O counters.

    The one object that carries these three down to the I/O layer; :meth:`source` opens a file
    under them. It is built once at the edge (a dataset, an index build, a CLI command) from the
    public ``storage_options=`` and ``retry=`` arguments. The options and the policy do not
    change; ``stats`` counts this process's requests: a pickled store carries
    ``(storage_options, retry)`` and starts new counters in the process that unpickles it.

    Args:
        storage_options: Passed to ``fsspec.url_to_fs``; ignored for local files.
        retry: The retry policy; the default when ``None``.
        stats: The counters to add to; new ones when ``None``.

    Example:
        >>> store = Store({"anon": True})
        >>> store.source("s3://bucket/shard-000.tar").read_range(512, 1024)  # doctest: +SKIP
    """

    __slots__ = ("_options", "_retry", "stats")

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        *,
        stats: IOStats | None = None,
    ) -> None:
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        self._options: dict[str, Any] = dict(storage_options or {})
        self._retry = retry if retry is not None else RetryPolicy()
        self.stats = stats if stats is not None else IOStats()

    @classmethod
    def of(cls, store: Store | Mapping[str, Any] | None, retry: RetryPolicy | None = None) -> Store:
        """``store`` itself if it is a :class:`Store`, else a store of these storage options.

        Public functions take ``storage_options=`` (a mapping); inside wids the same parameter
        may carry a store, which then passes through unchanged (with its counters).
        """
        if isinstance(store, Store):
            if retry is None or retry == store.retry:
                return store
            return cls(store.storage_options, retry, stats=store.stats)
        return cls(store, retry)

    def with_stats(self, stats: IOStats | None = None) -> Store:
        """The same options and retry policy, counting into ``stats`` (new counters if ``None``)."""
        return Store(self._options, self._retry, stats=stats)

    @property
    def storage_options(self) -> Mapping[str, Any]:
        """The fsspec options (read-only)."""
        return MappingProxyType(self._options)

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of every request."""
        return self._retry

    def secrets(self) -> list[str]:
        """The secret values of the storage options, to mask in messages."""
        return _secret_values(self._options)

    def source(self, url: str, *, size: int | None = None, etag: str | None = None) -> Source:
        """A :class:`Source` for ``url`` read under this store (see :class:`Source`)."""
        return Source(url, self, size=size, etag=etag)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Store, (self._options, self._retry))

    def __repr__(self) -> str:
        return f"Store(options={sorted(self._options)}, retry={self._retry!r})"


class Source:
    """One file reachable through fsspec, or a local path.

    Args:
        url: A local path, ``file://`` URL, or any fsspec URL (``s3://``, ``https://``,
            ``gs://``, ``memory://``, chained ``a::b`` ...).
        store: The storage options, retry policy and default I/O counters to read under;
            ``Store()`` (no options, the default policy) when ``None``.
        size: The file's size as recorded (the index's), if known: an answer announcing
            another total size is refused.
        etag: The version to read (the index's etag), if known; otherwise the etag of the
            first answer is kept (``.etag``). Reads are conditional on it where the store
            allows (HTTP ``If-Match``, S3 ``IfMatch``).

    Operations take an optional ``stats``; without one they count into ``store.stats``.

    Example:
        >>> src = Store({"anon": True}).source("s3://bucket/shard-000.tar")  # doctest: +SKIP
        >>> src.read_range(512, 1024)  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        store: Store | None = None,
        *,
        size: int | None = None,
        etag: str | None = None,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError(f"url must be a non-empty str, not {url!r}")
        if store is not None and not isinstance(store, Store):
            raise TypeError(f"store must be a Store, not {type(store).__name__}")
        self.url = url
        self.size = size
        self.etag = etag
        self.store = store if store is not None else Store()
        self.is_local = is_local(url)
        self.local_path: str | None = _local_path(url) if self.is_local else None
        self._fs: Any = None
        self._path: str | None = None
        self._fd: int | None = None
        self._pid: int | None = None

    @property
    def storage_options(self) -> Mapping[str, Any]:
        """The store's fsspec options."""
        return self.store.storage_options

    @property
    def retry(self) -> RetryPolicy:
        """The store's retry policy."""
        return self.store.retry

    def __repr__(self) -> str:
        return f"Source({redact_url(self.url)!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fs=None, _path=None, _fd=None, _pid=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown
            pass

    def close(self) -> None:
        """Close the local file descriptor, if this process opened one."""
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            os.close(fd)

    # -- lazily opened, per process -----------------------------------------------------------

    def _secrets(self) -> list[str]:
        return self.store.secrets()

    def _filesystem(self) -> tuple[Any, str]:
        pid = os.getpid()
        if self._fs is None or self._pid != pid:
            if self._pid != pid:
                self._fd = None  # the parent's descriptor; the parent closes it
            options = _with_defaults(self.url, self.storage_options, self.retry)
            self._fs, self._path = fsspec.core.url_to_fs(self.url, **options)
            self._pid = pid
        if self._path is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: self._path is not set")
        return self._fs, self._path

    def _local_fd(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            if self.local_path is None:  # an invariant, kept under python -O
                raise RuntimeError("internal error: self.local_path is not set")
            try:
                fd = os.open(self.local_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                raise ShardNotFoundError(
                    _no_such_file(self.local_path), shard=self.local_path
                ) from None
            except PermissionError as exc:
                raise PermanentRemoteError(str(exc), shard=self.local_path) from None
            if self._fd is not None and self._pid == pid:  # another thread was quicker
                os.close(fd)
                return self._fd
            self._fd, self._pid = fd, pid
        return self._fd

    def _pread(self, start: int, end: int) -> bytes:
        n = end - start
        try:
            fd = self._local_fd()
        except OSError as exc:
            if exc.errno != errno.EMFILE:
                raise
            with open(self.local_path or "", "rb") as f:  # out of descriptors: don't keep one
                f.seek(start)
                data = f.read(n)
        else:
            try:
                data = os.pread(fd, n, start)
            except IsADirectoryError:  # os.open() opens a directory; reading it fails
                raise ShardNotFoundError(
                    "is a directory, not a file", shard=self.local_path
                ) from None
            while 0 < len(data) < n:
                more = os.pread(fd, n - len(data), start + len(data))
                if not more:
                    break
                data += more
        if len(data) != n:
            raise ShortReadError(
                f"range {start}-{end}: file has only {len(data)} of {n} bytes there",
                shard=self.local_path,
            )
        return data

    # -- operations ---------------------------------------------------------------------------

    def info(self, stats: IOStats | None = None) -> FileStat:
        """Stat the file with one cheap request.

        Raises:
            ShardNotFoundError: The file does not exist (or is a directory).
            PermanentRemoteError: Access denied or similar.
            RetriesExhaustedError: Transient failures outlasted the retry policy.
        """
        stats = self.store.stats if stats is None else stats
        if self.is_local:
            if stats is not None:
                stats.requests += 1
            try:
                st = os.stat(self.local_path or "")
                if stat_mod.S_ISDIR(st.st_mode):
                    raise FileNotFoundError(errno.EISDIR, "is a directory")
            except (FileNotFoundError, PermissionError) as exc:
                if stats is not None:
                    stats.errors += 1
                if isinstance(exc, FileNotFoundError) and exc.errno == errno.ENOENT:
                    msg = _no_such_file(self.local_path or "")
                    raise ShardNotFoundError(msg, shard=self.local_path) from None
                cls = (
                    ShardNotFoundError
                    if isinstance(exc, FileNotFoundError)
                    else PermanentRemoteError
                )
                raise cls(str(exc.strerror or exc), shard=self.local_path) from None
            return FileStat(size=st.st_size, etag=None, mtime=st.st_mtime)
        fs, path = self._filesystem()
        attempts = _Attempts(self, "could not get its size", stats)
        if fs.async_impl:

            async def op() -> dict[str, Any]:
                return await fs._info(path)

            info = fsspec.asyn.sync(fs.loop, _retry_async, attempts, op, _zero, fs)
        else:
            info = _retry_sync(attempts, lambda: fs.info(path), _zero)
        if info.get("type") == "directory":
            raise ShardNotFoundError("is a directory", shard=redact_url(self.url))
        size = info.get("size")
        if size is None:
            raise PermanentRemoteError("storage reports no size", shard=redact_url(self.url))
        return FileStat(size=int(size), etag=_etag(info), mtime=_mtime(info))

    def read_range(
        self, start: int, end: int, stats: IOStats | None = None, check: Check | None = None
    ) -> bytes:
        """Read bytes ``[start, end)`` with one request (plus retries).

        Args:
            start: First byte.
            end: One past the last byte.
            stats: I/O counters; the store's when ``None``.
            check: Called on the bytes of each answer; a problem it reports is a
                :class:`~wids.errors.CorruptReadError` (retried). Local files are read
                without it: a caller checks those itself if it wants to.

        Returns:
            Exactly ``end - start`` bytes.

        Raises:
            ShortReadError: Fewer bytes kept arriving (e.g. the range passes the end).
            CorruptReadError: The answers kept being other bytes than those asked for.
            IndexMismatchError: The file is not the version this source reads any more.
            ShardNotFoundError, PermanentRemoteError, RetriesExhaustedError: See the module.
        """
        stats = self.store.stats if stats is None else stats
        _check_range(start, end)
        if start == end:
            return b""
        if self.is_local:
            if stats is not None:
                stats.requests += 1
            try:
                data = self._pread(start, end)
            except Exception:
                if stats is not None:
                    stats.errors += 1
                raise
            if stats is not None:
                stats.bytes_read += len(data)
            return data
        fs, path = self._filesystem()
        attempts = _Attempts(self, f"could not read bytes {start}-{end}", stats)
        if fs.async_impl:
            op = self._aread_op(fs, path, start, end, check)
            return fsspec.asyn.sync(fs.loop, _retry_async, attempts, op, _nbytes, fs)

        def sync_op() -> bytes:
            data = _check_length(self, fs.cat_file(path, start=start, end=end), start, end)
            return self._checked(data, start, end, check)

        return _retry_sync(attempts, sync_op, _nbytes)

    def _aread_op(
        self, fs: Any, path: str, start: int, end: int, check: Check | None = None
    ) -> Callable[[], Awaitable[bytes]]:
        if _is_http(fs):
            get = self._http_range
        elif _is_s3(fs):
            get = self._s3_range
        else:
            get = None

        async def op() -> bytes:
            if get is not None:
                data = await get(fs, path, start, end)
            else:
                data = await fs._cat_file(path, start=start, end=end)
            return self._checked(_check_length(self, data, start, end), start, end, check)

        return op

    def _checked(self, data: bytes, start: int, end: int, check: Check | None) -> bytes:
        if check is not None:
            problem = check(data)
            if problem is not None:
                raise CorruptReadError(
                    f"bytes {start}-{end} are not the ones asked for: {problem}",
                    shard=redact_url(self.url),
                )
        return data

    # -- conditional range requests ------------------------------------------------------------

    def _changed(self, what: str) -> IndexMismatchError:
        return IndexMismatchError(
            f"the file changed while it was read ({what}); rebuild the index if the change is "
            "intended",
            shard=redact_url(self.url),
        )

    def _check_answer(
        self, start: int, end: int, content_range: str | None, etag: str | None
    ) -> None:
        """Check an answer's ``Content-Range`` and etag; keep the etag if none was known."""
        if etag:
            if self.etag is None:
                self.etag = etag
            elif comparable_etag(etag) != comparable_etag(self.etag):
                raise self._changed(f"etag {etag!r} where it was {self.etag!r}")
        if content_range is None:
            return
        unit, _, rest = content_range.strip().partition(" ")
        span, _, total = rest.partition("/")
        first, _, last = span.partition("-")
        try:
            got = (int(first), int(last) + 1)
        except ValueError:
            got = None
        if unit != "bytes" or got != (start, end):
            raise CorruptReadError(
                f"asked for bytes {start}-{end}, the answer's Content-Range is {content_range!r}",
                shard=redact_url(self.url),
            )
        if self.size is not None and total.strip() not in ("*", str(self.size)):
            raise self._changed(f"its size is {total.strip()}, the index says {self.size}")

    async def _http_range(self, fs: Any, path: str, start: int, end: int) -> bytes:
        """One ranged GET as in fsspec's ``_cat_file``, but conditional and checked."""
        session = await fs.set_session()
        kwargs = dict(fs.kwargs)
        headers = dict(kwargs.pop("headers", None) or {})
        headers["Range"] = f"bytes={start}-{end - 1}"
        condition = _if_match(self.etag)
        if condition is not None:
            headers["If-Match"] = condition
        async with session.get(fs.encode_url(path), headers=headers, **kwargs) as resp:
            if resp.status == 412:
                raise self._changed(f"HTTP 412 for If-Match {condition}")
            if resp.status == 404:
                raise FileNotFoundError(path)
            resp.raise_for_status()
            data: bytes = await resp.read()
            if resp.status == 200 and start > 0 and len(data) == end - start:
                raise CorruptReadError(
                    f"asked for bytes {start}-{end} and got a whole file (HTTP 200) of that length",
                    shard=redact_url(self.url),
                )
            _check_length(self, data, start, end)  # a short answer is a short read
            content_range = resp.headers.get("Content-Range") if resp.status == 206 else None
            self._check_answer(start, end, content_range, resp.headers.get("ETag"))
        return data

    async def _s3_range(self, fs: Any, path: str, start: int, end: int) -> bytes:
        """One ``get_object`` as in s3fs's ``_cat_file``, but conditional and checked."""
        bucket, key, version = fs.split_path(path)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end - 1}"}
        if version:
            kwargs["VersionId"] = version
        condition = _if_match(self.etag)
        if condition is not None:
            kwargs["IfMatch"] = condition
        try:
            resp = await fs._call_s3("get_object", **kwargs)
        except Exception as exc:
            if _precondition_failed(exc):
                raise self._changed(f"precondition failed for IfMatch {condition}") from None
            raise
        try:
            data: bytes = await resp["Body"].read()
        finally:
            resp["Body"].close()
        _check_length(self, data, start, end)  # a short answer is a short read
        self._check_answer(start, end, resp.get("ContentRange"), resp.get("ETag"))
        return data

    @property
    def pins_version(self) -> bool:
        """Whether reads are tied to one version of the file (conditional requests by etag).

        Where they are not, a reader reopened later should stat the file again.
        """
        if self.is_local or self.etag is None or "::" in self.url:
            return False
        protocol = self.url.split("://", 1)[0].lower()
        return protocol in ("http", "https", "s3", "s3a")

    def open_stream(self, stats: IOStats | None = None) -> BinaryIO:
        """Open a sequential reader for one pass over the file.

        The file is stat'ed once (the result is the reader's ``.stat`` attribute). Over HTTP the
        body then comes from one streaming GET (``If-Match`` the stat's etag, so a file replaced
        meanwhile fails instead of mixing bytes); elsewhere in blocks of 16 MiB (1 MiB local),
        one request each. Every chunk has its own retries; a failure mid-stream resumes at the
        current offset with a new ranged request.
        """
        stats = self.store.stats if stats is None else stats
        stat = self.info(stats)
        raw: _BlockStream
        if self.is_local:
            raw = _BlockStream(self, stat, stats, _LOCAL_BLOCK)
        else:
            fs, path = self._filesystem()
            if _is_http(fs):
                raw = _HttpStream(self, stat, stats, fs, path)
            else:
                raw = _BlockStream(self, stat, stats, _REMOTE_BLOCK)
        return _Stream(raw)  # type: ignore[return-value]

    def download(
        self, dest: str, stats: IOStats | None = None, expected_size: int | None = None
    ) -> FileStat:
        """Copy the whole file to local path ``dest`` and verify its size.

        ``dest`` is removed again if anything fails; publishing it atomically is the caller's job.

        A download of several blocks (not over HTTP, where one GET is pinned to the etag) ends
        with a second stat: a file that changed meanwhile is refused, not stitched together.

        Raises:
            IndexMismatchError: The file's size differs from ``expected_size``, or it changed
                during the download.
            ShortReadError: Fewer bytes arrived than the stat announced.
        """
        stats = self.store.stats if stats is None else stats
        try:
            with self.open_stream(stats) as stream, open(dest, "wb") as out:
                stat: FileStat = stream.stat  # type: ignore[attr-defined]
                raw: _BlockStream = stream.raw  # type: ignore[attr-defined]
                if expected_size is not None and stat.size != expected_size:
                    raise IndexMismatchError(
                        f"size is {stat.size}, the index says {expected_size}",
                        shard=redact_url(self.url),
                    )
                shutil.copyfileobj(stream, out, 1 << 20)
                written = out.tell()
            if written != stat.size:
                raise ShortReadError(
                    f"downloaded {written} of {stat.size} bytes", shard=redact_url(self.url)
                )
            if not self.is_local and not isinstance(raw, _HttpStream) and written > raw.block:
                self._check_unchanged(stat, stats)  # blocks could come from two versions
        except BaseException:
            try:
                os.unlink(dest)
            except FileNotFoundError:
                pass
            raise
        return stat

    def _check_unchanged(self, before: FileStat, stats: IOStats | None) -> None:
        after = self.info(stats)
        if (after.size, after.etag, after.mtime) != (before.size, before.etag, before.mtime):
            raise IndexMismatchError(
                "the file changed while it was being downloaded", shard=redact_url(self.url)
            )


class _BlockStream(io.RawIOBase):
    """A seekable read-only view of a Source that fetches ``block`` bytes per request."""

    def __init__(self, source: Source, stat: FileStat, stats: IOStats | None, block: int):
        super().__init__()
        self.source = source
        self.stat = stat
        self.stats = stats
        self.block = block
        self.pos = 0
        self.buf = b""
        self.buf_start = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.stat.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self.pos = base + offset
        return self.pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if self.pos >= self.stat.size or len(view) == 0:
            return 0
        offset = self.pos - self.buf_start
        if not (0 <= offset < len(self.buf)):
            self.buf = self._fetch(len(view))
            self.buf_start, offset = self.pos, 0
        n = min(len(view), len(self.buf) - offset)
        view[:n] = self.buf[offset : offset + n]
        self.pos += n
        return n

    def _fetch(self, want: int) -> bytes:
        """Bytes from ``pos`` on: at least one, at most ``max(block, want)``."""
        end = min(self.pos + max(self.block, want), self.stat.size)
        return self.source.read_range(self.pos, end, self.stats)

    def close(self) -> None:
        self.buf = b""
        super().close()


def _is_http(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "http" in protocols and hasattr(fs, "encode_url") and hasattr(fs, "set_session")


def _is_s3(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "s3" in protocols and hasattr(fs, "_call_s3") and hasattr(fs, "split_path")


def _if_match(etag: str | None) -> str | None:
    """The ``If-Match`` value for a known etag; ``None`` for none or a weak one (never matches)."""
    if etag is None or etag.strip().startswith("W/"):
        return None
    return f'"{comparable_etag(etag)}"'


def _precondition_failed(exc: BaseException | None) -> bool:
    """Whether a backend error (or its cause) is HTTP 412 / S3 ``PreconditionFailed``."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, Mapping):
            if response.get("Error", {}).get("Code") == "PreconditionFailed":
                return True
            if response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                return True
        if getattr(exc, "status", None) == 412:
            return True
        exc = exc.__cause__
    return False


class _HttpStream(_BlockStream):
    """One streaming GET for the whole pass; a failed chunk reopens it at the current offset."""

    def __init__(self, source: Source, stat: FileStat, stats: IOStats | None, fs: Any, path: str):
        super().__init__(source, stat, stats, _HTTP_CHUNK)
        self.fs = fs
        self.path = path
        self.resp: Any = None
        self.resp_pos = -1  # the offset the open response delivers next

    def _fetch(self, want: int) -> bytes:
        n = min(self.block, self.stat.size - self.pos)
        what = f"could not read on from byte {self.pos}"
        attempts = _Attempts(self.source, what, self.stats, count_requests=False)
        op = self._chunk_op(n)
        return fsspec.asyn.sync(self.fs.loop, _retry_async, attempts, op, _nbytes, self.fs)

    def _chunk_op(self, n: int) -> Callable[[], Awaitable[bytes]]:
        async def op() -> bytes:
            try:
                if self.resp is None or self.resp_pos != self.pos:
                    await self._open()
                data = await self.resp.content.readexactly(n)
            except BaseException:
                self._drop()
                raise
            self.resp_pos += len(data)
            return data

        return op

    async def _open(self) -> None:
        self._drop()
        session = await self.fs.set_session()
        kwargs = dict(self.fs.kwargs)
        headers = dict(kwargs.pop("headers", None) or {})
        headers["Range"] = f"bytes={self.pos}-{self.stat.size - 1}"
        condition = _if_match(self.stat.etag)
        if condition is not None:
            headers["If-Match"] = condition
        if self.stats is not None:
            self.stats.requests += 1
        resp = await session.get(self.fs.encode_url(self.path), headers=headers, **kwargs)
        try:
            if resp.status == 404:
                raise FileNotFoundError(self.path)
            if resp.status == 412:
                raise self.source._changed(f"HTTP 412 for If-Match {condition}")
            resp.raise_for_status()
            if resp.status != 206 and self.pos > 0:
                raise PermanentRemoteError(
                    f"asked for bytes {self.pos}- and got status {resp.status}: the server "
                    "ignores Range",
                    shard=redact_url(self.source.url),
                )
            if resp.status == 206:
                content_range = resp.headers.get("Content-Range")
                expected = f"bytes {self.pos}-{self.stat.size - 1}/{self.stat.size}"
                if content_range is not None and content_range.strip() != expected:
                    raise CorruptReadError(
                        f"asked for bytes {self.pos}-{self.stat.size}, the answer's "
                        f"Content-Range is {content_range!r}",
                        shard=redact_url(self.source.url),
                    )
        except BaseException:
            resp.close()
            raise
        self.resp, self.resp_pos = resp, self.pos

    def _drop(self) -> None:
        resp, self.resp = self.resp, None
        if resp is not None:
            resp.close()

    def close(self) -> None:
        resp, self.resp = self.resp, None
        if resp is not None and not self.fs.loop.is_closed():
            self.fs.loop.call_soon_threadsafe(resp.close)
        super().close()


class _Stream(io.BufferedReader):
    """A buffered :class:`_BlockStream` (``read(n)`` returns ``n`` bytes unless at the end)."""

    def __init__(self, raw: _BlockStream) -> None:
        super().__init__(raw, buffer_size=64 << 10)

    @property
    def stat(self) -> FileStat:
        """The stat taken when the stream was opened."""
        return self.raw.stat  # type: ignore[no-any-return,attr-defined]


# ---------------------------------------------------------------------------------------------
# Many ranges at once


def read_ranges(
    requests: Sequence[tuple[Source, int, int]],
    stats: IOStats | None = None,
    max_concurrency: int = 32,
    checks: Sequence[Check | None] | None = None,
) -> list[bytes]:
    """Read many byte ranges, concurrently where the filesystem is asynchronous.

    Ranges are grouped by filesystem; each remote range is one request with its own retries (so
    only failed ones are repeated), at most ``max_concurrency`` in flight; local ranges are read
    with ``os.pread``. ``checks`` (one per request, or ``None``) are passed to each remote
    read as :meth:`Source.read_range` describes.

    Returns:
        One ``bytes`` per request, in order, each exactly ``end - start`` long.

    Raises:
        The first error (in request order) of a range that failed for good; see the module.
    """
    if max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1")
    if checks is not None and len(checks) != len(requests):
        raise ValueError("checks must have one entry per request")
    out: list[bytes | None] = [None] * len(requests)
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, (src, start, end) in enumerate(requests):
        _check_range(start, end)
        if src.is_local or start == end:
            out[i] = src.read_range(start, end, stats)
            continue
        fs, _ = src._filesystem()
        groups.setdefault(id(fs), (fs, []))[1].append(i)
    for fs, idxs in groups.values():
        if fs.async_impl:
            jobs = [(*requests[i], checks[i] if checks else None) for i in idxs]
            results = fsspec.asyn.sync(fs.loop, _gather, jobs, stats, max_concurrency)
            for i, data in zip(idxs, results, strict=True):
                out[i] = data
        else:
            for i in idxs:
                src, start, end = requests[i]
                out[i] = src.read_range(start, end, stats, checks[i] if checks else None)
    return out  # type: ignore[return-value]  # every slot was filled


async def _gather(
    jobs: list[tuple[Source, int, int, Check | None]], stats: IOStats | None, max_concurrency: int
) -> list[bytes]:
    gate = asyncio.Semaphore(max_concurrency)

    async def one(src: Source, start: int, end: int, check: Check | None) -> bytes:
        fs, path = src._filesystem()
        counters = src.store.stats if stats is None else stats
        attempts = _Attempts(src, f"could not read bytes {start}-{end}", counters)
        async with gate:
            op = src._aread_op(fs, path, start, end, check)
            return await _retry_async(attempts, op, _nbytes, fs)

    results = await asyncio.gather(*(one(*job) for job in jobs), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
