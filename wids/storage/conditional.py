"""Range reads that are checked end to end and tied to one version of the file (HTTP and S3).

fsspec's ``_cat_file`` neither makes a request conditional nor shows the answer's headers, so
for HTTP and S3 wids makes the request itself, as fsspec would, and checks the answer:

- the request carries ``If-Match`` (HTTP) / ``IfMatch`` (S3) the etag the reader pins (the
  index's, or else its first answer's); HTTP 412 / ``PreconditionFailed``, or an answer with
  another etag, means the file was replaced while it was read:
  :class:`~wids.errors.IndexMismatchError`, never bytes of two versions;
- the answer's ``Content-Range`` must be the range asked for (else
  :class:`~wids.errors.CorruptReadError`, retried) and its total the size the index records;
- the body must be exactly as long as the range (a short one is
  :class:`~wids.errors.ShortReadError`, retried; a longer one means the server ignores Range).

The reader is anything with ``url``, ``size``, ``etag`` and ``answer_check`` (:class:`Pinned`):
a :class:`~wids.storage.source.Source`.

First touch without a stat: while a reader holds an ``answer_check`` (the dataset's
fingerprint check, deferred), its requests are not conditional and each answer's
:class:`~wids.storage.stats.FileStat` (size from the ``Content-Range`` total, ``ETag``,
``Last-Modified``) goes to that check before anything else is looked at; the first answer that
passes clears it and pins the etag. A ``416`` (the file shrank below the range) is checked the
same way, so a replaced file is reported as such, not as a bad range. Only when an answer
carries no size does the check fall back to a stat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..errors import CorruptReadError, IndexMismatchError, PermanentRemoteError, ShortReadError
from .backends import file_stat
from .http1 import AnswerTooLong, Http1Pool, HttpStatusError
from .redact import redact_url
from .stats import FileStat, comparable_etag

__all__ = [
    "AnswerCheck",
    "HttpTarget",
    "Pinned",
    "changed",
    "check_answer",
    "check_length",
    "http1_range",
    "http_range",
    "if_match",
    "s3_range",
]


AnswerCheck = Callable[[FileStat], None]
"""A check of what an answer says of the file (raises if it is not the expected file)."""


class Pinned(Protocol):
    """A reader of one file: its URL, the size it expects and the etag it reads (or ``None``).

    ``answer_check``, while set, is run on what the next answers say of the file.
    """

    url: str
    size: int | None
    etag: str | None
    answer_check: AnswerCheck | None


def _total(content_range: str | None) -> int | None:
    """The total size a ``Content-Range`` value announces (``bytes a-b/N``, ``bytes */N``)."""
    if not content_range:
        return None
    total = content_range.rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None


async def _answered(
    pin: Pinned, fs: Any, path: str, size: int | None, meta: Mapping[str, Any]
) -> None:
    """Run ``pin.answer_check`` on what an answer says (a stat if it gives no size); clear it."""
    check = pin.answer_check
    if check is None:
        return
    if size is None:
        info = await fs._info(path)
        stat = file_stat(info, int(info["size"]))
    else:
        stat = file_stat(meta, size)
    check(stat)  # raises if the file is not the expected one
    pin.answer_check = None


def check_length(url: str, data: bytes, start: int, end: int) -> bytes:
    """``data`` if it is exactly the range ``[start, end)`` long, else the error it is."""
    n = end - start
    if len(data) < n:
        raise ShortReadError(
            f"range {start}-{end}: got {len(data)} of {n} bytes", shard=redact_url(url)
        )
    if len(data) > n:
        raise ignores_range(url, start, end, len(data))
    return data


def ignores_range(url: str, start: int, end: int, got: int) -> PermanentRemoteError:
    """The error for an answer longer than the range ``[start, end)`` asked for."""
    return PermanentRemoteError(
        f"range {start}-{end}: got {got} bytes for {end - start}; the server ignores Range",
        shard=redact_url(url),
    )


async def read_bounded(resp: Any, url: str, start: int, end: int) -> bytes:
    """The body of aiohttp answer ``resp`` to the range ``[start, end)``, never much more.

    A server that ignores ``Range`` and sends a whole (possibly huge) file is refused from its
    ``Content-Length``, or once the body passes the range's length, not read to its end.
    """
    n = end - start
    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":  # asked for identity: decoding could expand it without bound
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


def changed(url: str, what: str) -> IndexMismatchError:
    """The error for a file that changed while it was read (``what`` says how we know)."""
    return IndexMismatchError(
        f"the file changed while it was read ({what}); rebuild the index if the change is intended",
        shard=redact_url(url),
    )


def if_match(etag: str | None) -> str | None:
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


def _invalid_range(exc: BaseException | None) -> bool:
    """Whether a backend error (or its cause) is S3 ``InvalidRange`` / HTTP 416."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, Mapping):
            if response.get("Error", {}).get("Code") == "InvalidRange":
                return True
            if response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                return True
        exc = exc.__cause__
    return False


def check_answer(
    pin: Pinned, start: int, end: int, content_range: str | None, etag: str | None
) -> None:
    """Check an answer's ``Content-Range`` and etag; keep the etag if none was known."""
    if etag:
        if pin.etag is None:
            pin.etag = etag
        elif comparable_etag(etag) != comparable_etag(pin.etag):
            raise changed(pin.url, f"etag {etag!r} where it was {pin.etag!r}")
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
            shard=redact_url(pin.url),
        )
    if pin.size is not None and total.strip() not in ("*", str(pin.size)):
        raise changed(pin.url, f"its size is {total.strip()}, the index says {pin.size}")


class HttpTarget:
    """What every ranged GET of one file repeats, made once per file and process.

    fsspec's ``_cat_file`` makes these anew for each request (the encoded URL, the request
    options and headers); kept, a request costs only its own work.

    Args:
        fs: fsspec's HTTP filesystem.
        path: The file's path (URL) on it.
        timeout: An ``aiohttp.ClientTimeout`` for each request (``None``: the session's). The
            caller's per-attempt timeout bounds a request whole, so the session's per-read
            timer need not be re-armed for every piece of every answer.
    """

    __slots__ = ("fs", "headers", "kwargs", "path", "url")

    def __init__(self, fs: Any, path: str, timeout: Any = None) -> None:
        self.fs, self.path = fs, path
        kwargs = dict(fs.kwargs)
        self.headers: dict[str, str] = dict(kwargs.pop("headers", None) or {})
        # the bytes of the file, not a compressed form: lengths are checked before decoding
        self.headers.setdefault("Accept-Encoding", "identity")
        if timeout is not None:
            kwargs.setdefault("timeout", timeout)
        self.kwargs = kwargs
        self.url = fs.encode_url(path)


async def http_range(pin: Pinned, target: HttpTarget, start: int, end: int) -> bytes:
    """One ranged GET as in fsspec's ``_cat_file``, but conditional and checked."""
    fs, path = target.fs, target.path
    session = await fs.set_session()
    headers = target.headers.copy()
    headers["Range"] = f"bytes={start}-{end - 1}"
    condition = if_match(pin.etag) if pin.answer_check is None else None
    if condition is not None:
        headers["If-Match"] = condition
    async with session.get(target.url, headers=headers, **target.kwargs) as resp:
        if resp.status == 412:
            raise changed(pin.url, f"HTTP 412 for If-Match {condition}")
        if resp.status == 404:
            raise FileNotFoundError(path)
        await _first_answer(pin, fs, path, resp.status, resp.headers)
        resp.raise_for_status()
        data = await read_bounded(resp, pin.url, start, end)
        return _checked(pin, resp.status, resp.headers, data, start, end)


async def http1_range(
    pin: Pinned, pool: Http1Pool, target: str, start: int, end: int, fs: Any = None, path: str = ""
) -> bytes:
    """:func:`http_range` on a plain keep-alive connection (:mod:`wids.storage.http1`).

    The same checks of the answer, a pending ``answer_check`` included (a shard's first answer
    in a process: what it says of the file's size and etag; ``fs`` and ``path`` stat the file
    only if it says no size).

    Raises:
        Unsupported: The answer needs aiohttp (nothing of it was used).
    """
    headers = f"Range: bytes={start}-{end - 1}\r\n"
    condition = if_match(pin.etag) if pin.answer_check is None else None
    if condition is not None:
        headers += f"If-Match: {condition}\r\n"
    try:  # an error page is small; a range answer is the range
        answer = await pool.get(target, headers, max(end - start, 1 << 16))
    except AnswerTooLong as e:
        raise ignores_range(pin.url, start, end, e.length) from None
    status = answer.status
    if status == 412:
        raise changed(pin.url, f"HTTP 412 for If-Match {condition}")
    if status == 404:
        raise FileNotFoundError(redact_url(pin.url))
    await _first_answer(pin, fs, path, status, answer.headers)
    if status >= 400:
        raise HttpStatusError(status, "")
    return _checked(pin, status, answer.headers, answer.body, start, end)


async def _first_answer(
    pin: Pinned, fs: Any, path: str, status: int, headers: Mapping[str, str]
) -> None:
    """A shard's first answer in a process: what it says of the file's size and etag, checked.

    ``headers`` are looked up by lower-case names (aiohttp's are case-insensitive, the plain
    client's lower-cased).
    """
    if pin.answer_check is None or status not in (200, 206, 416):
        return
    size = _total(headers.get("content-range"))
    if status == 200 and headers.get("content-length", "").isdigit():
        size = int(headers["content-length"])  # the whole file
    meta = {"ETag": headers.get("etag"), "Last-Modified": headers.get("last-modified")}
    await _answered(pin, fs, path, size, meta)


def _checked(
    pin: Pinned, status: int, headers: Mapping[str, str], data: bytes, start: int, end: int
) -> bytes:
    """A range answer's body, checked: not a whole file, not short, the range and etag asked."""
    if status == 200 and start > 0 and len(data) == end - start:
        raise CorruptReadError(
            f"asked for bytes {start}-{end} and got a whole file (HTTP 200) of that length",
            shard=redact_url(pin.url),
        )
    check_length(pin.url, data, start, end)  # a short answer is a short read
    content_range = headers.get("content-range") if status == 206 else None
    check_answer(pin, start, end, content_range, headers.get("etag"))
    return data


async def s3_range(pin: Pinned, fs: Any, path: str, start: int, end: int) -> bytes:
    """One ``get_object`` as in s3fs's ``_cat_file``, but conditional and checked."""
    bucket, key, version = fs.split_path(path)
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end - 1}"}
    if version:
        kwargs["VersionId"] = version
    condition = if_match(pin.etag) if pin.answer_check is None else None
    if condition is not None:
        kwargs["IfMatch"] = condition
    try:
        resp = await fs._call_s3("get_object", **kwargs)
    except Exception as exc:
        if _precondition_failed(exc):
            raise changed(pin.url, f"precondition failed for IfMatch {condition}") from None
        if pin.answer_check is not None and _invalid_range(exc):
            await _answered(pin, fs, path, None, {})  # the file shrank? a stat tells
        raise
    try:
        if pin.answer_check is not None:
            meta = {"ETag": resp.get("ETag"), "LastModified": resp.get("LastModified")}
            await _answered(pin, fs, path, _total(resp.get("ContentRange")), meta)
        data: bytes = await resp["Body"].read()
    finally:
        resp["Body"].close()
    check_length(pin.url, data, start, end)  # a short answer is a short read
    check_answer(pin, start, end, resp.get("ContentRange"), resp.get("ETag"))
    return data
