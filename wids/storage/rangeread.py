"""One checked range read of a remote file, as a coroutine prepared once per file and process.

The hot path of remote random access is one ranged request per sample, thousands a second, so
what every request of a file repeats is worked out once, when the file's filesystem is opened
in a process (:meth:`wids.storage.source.Source._range_read`): which transport makes the
request (:func:`~wids.storage.conditional.http_range` and
:func:`~wids.storage.conditional.s3_range`, conditional and checked, else fsspec's
``_cat_file``), and for HTTP the encoded URL, the request's options and headers
(:class:`~wids.storage.conditional.HttpTarget`) and the per-request timeout, and whether its
pinned reads can go on plain keep-alive connections (:mod:`wids.storage.http1`) instead of
aiohttp.

Every check stays per request: the answer's ``Content-Range`` and total size, the pinned etag
(``If-Match`` / ``IfMatch``), the length, the caller's ``check`` of the bytes (a tar header)
and, while one is set, the reader's ``answer_check`` (its deferred first-touch check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import CorruptReadError
from .backends import file_stat, is_http, is_s3
from .conditional import HttpTarget, Pinned, check_length, http1_range, http_range, s3_range
from .http1 import Http1Pool, Http1Pools, Unsupported
from .redact import redact_url

__all__ = ["Check", "RangeRead", "checked", "stat_check"]

Check = Callable[[bytes], "str | None"]
"""A check of the bytes of one range read: ``None`` if they are right, else what is wrong."""


def checked(url: str, data: bytes, start: int, end: int, check: Check | None) -> bytes:
    """``data`` if ``check`` accepts it (or there is none), else :class:`CorruptReadError`."""
    if check is not None:
        problem = check(data)
        if problem is not None:
            raise CorruptReadError(
                f"bytes {start}-{end} are not the ones asked for: {problem}",
                shard=redact_url(url),
            )
    return data


def stat_check(src: Pinned, info: Mapping[str, Any]) -> None:
    """Run ``src.answer_check`` (if set) on a stat's answer, then clear it."""
    check = src.answer_check
    if check is not None:
        check(file_stat(info, int(info["size"])))
        src.answer_check = None


class RangeRead:
    """The range reads of one remote file in this process: ``await read(start, end, check)``.

    Args:
        src: The file (its ``url``, pinned ``size`` and ``etag``, ``answer_check``): a
            :class:`~wids.storage.source.Source`.
        fs: Its asynchronous fsspec filesystem, opened in this process.
        path: Its path on ``fs``.
        timeout: Per-request HTTP timeout (see :class:`~wids.storage.conditional.HttpTarget`).
        plain: The store's pools of plain HTTP/1.1 connections, where the file's options allow
            them (:func:`~wids.storage.http1.plain_options`): its pinned reads go through
            :mod:`wids.storage.http1`, not aiohttp.
    """

    __slots__ = ("_http", "_plain", "_s3", "_target", "fs", "path", "src")

    def __init__(
        self, src: Pinned, fs: Any, path: str, timeout: Any = None, plain: Http1Pools | None = None
    ) -> None:
        self.src, self.fs, self.path = src, fs, path
        self._http = HttpTarget(fs, path, timeout) if is_http(fs) else None
        self._s3 = self._http is None and is_s3(fs)
        self._plain: Http1Pool | None = None
        self._target = ""
        if (
            self._http is not None
            and plain is not None
            and not self._http.kwargs.keys() - {"timeout"}
        ):
            self._plain = plain.pool(self._http.url)
            self._target = self._http.url.raw_path_qs

    async def __call__(self, start: int, end: int, check: Check | None = None) -> bytes:
        """Exactly bytes ``[start, end)``, checked (one request; no retries: the caller's)."""
        src = self.src
        if self._plain is not None:
            try:
                data = await http1_range(
                    src, self._plain, self._target, start, end, self.fs, self.path
                )
            except Unsupported:  # a redirect, another framing: aiohttp from now on
                self._plain = None
                data = await http_range(src, self._http, start, end)  # type: ignore[arg-type]
        elif self._http is not None:
            data = await http_range(src, self._http, start, end)
        elif self._s3:
            data = await s3_range(src, self.fs, self.path, start, end)
        else:
            if src.answer_check is not None:
                stat_check(src, await self.fs._info(self.path))
            data = check_length(
                src.url, await self.fs._cat_file(self.path, start=start, end=end), start, end
            )
        return checked(src.url, data, start, end, check)
