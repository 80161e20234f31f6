"""Sequential reads of a whole file: fixed-size blocks, or one streaming HTTP GET.

:meth:`Source.open_stream <wids.storage.source.Source.open_stream>` returns a :class:`Stream`
(buffered, ``read(n)`` gives ``n`` bytes unless at the end) over one of:

- :class:`BlockStream`: one range read per block (1 MiB local, 16 MiB remote), each with its
  own retries, through the source's :meth:`read_range`;
- :class:`HttpStream`: one streaming GET for the whole pass (``If-Match`` the stat's etag); a
  chunk that fails reopens the GET at the current offset, under the retry policy.

:func:`download` copies a whole file through such a stream and checks what it got.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO, Protocol

from ..errors import (
    CorruptReadError,
    IndexMismatchError,
    RangeNotSupportedError,
    ShortReadError,
)
from .answer import Pin, changed, too_large
from .redact import redact_url
from .retry import Attempts, retry_async
from .stats import FileStat, IOStats

__all__ = [
    "LOCAL_BLOCK",
    "REMOTE_BLOCK",
    "BlockStream",
    "HttpStream",
    "Readable",
    "Stream",
    "download",
]

LOCAL_BLOCK = 1 << 20
REMOTE_BLOCK = 16 << 20
_HTTP_CHUNK = 1 << 20  # one timed read from the streaming response


class Readable(Protocol):
    """What a stream reads from: a :class:`~wids.storage.source.Source`."""

    url: str
    is_local: bool

    def info(self, stats: IOStats | None = None) -> FileStat:
        """Stat the file."""
        ...

    def open_stream(self, stats: IOStats | None = None) -> BinaryIO:
        """A sequential reader of the whole file."""
        ...

    def read_range(self, start: int, end: int, stats: IOStats | None = None) -> bytes:
        """Exactly the bytes ``[start, end)``."""
        ...

    def attempts(
        self, what: str, stats: IOStats | None, *, count_requests: bool = True
    ) -> Attempts:
        """Book-keeping for one request under the source's retry policy."""
        ...


def _nbytes(data: bytes) -> int:
    return len(data)


class BlockStream(io.RawIOBase):
    """A seekable read-only view of a Source that fetches ``block`` bytes per request."""

    def __init__(self, source: Readable, stat: FileStat, stats: IOStats | None, block: int):
        super().__init__()
        self.source = source
        self.stat = stat
        self.stats = stats
        self.block = block
        self.pos = 0
        self.buf = b""
        self.buf_start = 0

    def readable(self) -> bool:
        """Always."""
        return True

    def seekable(self) -> bool:
        """Always: a seek only moves the position, the next read fetches from there."""
        return True

    def tell(self) -> int:
        """The position."""
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move the position (no I/O)."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.stat.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self.pos = base + offset
        return self.pos

    def readinto(self, b: Any) -> int:
        """Fill ``b`` from the buffer, fetching the next block when it is used up."""
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
        """Drop the buffer."""
        self.buf = b""
        super().close()


class HttpStream(BlockStream):
    """One streaming GET for the whole pass; a failed chunk reopens it at the current offset."""

    def __init__(self, source: Readable, stat: FileStat, stats: IOStats | None, fs: Any, path: str):
        super().__init__(source, stat, stats, _HTTP_CHUNK)
        self.fs = fs
        self.path = path
        self.resp: Any = None
        self.resp_pos = -1  # the offset the open response delivers next

    def _fetch(self, want: int) -> bytes:
        n = min(self.block, self.stat.size - self.pos)
        what = f"could not read on from byte {self.pos}"
        attempts = self.source.attempts(what, self.stats, count_requests=False)
        op = self._chunk_op(n)
        import fsspec.asyn  # here, not at import: local reads never need it

        data: bytes = fsspec.asyn.sync(
            self.fs.loop, retry_async, attempts, op, _nbytes, self.fs.set_session
        )
        return data

    def _chunk_op(self, n: int) -> Callable[[], Awaitable[bytes]]:
        async def op() -> bytes:
            try:
                if self.resp is None or self.resp_pos != self.pos:
                    await self._open()
                data: bytes = await self.resp.content.readexactly(n)
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
        pin = Pin(self.source.url, self.stat.size, self.stat.etag)
        condition = pin.if_match()
        if condition is not None:
            headers["If-Match"] = condition
        elif self.stat.mtime is not None:  # no etag: tied to the stat's Last-Modified
            pin.learn(None, None, self.stat.mtime)
            headers["If-Unmodified-Since"] = pin.if_unmodified_since() or ""
        if self.stats is not None:
            self.stats.requests += 1
        resp = await session.get(self.fs.encode_url(self.path), headers=headers, **kwargs)
        try:
            if resp.status == 404:
                raise FileNotFoundError(self.path)
            if resp.status == 412:
                sent = headers.get("If-Match") or headers.get("If-Unmodified-Since")
                raise changed(self.source.url, f"HTTP 412 for {sent}")
            resp.raise_for_status()
            if resp.status != 206 and self.pos > 0:
                raise RangeNotSupportedError(
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
        """Close the open response (on its event loop) and drop the buffer."""
        resp, self.resp = self.resp, None
        if resp is not None and not self.fs.loop.is_closed():
            self.fs.loop.call_soon_threadsafe(resp.close)
        super().close()


class Stream(io.BufferedReader):
    """A buffered :class:`BlockStream` (``read(n)`` returns ``n`` bytes unless at the end)."""

    def __init__(self, raw: BlockStream) -> None:
        super().__init__(raw, buffer_size=64 << 10)

    @property
    def stat(self) -> FileStat:
        """The stat taken when the stream was opened."""
        return self.raw.stat  # type: ignore[no-any-return,attr-defined]


def download(
    source: Readable,
    dest: str,
    stats: IOStats | None,
    expected_size: int | None = None,
    limit: int | None = None,
) -> FileStat:
    """Copy the whole file to local path ``dest`` and verify its size (see ``Source.download``).

    ``dest`` is removed again if anything fails. A download of several blocks (not over HTTP,
    where one GET is pinned to the etag) ends with a second stat: a file that changed
    meanwhile is refused, not stitched together.
    """
    try:
        with source.open_stream(stats) as stream, open(dest, "wb") as out:
            stat: FileStat = stream.stat  # type: ignore[attr-defined]
            raw: BlockStream = stream.raw  # type: ignore[attr-defined]
            if expected_size is not None and stat.size != expected_size:
                raise IndexMismatchError(
                    f"size is {stat.size}, the index says {expected_size}",
                    shard=redact_url(source.url),
                )
            if limit is not None and stat.size > limit:
                raise too_large(source.url, stat.size, limit)
            shutil.copyfileobj(stream, out, 1 << 20)
            written = out.tell()
        if written != stat.size:
            raise ShortReadError(
                f"downloaded {written} of {stat.size} bytes", shard=redact_url(source.url)
            )
        if not source.is_local and not isinstance(raw, HttpStream) and written > raw.block:
            _check_unchanged(source, stat, stats)  # blocks could come from two versions
    except BaseException:
        try:
            os.unlink(dest)
        except FileNotFoundError:
            pass
        raise
    return stat


def _check_unchanged(source: Readable, before: FileStat, stats: IOStats | None) -> None:
    after = source.info(stats)
    if (after.size, after.etag, after.mtime) != (before.size, before.etag, before.mtime):
        raise IndexMismatchError(
            "the file changed while it was being downloaded", shard=redact_url(source.url)
        )
