"""Retries: the policy, sorting failures into kinds, and the synchronous retry loop.

Failures are sorted into three kinds:

- *not found* (404, no such key) raises :class:`~wids.errors.ShardNotFoundError` at once;
- *permanent* (403, 416, no bucket, bad credentials) raises
  :class:`~wids.errors.PermanentRemoteError` at once;
- *transient* (connection reset or refused, timeouts, HTTP 5xx and 429, short reads, bytes
  that fail their end-to-end check) is retried with exponential backoff and full jitter,
  bounded by :class:`RetryPolicy`'s ``attempts`` and ``max_time``; then
  :class:`~wids.errors.RetriesExhaustedError` (or :class:`~wids.errors.ShortReadError` /
  :class:`~wids.errors.CorruptReadError` when the last failure was a short or wrong read).

:class:`~wids.errors.IndexMismatchError` (the shard changed: a conditional request failed)
is not a failure to retry: it propagates unchanged.

Exceptions that are none of these (programming errors) propagate unchanged. Backend
exceptions are recognised by class name and attributes (HTTP status, errno), so no storage
backend, and not fsspec, is imported here; the I/O itself lives in :mod:`wids.storage.source`.

Both retry loops are here: :func:`retry_sync` and :func:`retry_async` (which runs on fsspec's
event loop, driven by the caller); :class:`Attempts` is the book-keeping they share.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import (
    CorruptReadError,
    PermanentRemoteError,
    RangeNotSupportedError,
    RemoteError,
    RetriesExhaustedError,
    ShardNotFoundError,
    ShortReadError,
    TooLargeError,
    WidsError,
)
from .redact import _scrub, redact_url
from .stats import IOStats

__all__ = ["Attempts", "RetryPolicy", "classify", "retry_async", "retry_sync"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try one request.

    Args:
        attempts: Total tries per request (1 means no retry).
        max_time: Total seconds for one request, retries and backoff included.
        backoff: Base delay in seconds; the n-th retry waits a uniformly random time in
            ``[0, min(max_backoff, backoff * 2**n)]`` ("full jitter").
        max_backoff: Upper bound of one delay.
        timeout: Seconds after which a stalled attempt is abandoned (a transient failure).
    """

    attempts: int = 5
    max_time: float = 60.0
    backoff: float = 0.05
    max_backoff: float = 2.0
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {self.attempts}")
        for name in ("max_time", "timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff and max_backoff must be >= 0")


# ---------------------------------------------------------------------------------------------
# Classifying failures

_NOT_FOUND, _PERMANENT, _TRANSIENT, _UNKNOWN = "not found", "permanent", "transient", "unknown"

_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "ETIMEDOUT",
        "EPIPE",
        "EIO",
        "EBUSY",
        "EAGAIN",
        "EHOSTUNREACH",
        "ENETUNREACH",
        "ENETDOWN",
        "EREMOTEIO",
    )
    if hasattr(errno, name)
)

# Connection-level failures of aiohttp, botocore, urllib3/requests and fsspec, matched by class
# name so that no optional backend has to be imported here.
_TRANSIENT_NAMES = frozenset(
    {
        "TimeoutError",
        "FSTimeoutError",
        "ConnectionError",
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "ServerDisconnectedError",
        "ClientOSError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "HTTPClientError",
        "IncompleteRead",
        "ChunkedEncodingError",
        "ProtocolError",
        "ShortReadError",
        "FlexibleChecksumError",  # botocore: body does not match its checksum (cut short)
        "ChecksumError",  # gcsfs: the same
    }
)

# Answers no retry changes, matched by name as above: aiohttp's redirect failures (a redirect
# loop or too many hops, a redirect to an invalid or non-HTTP URL). Raised as they are, they
# were no WidsError, named no shard, and showed the URL's query (a presigned signature).
_PERMANENT_NAMES = frozenset(
    {"TooManyRedirects", "InvalidUrlRedirectClientError", "NonHttpUrlRedirectClientError"}
)


# S3 error codes that arrive as 404 but mean a configuration problem, not a missing shard.
_PERMANENT_CODES = frozenset({"NoSuchBucket"})


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status carried by a backend exception, if any."""
    for attr in ("status", "code", "status_code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)  # botocore ClientError
    if isinstance(response, Mapping):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


def _classify_status(status: int) -> str:
    if status == 404 or status == 410:
        return _NOT_FOUND
    if status in (408, 429) or (status >= 500 and status not in (501, 505)):
        return _TRANSIENT
    return _PERMANENT


def classify(exc: BaseException) -> str:
    """Sort a failure into not found / permanent / transient / unknown."""
    if isinstance(exc, (ShortReadError, CorruptReadError)):
        return _TRANSIENT
    if isinstance(exc, (ShardNotFoundError, PermanentRemoteError)):
        return _NOT_FOUND if isinstance(exc, ShardNotFoundError) else _PERMANENT
    response = getattr(exc, "response", None)  # botocore ClientError
    if isinstance(response, Mapping) and response.get("Error", {}).get("Code") in _PERMANENT_CODES:
        return _PERMANENT
    status = _status_of(exc)
    if status is not None and status >= 400:
        return _classify_status(status)
    if isinstance(exc, FileNotFoundError):
        # fsspec's HTTP info() turns *any* failure into FileNotFoundError; trust the cause.
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, FileNotFoundError):
            kind = classify(cause)
            return _NOT_FOUND if kind == _UNKNOWN else kind
        return _NOT_FOUND
    if isinstance(exc, PermissionError):
        return _PERMANENT
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _PERMANENT_NAMES:
        return _PERMANENT
    if names & _TRANSIENT_NAMES:
        return _TRANSIENT
    if isinstance(exc, OSError):
        if exc.errno in _TRANSIENT_ERRNOS:
            return _TRANSIENT
        return _PERMANENT
    return _UNKNOWN


def _describe(exc: BaseException, secrets: Sequence[str]) -> str:
    status = _status_of(exc)
    text = (exc.message if isinstance(exc, WidsError) else str(exc)) or repr(exc)
    head = f"{type(exc).__name__}" + (f" (HTTP {status})" if status else "")
    if isinstance(exc, FileNotFoundError) and exc.__cause__ is not None:
        return f"{head} caused by {_describe(exc.__cause__, secrets)}"
    return _scrub(f"{head}: {text}", secrets)


def _jitter() -> float:
    # os.urandom, not the random module: retries must not perturb a user's seeded RNG.
    return int.from_bytes(os.urandom(4), "little") / 2**32


class Attempts:
    """Book-keeping for one request under a retry policy (shared by the sync and async loops).

    Args:
        policy: The retry policy.
        url: The file (redacted in errors and logs).
        secrets: Values to mask in the description of a failure (the storage options' secrets).
        what: What is being done, for messages (``"could not read bytes 0-512"``).
        stats: Counters to add to, if any.
        count_requests: Whether each attempt counts as a request (a stream counts its own).
        denied_hint: Said after a refusal (401, 403: a permanent failure), e.g. that the
            storage options' credentials were withheld from this origin.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        url: str,
        secrets: Sequence[str],
        what: str,
        stats: IOStats | None,
        *,
        count_requests: bool = True,
        denied_hint: str = "",
    ) -> None:
        self.policy = policy
        self.denied_hint = denied_hint
        self.url = url
        self.secrets = secrets
        self.what = what
        self.stats = stats
        self.count_requests = count_requests
        self.start = time.monotonic()
        self.count = 0

    def begin(self) -> float:
        """Count one attempt and return its timeout."""
        self.count += 1
        if self.stats is not None and self.count_requests:
            self.stats.requests += 1
        remaining = self.policy.max_time - (time.monotonic() - self.start)
        return max(0.001, min(self.policy.timeout, remaining))

    def done(self, nbytes: int) -> None:
        """Count the bytes of a successful attempt."""
        if self.stats is not None:
            self.stats.bytes_read += nbytes

    def failed(self, exc: BaseException) -> float:
        """Raise the final error for ``exc``, or return the delay before the next attempt."""
        kind = classify(exc)
        if kind == _UNKNOWN or isinstance(exc, (TooLargeError, RangeNotSupportedError)):
            # the latter two keep their type: callers read whole files instead
            self._count_error()
            raise exc
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) and not str(exc):
            desc = f"TimeoutError: no answer within {self.policy.timeout:g}s"
        else:
            desc = _describe(exc, self.secrets)
        shard = redact_url(self.url)
        if kind == _NOT_FOUND:
            self._count_error()
            raise ShardNotFoundError(f"{self.what}: not found ({desc})", shard=shard) from None
        if kind == _PERMANENT:
            self._count_error()
            err = PermanentRemoteError(f"{self.what}: {desc}{self.denied_hint}", shard=shard)
            vars(err).update(attempts=self.count, status=_status_of(exc))
            raise err from None
        elapsed = time.monotonic() - self.start
        delay: float = _jitter() * min(
            self.policy.max_backoff, self.policy.backoff * 2 ** (self.count - 1)
        )
        if self.count >= self.policy.attempts or elapsed + delay >= self.policy.max_time:
            self._count_error()
            msg = (
                f"{self.what}: gave up after {self.count} attempts in {elapsed:.1f}s; last: {desc}"
            )
            cls: type[RemoteError] = RetriesExhaustedError
            if isinstance(exc, (ShortReadError, CorruptReadError)):
                cls = type(exc)
            final = cls(msg, shard=shard)
            vars(final).update(attempts=self.count, status=_status_of(exc))
            raise final from None
        if self.stats is not None:
            self.stats.retries += 1
        logger.debug("retrying %s of %s in %.3fs after %s", self.what, shard, delay, desc)
        return delay

    def _count_error(self) -> None:
        if self.stats is not None:
            self.stats.errors += 1


def retry_sync(attempts: Attempts, fn: Callable[[], T], size: Callable[[T], int]) -> T:
    """Call ``fn`` until it succeeds or ``attempts`` gives up; count ``size(result)`` bytes."""
    while True:
        attempts.begin()
        try:
            result = fn()
        except Exception as exc:
            time.sleep(attempts.failed(exc))
            continue
        attempts.done(size(result))
        return result


_timeout_cm = getattr(asyncio, "timeout", None)


async def retry_async(
    attempts: Attempts,
    fn: Callable[[], Awaitable[T]],
    size: Callable[[T], int],
    prepare: Callable[[], Awaitable[Any]] | None = None,
) -> T:
    """Await ``fn()`` until it succeeds or ``attempts`` gives up, each attempt under its timeout.

    ``prepare`` (if given) makes the backend's client before each attempt's clock starts:
    that is mostly CPU work (botocore loads its service models: ~0.5 s, more on a busy
    machine) that a per-attempt timeout cannot cut short anyway, and counted against an
    attempt it would only cause spurious timeouts. ``None``: the caller did that, as
    :func:`~wids.storage.batch.read_ranges` does once per batch.
    """
    while True:
        timeout = attempts.begin()
        try:
            if prepare is not None:
                await prepare()
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
