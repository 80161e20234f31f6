"""Reading one file: a :class:`Store` (options, retry policy, counters) and its :class:`Source`.

A :class:`Store` carries the storage options, the retry policy and the I/O counters; a
:class:`Source` (``store.source(url)``) is one file reachable through fsspec (or a plain local
path) read under its store. It keeps only ``(url, store)`` and what it knows of the file's
version; its filesystem (or, for local files, a descriptor read with ``os.pread``:
:mod:`wids.storage.local`) is opened lazily in each process and dropped when pickled.

Every remote request runs under the store's :class:`~wids.storage.retry.RetryPolicy`: failures
are sorted into *not found*, *permanent* and *transient* (retried with backoff) as
:mod:`wids.storage.retry` describes.

Range reads are checked end to end where the transport lets us: over HTTP and S3 each answer's
``Content-Range`` must be the range asked for (and its total the shard's known size), and a
caller's ``check`` (the dataset's tar-header check) must accept the bytes; a wrong answer is
:class:`~wids.errors.CorruptReadError`, retried like a transient failure. A source knows the
version of the file it reads (``etag``, from the index or else from its first answer): over
HTTP every range request carries ``If-Match`` that etag and over S3 ``IfMatch``, and an answer
with another etag is refused, so a file replaced while it is read raises
:class:`~wids.errors.IndexMismatchError` instead of mixing bytes of two versions
(:mod:`wids.storage.conditional`). Other stores (GCS, chained URLs) are read with fsspec's
``_cat_file``, which exposes neither.

Exceptions that are none of these (programming errors) propagate unchanged. Error messages
never contain credentials: URLs are passed through :func:`~wids.storage.redact.redact_url` and
secret values of the storage options are masked; the backend's exception is described, not chained.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, BinaryIO

import fsspec
import fsspec.asyn

from ..errors import PermanentRemoteError, ShardNotFoundError
from .backends import file_stat, is_http, request_timeout, url_to_fs, with_defaults
from .conditional import AnswerCheck, check_length
from .http1 import Http1Pools, plain_options
from .local import LocalFile
from .origins import Scope
from .parts import download
from .rangeread import Check, RangeRead, checked, stat_check
from .redact import _secret_values, redact_url
from .retry import Attempts, RetryPolicy, retry_async, retry_sync
from .stats import FileStat, IOStats
from .streams import LOCAL_BLOCK, REMOTE_BLOCK, BlockStream, HttpStream, Stream
from .urls import is_local, local_file

__all__ = ["Source", "Store", "check_range"]


def _nbytes(data: bytes) -> int:
    return len(data)


def _zero(_: object) -> int:
    return 0


def check_range(start: int, end: int) -> None:
    """Refuse a range that is not ``0 <= start <= end`` in ints."""
    if not (isinstance(start, int) and isinstance(end, int)):
        raise TypeError(f"start and end must be int, not {type(start)} and {type(end)}")
    if start < 0 or end < start:
        raise ValueError(f"bad range {start}-{end}")


class Store:
    """Where files are read from: fsspec storage options, the retry policy and I/O counters.

    The one object that carries these three down to the I/O layer; :meth:`source` opens a file
    under them. It is built once at the edge (a dataset, an index build, a CLI command) from the
    public ``storage_options=`` and ``retry=`` arguments. The options and the policy do not
    change; ``stats`` counts this process's requests: a pickled store carries
    ``(storage_options, retry)`` and starts new counters in the process that unpickles it.

    Args:
        storage_options: Passed to ``fsspec.url_to_fs``; ignored for local files. Entries
            keyed by an origin (``"https://host:port"``) are for that origin only.
        retry: The retry policy; the default when ``None``.
        stats: The counters to add to; new ones when ``None``.
        named: The URLs the (flat) options are for: a URL on another origin is opened
            without their credentials (:mod:`wids.storage.origins`); every origin gets
            them when ``None``.

    Example:
        >>> store = Store({"anon": True})
        >>> store.source("s3://bucket/shard-000.tar").read_range(512, 1024)  # doctest: +SKIP
    """

    __slots__ = ("_options", "_plain", "_retry", "_scope", "_secrets", "named", "stats")

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        *,
        stats: IOStats | None = None,
        named: Any = None,
    ) -> None:
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        self._options: dict[str, Any] = dict(storage_options or {})
        self._scope = Scope(self._options, named)
        self.named = self._scope.named  # the origins the options are for (None: every one)
        self._retry = retry if retry is not None else RetryPolicy()
        self._secrets = tuple(_secret_values(self._options))
        self.stats = stats if stats is not None else IOStats()
        self._plain = Http1Pools()  # this process's plain HTTP connections (storage/http1.py)

    @classmethod
    def of(
        cls,
        store: Store | Mapping[str, Any] | None,
        retry: RetryPolicy | None = None,
        *,
        named: Any = None,
    ) -> Store:
        """``store`` itself if it is a :class:`Store`, else a store of these storage options.

        Public functions take ``storage_options=`` (a mapping); inside wids the same parameter
        may carry a store, which then passes through unchanged (with its counters and the
        origins it was made for). ``named``: the URLs a new store's options are for.
        """
        if isinstance(store, Store):
            if retry is None or retry == store.retry:
                return store
            return cls(store.storage_options, retry, stats=store.stats, named=store.named)
        return cls(store, retry, named=named)

    def with_stats(self, stats: IOStats | None = None) -> Store:
        """The same options and retry policy, counting into ``stats`` (new counters if ``None``)."""
        return Store(self._options, self._retry, stats=stats, named=self.named)

    def close_idle(self) -> None:
        """Close the idle plain HTTP connections this store's sources kept (they reconnect)."""
        self._plain.close()

    @property
    def storage_options(self) -> Mapping[str, Any]:
        """The fsspec options (read-only)."""
        return MappingProxyType(self._options)

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of every request."""
        return self._retry

    def options_for(self, url: str) -> Mapping[str, Any]:
        """The options ``url`` is opened with (credentials only for their origins)."""
        return self._scope.options_for(url)

    def secrets(self) -> list[str]:
        """The secret values of the storage options, to mask in messages."""
        return list(self._secrets)

    def source(self, url: str, *, size: int | None = None, etag: str | None = None) -> Source:
        """A :class:`Source` for ``url`` read under this store (see :class:`Source`)."""
        return Source(url, self, size=size, etag=etag)

    def __reduce__(self) -> tuple[Any, ...]:
        return (partial(Store, named=self.named), (self._options, self._retry))

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
        self._options = self.store.options_for(url)
        self.is_local = is_local(url)
        self.local_path: str | None = local_file(url) if self.is_local else None
        self._local = LocalFile(self.local_path) if self.local_path is not None else None
        self._fs: Any = None
        self._path: str | None = None
        self._pid: int | None = None
        self._reader: RangeRead | None = None
        self.answer_check: AnswerCheck | None = None

    @property
    def storage_options(self) -> Mapping[str, Any]:
        """The fsspec options this file is opened with (the store's, for its origin)."""
        return MappingProxyType(self._options)

    @property
    def retry(self) -> RetryPolicy:
        """The store's retry policy."""
        return self.store.retry

    def __repr__(self) -> str:
        return f"Source({redact_url(self.url)!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fs=None, _path=None, _pid=None, _reader=None, answer_check=None)
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
        if self._local is not None:
            self._local.close()

    # -- lazily opened, per process -----------------------------------------------------------

    def attempts(
        self, what: str, stats: IOStats | None = None, *, count_requests: bool = True
    ) -> Attempts:
        """Book-keeping for one request under the store's policy (its counters by default)."""
        counters = self.store.stats if stats is None else stats
        return Attempts(
            self.store.retry,
            self.url,
            self.store._secrets,
            what,
            counters,
            count_requests=count_requests,
            denied_hint=self.store._scope.withheld(self.url),
        )

    def _filesystem(self) -> tuple[Any, str]:
        pid = os.getpid()
        if self._fs is None or self._pid != pid:
            options = with_defaults(self.url, self.storage_options, self.retry)
            self._fs, self._path = url_to_fs(self.url, options)
            self._pid = pid
            self._reader = None
        if self._path is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: self._path is not set")
        return self._fs, self._path

    # -- operations ---------------------------------------------------------------------------

    def info(self, stats: IOStats | None = None) -> FileStat:
        """Stat the file with one cheap request.

        Raises:
            ShardNotFoundError: The file does not exist (or is a directory).
            PermanentRemoteError: Access denied or similar.
            RetriesExhaustedError: Transient failures outlasted the retry policy.
        """
        stats = self.store.stats if stats is None else stats
        if self._local is not None:
            return self._local.stat(stats)
        fs, path = self._filesystem()
        attempts = self.attempts("could not get its size", stats)
        if fs.async_impl:

            async def op() -> dict[str, Any]:
                found: dict[str, Any] = await fs._info(path)
                return found

            info: dict[str, Any] = fsspec.asyn.sync(fs.loop, retry_async, attempts, op, _zero, fs)
        else:
            info = retry_sync(attempts, lambda: fs.info(path), _zero)
        if info.get("type") == "directory":
            raise ShardNotFoundError("is a directory", shard=redact_url(self.url))
        size = info.get("size")
        if size is None:
            raise PermanentRemoteError("storage reports no size", shard=redact_url(self.url))
        return file_stat(info, int(size))

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
        check_range(start, end)
        if start == end:
            return b""
        if self._local is not None:
            return self._local.read(start, end, stats)
        fs, path = self._filesystem()
        attempts = self.attempts(f"could not read bytes {start}-{end}", stats)
        if fs.async_impl:
            op = partial(self._range_read(), start, end, check)
            data: bytes = fsspec.asyn.sync(fs.loop, retry_async, attempts, op, _nbytes, fs)
            return data

        def sync_op() -> bytes:
            if self.answer_check is not None:
                stat_check(self, fs.info(path))
            data = check_length(self.url, fs.cat_file(path, start=start, end=end), start, end)
            return checked(self.url, data, start, end, check)

        return retry_sync(attempts, sync_op, _nbytes)

    def _range_read(self) -> RangeRead:
        """This process's :class:`~wids.storage.rangeread.RangeRead` of the (remote) file."""
        fs, path = self._filesystem()
        reader = self._reader
        if reader is None:
            timeout = request_timeout(self.url, self.storage_options, self.retry)
            plain = plain_options(self.url, self.storage_options) and self.store._plain
            reader = self._reader = RangeRead(self, fs, path, timeout, plain or None)
        return reader

    @property
    def pins_version(self) -> bool:
        """Whether reads are tied to one version of the file (conditional requests by etag).

        Where they are not, a reader reopened later should stat the file again.
        """
        return self.etag is not None and self.answers_with_stat

    @property
    def answers_with_stat(self) -> bool:
        """Whether each range read's answer says the file's size and etag (HTTP, S3).

        A check of the file (``answer_check``) then costs no request of its own.
        """
        if self.is_local or "::" in self.url:
            return False
        protocol = self.url.split("://", 1)[0].lower()
        return protocol in ("http", "https", "s3", "s3a")

    def open_stream(self, stats: IOStats | None = None) -> BinaryIO:
        """Open a sequential reader for one pass over the file.

        The file is stat'ed once (the result is the reader's ``.stat`` attribute). Over HTTP the
        body then comes from one streaming GET (``If-Match`` the stat's etag, so a file replaced
        meanwhile fails instead of mixing bytes); elsewhere in blocks of 16 MiB (1 MiB local),
        one request each. Every chunk has its own retries; a failure mid-stream resumes at the
        current offset with a new ranged request (:mod:`wids.storage.streams`).
        """
        stats = self.store.stats if stats is None else stats
        stat = self.info(stats)
        raw: BlockStream
        if self.is_local:
            raw = BlockStream(self, stat, stats, LOCAL_BLOCK)
        else:
            fs, path = self._filesystem()
            if is_http(fs):
                raw = HttpStream(self, stat, stats, fs, path)
            else:
                raw = BlockStream(self, stat, stats, REMOTE_BLOCK)
        return Stream(raw)

    def download(
        self, dest: str, stats: IOStats | None = None, expected_size: int | None = None
    ) -> FileStat:
        """Copy the whole file to local path ``dest`` and verify its size.

        ``dest`` is removed again if anything fails; publishing it atomically is the caller's job.
        HTTP, S3: concurrent ranged GETs pinned to one etag (:mod:`wids.storage.parts`); else
        several blocks end with a second stat (a file changed meanwhile is refused).

        Raises:
            IndexMismatchError: The file's size differs from ``expected_size``, or it changed
                during the download.
            ShortReadError: Fewer bytes arrived than the stat announced.
        """
        return download(self, dest, self.store.stats if stats is None else stats, expected_size)
