"""One transport per backend: a ranged read returns an :class:`~wids.storage.answer.Answer`.

A :class:`Transport` reads one remote file in one process. Its ``get(start, end, pin)`` makes
one request (no retries: the caller's loop retries, and no backend retries inside it) made
conditional on the file's :class:`~wids.storage.answer.Pin`, and returns what the answer said;
:func:`~wids.storage.answer.check_answer` then checks it. The implementations:

- :class:`HttpTransport`: HTTP(S) through the session of fsspec's HTTP filesystem (its options,
  headers and client settings): ``If-Match`` the pinned etag, else ``If-Unmodified-Since`` the
  first answer's ``Last-Modified``; ``Accept-Encoding: identity``; a body longer than the range
  is refused before it is read;
- :class:`~wids.storage.objectstores.S3Transport`: ``get_object`` on s3fs's client with
  ``IfMatch``;
- :class:`~wids.storage.objectstores.GcsTransport`: GCS's JSON API on this process's own
  session, the request pinned to the object's generation (``generation=``), so a replaced
  object is never mixed;
- :class:`Transport` itself: any other fsspec filesystem (``memory://``, chained URLs, ...):
  ``cat_file``, whose answer says nothing but its bytes (only the length is checked).

:func:`~wids.storage.objectstores.transport_for` picks one. Filesystems come from
:mod:`wids.storage.clients` (one per process); only public attributes of fsspec, s3fs, gcsfs
and aiohttp are used.
"""

from __future__ import annotations

from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from ..errors import PermanentRemoteError
from .answer import Answer, Pin, ignores_range, parse_content_range, too_large
from .backends import file_stat
from .redact import redact_url
from .stats import FileStat

__all__ = [
    "LOOP",
    "HttpTransport",
    "Transport",
    "answer_of",
    "conditions",
    "read_body",
    "read_bounded",
]


def _date(value: Any) -> float | None:
    if value is None:
        return None
    try:
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        return parsedate_to_datetime(str(value)).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None


def _span(content_range: str | None) -> tuple[tuple[int, int] | None, int | None]:
    span, total, valid = parse_content_range(content_range)
    return (span if valid else (-1, -1)), total


class _Loop:
    """Where transports without an fsspec filesystem run asynchronous reads: ``.loop``.

    fsspec's event loop of this process (its own after a fork), the one its filesystems use;
    a transport whose ``fs`` is this shares that loop without making a filesystem (and
    without importing aiohttp for one).
    """

    async_impl = True

    @property
    def loop(self) -> Any:
        """This process's fsspec event loop (started on first use)."""
        import fsspec.asyn

        return fsspec.asyn.get_loop()


LOOP = _Loop()
"""The ``fs`` of transports that read on fsspec's event loop without a filesystem."""


class Transport:
    """The fsspec fallback: ``cat_file`` on any filesystem (sync API; only lengths checked).

    Args:
        url: The file.
        fs: Its filesystem (this process's, :func:`~wids.storage.clients.filesystem`).
        path: Its path on ``fs``.
        timeout: Seconds for one request to connect or stall (transports that use it).
    """

    checked = False
    """Whether answers say the file's size and version (what a first-touch check needs)."""
    asynchronous = False
    """Whether :meth:`get` is a coroutine to run on ``fs.loop``."""
    direct = False
    """Whether one read at a time goes through :meth:`get_sync` in the calling thread."""

    def __init__(self, url: str, fs: Any, path: str, timeout: float = 30.0) -> None:
        self.url, self.fs, self.path, self.timeout = url, fs, path, timeout

    async def prepare(self) -> None:
        """Make the backend's client before a timed attempt (mostly CPU: botocore's models).

        Counted against a first attempt it would only cause spurious timeouts.
        """

    def get_sync(self, start: int, end: int, pin: Pin) -> Answer:
        """One read of ``[start, end)`` in the calling thread."""
        return Answer(bytes(self.fs.cat_file(self.path, start=start, end=end)))

    async def get(self, start: int, end: int, pin: Pin) -> Answer:
        """One read of ``[start, end)`` (asynchronous transports only)."""
        raise NotImplementedError

    def get_whole_sync(self, limit: int | None) -> bytes:
        """The whole file in the calling thread (a stat first, to bound it)."""
        size = self.stat_sync().size
        if limit is not None and size > limit:
            raise too_large(self.url, size, limit)
        return bytes(self.fs.cat_file(self.path))

    async def get_whole(self, limit: int | None) -> bytes:
        """The whole file, at most ``limit`` bytes (asynchronous transports only)."""
        raise NotImplementedError

    def stat_sync(self) -> FileStat:
        """One stat of the file, in the calling thread."""
        info = self.fs.info(self.path)
        return self._stat_of(info)

    def _stat_of(self, info: Mapping[str, Any]) -> FileStat:
        from ..errors import ShardNotFoundError

        if info.get("type") == "directory":
            raise ShardNotFoundError("is a directory", shard=redact_url(self.url))
        size = info.get("size")
        if size is None:
            raise PermanentRemoteError(
                "storage reports no size (over HTTP: an answer without Content-Length, or "
                "compressed with a Content-Encoding, which wids does not read)",
                shard=redact_url(self.url),
            )
        return file_stat(info, int(size))


class HttpTransport(Transport):
    """Ranged GETs through the aiohttp session of fsspec's HTTP filesystem (see the module).

    What every request repeats (the encoded URL, the request options and headers) is made once.
    """

    checked = True
    asynchronous = True

    def __init__(
        self, url: str, fs: Any, path: str, timeout: float = 30.0, client_timeout: Any = None
    ) -> None:
        super().__init__(url, fs, path, timeout)
        kwargs = dict(fs.kwargs)
        self.headers: dict[str, str] = dict(kwargs.pop("headers", None) or {})
        # the bytes of the file, never a compressed form: lengths are checked before decoding
        self.headers["Accept-Encoding"] = "identity"
        if client_timeout is not None:
            kwargs.setdefault("timeout", client_timeout)
        self.kwargs = kwargs
        self.target = fs.encode_url(path)

    async def prepare(self) -> None:
        """Make the filesystem's session."""
        await self.fs.set_session()

    def conditions(self, pin: Pin) -> dict[str, str]:
        """The conditional headers for ``pin``."""
        return conditions(pin)

    async def get(self, start: int, end: int, pin: Pin) -> Answer:
        """One conditional ranged GET (see the module)."""
        session = await self.fs.set_session()
        headers = {**self.headers, "Range": f"bytes={start}-{end - 1}", **self.conditions(pin)}
        async with session.get(self.target, headers=headers, **self.kwargs) as resp:
            return await answer_of(pin, resp.status, resp.headers, resp, start, end, headers)

    async def get_whole(self, limit: int | None) -> bytes:
        """One plain GET of the whole file, bounded (see :func:`read_body`)."""
        session = await self.fs.set_session()
        async with session.get(self.target, headers=self.headers, **self.kwargs) as resp:
            if resp.status == 404:
                raise FileNotFoundError(redact_url(self.url))
            resp.raise_for_status()
            return await read_body(resp, self.url, limit)


def conditions(pin: Pin) -> dict[str, str]:
    """The conditional headers of an HTTP request for ``pin``.

    ``If-Match`` the pinned etag, else ``If-Unmodified-Since`` the first answer's date.
    """
    condition = pin.if_match()
    if condition is not None:
        return {"If-Match": condition}
    since = pin.if_unmodified_since()
    return {"If-Unmodified-Since": since} if since is not None else {}


async def read_body(resp: Any, url: str, limit: int | None) -> bytes:
    """The whole body of aiohttp answer ``resp``, refused past ``limit`` bytes or if encoded."""
    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise PermanentRemoteError(
            f"answered with Content-Encoding {encoding!r}, not the file's bytes",
            shard=redact_url(url),
        )
    announced = resp.content_length
    if limit is not None and announced is not None and announced > limit:
        raise too_large(url, announced, limit)
    body = bytearray()
    async for piece in resp.content.iter_chunked(1 << 16):
        body += piece
        if limit is not None and len(body) > limit:
            raise too_large(url, len(body), limit)
    return bytes(body)


async def answer_of(
    pin: Pin,
    status: int,
    headers: Mapping[str, str],
    resp: Any,
    start: int,
    end: int,
    sent: Mapping[str, str],
) -> Answer:
    """The :class:`Answer` of an aiohttp response ``resp`` to a ranged GET (HTTP, GCS)."""
    if status == 412:
        raise pin.refused("HTTP 412 for " + " ".join(f"{k}: {v}" for k, v in _conditions(sent)))
    if status == 404:
        raise FileNotFoundError(redact_url(pin.url))
    etag = headers.get("etag") or None
    mtime = _date(headers.get("last-modified")) if etag is None or pin.wants_date else None
    if status == 416:  # the file shrank below the range? what it says of the file decides
        pin.learn(_span(headers.get("content-range"))[1], etag, mtime)
    resp.raise_for_status()
    data = await read_bounded(resp, pin.url, start, end)
    if status == 200:
        return Answer(data, len(data), etag, mtime, None, True)
    span, total = _span(headers.get("content-range"))
    return Answer(data, total, etag, mtime, span, False, headers.get("content-range") or "")


def _conditions(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers.items() if k.startswith("If-")]


async def read_bounded(resp: Any, url: str, start: int, end: int) -> bytes:
    """The body of aiohttp answer ``resp`` to the range ``[start, end)``, never much more.

    A server that ignores ``Range`` and sends a whole (possibly huge) file is refused from its
    ``Content-Length``, or once the body passes the range's length, not read to its end; an
    encoded body is refused (asked for identity: decoding could expand it without bound).
    """
    n = end - start
    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise PermanentRemoteError(
            f"range {start}-{end}: answered with Content-Encoding {encoding!r}, not the bytes",
            shard=redact_url(url),
        )
    announced = resp.content_length
    if announced is not None and announced > n:
        raise ignores_range(url, start, end, announced)
    if announced is not None:
        data: bytes = await resp.read()
        return data
    body = bytearray()
    async for piece in resp.content.iter_chunked(1 << 16):
        body += piece
        if len(body) > n:
            raise ignores_range(url, start, end, len(body))
    return bytes(body)
