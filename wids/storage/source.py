"""Reading one file: a :class:`Store` (options, retry policy, counters) and its :class:`Source`.

A :class:`Store` carries the storage options, the retry policy, the I/O counters and, per
process, the version each file is read at (:class:`~wids.storage.answer.Pin`); a
:class:`Source` (``store.source(url)``) is one file reachable through fsspec (or a plain local
path) read under its store. It keeps only ``(url, store)`` and the size and version it expects;
its transport (:mod:`wids.storage.transport`, over this process's filesystem from
:mod:`wids.storage.clients`; or, for local files, a descriptor read with ``os.pread``:
:mod:`wids.storage.local`) is made lazily in each process and dropped when pickled.

Every remote request runs under the store's :class:`~wids.storage.retry.RetryPolicy`: failures
are sorted into *not found*, *permanent* and *transient* (retried with backoff) as
:mod:`wids.storage.retry` describes; no backend retries inside an attempt.

A range read returns the transport's :class:`~wids.storage.answer.Answer` and
:func:`~wids.storage.answer.check_answer` checks it: the range and length, and the file's size
and version against the pin (the index's, completed by the first answer), so a file replaced
while it is read raises :class:`~wids.errors.IndexMismatchError` instead of mixing bytes of
two versions (HTTP without an etag: by its ``Last-Modified``; GCS: by its generation). A
caller's ``check`` (the dataset's tar-header check) then looks at the bytes; a problem it
reports is :class:`~wids.errors.CorruptReadError`, retried like a transient failure. Other
fsspec stores are read with ``cat_file``, whose answer says nothing but its bytes.

Other exceptions (programming errors) propagate unchanged. Messages never contain credentials
(:func:`~wids.storage.redact.redact_url`, secret option values masked).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, BinaryIO

from . import forks
from .answer import Check, Pin, check_answer, check_range, checked
from .backends import is_http, preload, request_timeout, with_defaults
from .clients import filesystem
from .http1 import Http1Pools
from .limits import ReadLimits
from .local import LocalFile
from .objectstores import transport_for
from .origins import Scope
from .parts import download
from .redact import _secret_values, redact_url
from .retry import Attempts, RetryPolicy, retry_async, retry_sync
from .stats import FileStat, IOStats
from .streams import LOCAL_BLOCK, REMOTE_BLOCK, BlockStream, HttpStream, Stream
from .transport import Transport
from .urls import is_local, local_file

__all__ = ["Source", "Store"]


def _nbytes(data: bytes) -> int:
    return len(data)


def _zero(_: object) -> int:
    return 0


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

    __slots__ = (
        "_options",
        "_pins",
        "_plain",
        "_retry",
        "_scope",
        "_secrets",
        "limits",
        "named",
        "stats",
    )

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        *,
        stats: IOStats | None = None,
        named: Any = None,
        limits: ReadLimits | None = None,
    ) -> None:
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        if limits is not None and not isinstance(limits, ReadLimits):
            raise TypeError(f"limits must be a ReadLimits, not {type(limits).__name__}")
        self.limits = limits if limits is not None else ReadLimits()  # whole-file reads
        self._options: dict[str, Any] = dict(storage_options or {})
        self._scope = Scope(self._options, named)
        self.named = self._scope.named  # the origins the options are for (None: every one)
        self._retry = retry if retry is not None else RetryPolicy()
        self._secrets = tuple(_secret_values(self._options))
        self.stats = stats if stats is not None else IOStats()
        self._plain = Http1Pools()  # this process's plain HTTP connections (storage/http1.py)
        self._pins: dict[str, Pin] = {}  # the version of each file read (storage/answer.py)

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
            return cls(
                store.storage_options,
                retry,
                stats=store.stats,
                named=store.named,
                limits=store.limits,
            )
        return cls(store, retry, named=named)

    def with_stats(self, stats: IOStats | None = None) -> Store:
        """The same options and retry policy, counting into ``stats`` (new counters if ``None``)."""
        return Store(self._options, self._retry, stats=stats, named=self.named, limits=self.limits)

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

    def preload(self, url: str) -> None:
        """Import what reading ``url`` under this store needs, before workers fork.

        See :func:`~wids.storage.backends.preload`: nothing is connected or opened.
        """
        preload(url, self.options_for(url))

    def secrets(self) -> list[str]:
        """The secret values of the storage options, to mask in messages."""
        return list(self._secrets)

    def source(
        self,
        url: str,
        *,
        size: int | None = None,
        etag: str | None = None,
        mtime: float | None = None,
    ) -> Source:
        """A :class:`Source` for ``url`` read under this store (see :class:`Source`)."""
        return Source(url, self, size=size, etag=etag, mtime=mtime)

    def pin(
        self, url: str, size: int | None = None, etag: str | None = None, mtime: float | None = None
    ) -> Pin:
        """The version of ``url`` this process reads through this store (one per URL).

        Sources of one file share it: what one answer pins holds for every reader of the file.
        Values that contradict it (a source expecting another size or etag) start a new pin:
        the caller's expectation is what its reads are checked against.
        """
        found = self._pins.get(url)
        if found is None or not found.expect(size, etag, mtime):
            found = self._pins[url] = Pin(url, size, etag, mtime, indexed=True)
        return found

    def __reduce__(self) -> tuple[Any, ...]:
        return (partial(Store, named=self.named, limits=self.limits), (self._options, self._retry))

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
        etag: The version to read (the index's etag), if known; otherwise the version of the
            first answer is kept (``.pin``). Reads are conditional on it where the store
            allows (HTTP ``If-Match``, S3 ``IfMatch``; GCS pins the first answer's generation).
        mtime: The modification time the index records, compared with answers that carry
            no etag (HTTP servers without ETags).

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
        mtime: float | None = None,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError(f"url must be a non-empty str, not {url!r}")
        if store is not None and not isinstance(store, Store):
            raise TypeError(f"store must be a Store, not {type(store).__name__}")
        self.url = url
        self.size = size
        self.etag = etag
        self.mtime = mtime
        self.store = store if store is not None else Store()
        self._options = self.store.options_for(url)
        self.is_local = is_local(url)
        self.local_path: str | None = local_file(url) if self.is_local else None
        self._local = LocalFile(self.local_path) if self.local_path is not None else None
        self._fs: Any = None
        self._path: str | None = None
        self._pid: int | None = None
        self._made = -1  # forks.stamp() of the process that made _transport
        self._transport: Transport | None = None
        self._pin: Pin | None = None

    retry = property(lambda self: self.store.retry, doc="The store's retry policy.")

    @property
    def storage_options(self) -> Mapping[str, Any]:
        """The fsspec options this file is opened with (the store's, for its origin)."""
        return MappingProxyType(self._options)

    @property
    def pin(self) -> Pin:
        """The version of the file this process reads (shared with the store's other sources).

        A GCS index's etag is not a generation: GCS reads pin the first answer's generation.
        """
        pin = self._pin
        if pin is None:
            gcs = self.url.split("://", 1)[0].lower() in ("gs", "gcs")
            etag = None if gcs else self.etag
            pin = self._pin = self.store.pin(self.url, self.size, etag, self.mtime)
        return pin

    def __repr__(self) -> str:
        return f"Source({redact_url(self.url)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_path": None, "_transport": None, "_pin": None}

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
            self._fs, self._path = filesystem(self.url, options)
            self._pid = pid
        if self._path is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: self._path is not set")
        return self._fs, self._path

    def transport(self) -> Transport:
        """This process's :class:`~wids.storage.transport.Transport` of the (remote) file."""
        transport = self._transport
        if transport is None or self._made != forks.generation:  # (no getpid() per read)
            from .viaobstore import obstore_transport  # the choice: storage/viaobstore.py

            chosen = obstore_transport(self.url, self._options, self.retry.timeout)
            if chosen is not None:
                self._transport, self._pid = chosen, os.getpid()
                self._made = forks.stamp()
                return chosen
            from .http1 import PlainTransport  # aiohttp only where needed: storage/http1.py

            plain = PlainTransport.of(self.url, self._options, self.retry, self.store._plain)
            if plain is not None:
                self._transport, self._made = plain, forks.stamp()
                return plain
            options = {k: v for k, v in self._options.items() if k != "transport"}
            fs, path = self._filesystem()
            timeout = request_timeout(self.url, options, self.retry)
            transport = transport_for(self.url, fs, path, self.retry.timeout, timeout)
            self._transport, self._made = transport, forks.stamp()
        return transport

    async def read_async(self, start: int, end: int, check: Check | None = None) -> bytes:
        """One attempt at ``[start, end)`` on an asynchronous transport, checked."""
        transport = self._transport or self.transport()
        answer = await transport.get(start, end, self.pin)
        return checked(self.url, check_answer(self.pin, answer, start, end), start, end, check)

    def _read_sync(self, start: int, end: int, check: Check | None = None) -> bytes:
        answer = (self._transport or self.transport()).get_sync(start, end, self.pin)
        return checked(self.url, check_answer(self.pin, answer, start, end), start, end, check)

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
        transport = self.transport()
        attempts = self.attempts("could not get its size", stats)
        stat_async = getattr(transport, "stat", None)
        if stat_async is not None:
            loop = transport.fs.loop
            import fsspec.asyn  # here, not at import: local reads never need it

            found: FileStat = fsspec.asyn.sync(
                loop, retry_async, attempts, stat_async, _zero, transport.prepare
            )
            return found
        return retry_sync(attempts, transport.stat_sync, _zero)

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
        transport = self.transport()
        attempts = self.attempts(f"could not read bytes {start}-{end}", stats)
        if transport.asynchronous and not transport.direct:

            def op() -> Any:
                return self.read_async(start, end, check)

            loop = transport.fs.loop
            import fsspec.asyn  # here, not at import: local reads never need it

            data: bytes = fsspec.asyn.sync(
                loop, retry_async, attempts, op, _nbytes, transport.prepare
            )
            return data
        return retry_sync(attempts, lambda: self._read_sync(start, end, check), _nbytes)

    @property
    def pins_version(self) -> bool:
        """Whether reads are tied to one version (else a reopened reader stats it again)."""
        return self.answers_with_stat and self.pin.pinned

    @property
    def answers_with_stat(self) -> bool:
        """Whether each range read's answer says the file's size and etag (HTTP, S3).

        The first-touch check of a file against its index then costs no request of its own:
        every answer is checked against the index's size and etag (the source's pin).
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
        self,
        dest: str,
        stats: IOStats | None = None,
        expected_size: int | None = None,
        limit: int | None = None,
    ) -> FileStat:
        """Copy the whole file to local path ``dest`` and verify its size.

        ``dest`` is removed again if anything fails; publishing it atomically is the caller's job.
        HTTP, S3: concurrent ranged GETs pinned to one etag (:mod:`wids.storage.parts`); else
        several blocks end with a second stat (a file changed meanwhile is refused).

        Raises:
            IndexMismatchError: The file's size differs from ``expected_size``, or it changed
                during the download.
            ShortReadError: Fewer bytes arrived than the stat announced.
            TooLargeError: The file is larger than ``limit`` bytes (nothing is fetched).
        """
        counters = self.store.stats if stats is None else stats
        return download(self, dest, counters, expected_size, limit=limit)
