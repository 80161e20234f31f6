"""The latency proxy's fast path: plain requests relayed by ``asyncio.Protocol`` callbacks.

Nearly every request a benchmark sends through ``tools/latencyproxy.py`` is a GET or HEAD
without a body whose answer is framed by ``Content-Length``. The stream-based relay
(coroutines over ``StreamReader``/``StreamWriter``, a task per connection, two sleeps per
answer) cost ~180 us of CPU per 23 KB ranged GET, on the very cores of the client it measures:
in bursts of 128 requests (4 DataLoader workers x 32) that queued answers for ~10 ms past the
emulated delay. Here the same exchange is a few callbacks and two timers: the answer's head
is written by a timer at ``arrival + delay``, each body piece (up to ``CHUNK`` bytes) by a
timer at ``head + bytes so far / rate`` (what :class:`~httprelay.Pacer` does).

Anything else goes back to the stream-based relay on the same connection, with the bytes
already read (:func:`to_streams`): a request with a body (an S3 PUT) before it is forwarded,
an answer framed otherwise (chunked, until close, 1xx) as soon as its head is read.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from httprelay import CHUNK, TIMER_MARGIN, Message

__all__ = ["Relay", "plain_request", "to_streams"]

_HEAD_LIMIT = 1 << 20


def plain_request(request: Message) -> bool:
    """A request the fast path takes: no body (no length but 0, no chunks, no ``Expect``)."""
    length = request.get(b"content-length")
    return (
        (length is None or length.strip() == b"0")
        and request.get(b"transfer-encoding") is None
        and request.get(b"expect") is None
        and not request.start.startswith(b"CONNECT ")
    )


def to_streams(
    transport: Any, buffered: bytes | bytearray, loop: asyncio.AbstractEventLoop, eof: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream reader and writer over a connection a protocol had, ``buffered`` read first
    (and ``eof`` if the other side has finished sending)."""
    reader = asyncio.StreamReader(limit=_HEAD_LIMIT, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if buffered:
        reader.feed_data(bytes(buffered))
    if eof or transport.is_closing():
        reader.feed_eof()
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class _Upstream(asyncio.Protocol):
    """The upstream connection of one client connection: hands everything to its relay."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.relay.upstream_data(self, data)

    def eof_received(self) -> bool:
        return False  # closes: an answer cut short fails in connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.upstream_lost(self)


class _Exchange:
    """One request being answered."""

    __slots__ = (
        "arrived",
        "body",
        "head_at",
        "keep_client",
        "keep_up",
        "length",
        "method",
        "request",
        "response",
        "timer",
        "sent",
    )

    def __init__(self, request: Message, method: str, arrived: float) -> None:
        self.request, self.method, self.arrived = request, method, arrived
        self.response: Message | None = None
        self.body = bytearray()  # upstream bytes received and not yet sent on
        self.length = self.sent = 0
        self.head_at = 0.0
        self.keep_client = self.keep_up = True
        self.timer: asyncio.TimerHandle | None = None


class Relay(asyncio.Protocol):
    """One client connection of the proxy.

    Args:
        proxy: The ``LatencyProxy`` (its settings, counters, ``_control``, ``_client`` and
            ``_finish`` for the stream-based relay).
    """

    def __init__(self, proxy: Any) -> None:
        self.proxy = proxy
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.buf = bytearray()
        self.up: _Upstream | None = None
        self.ex: _Exchange | None = None
        self.counted = False
        self.eof = self.paused = self.handed_over = False
        self.last = time.monotonic()
        self.idle_timer: asyncio.TimerHandle | None = None

    # -- the client connection --------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.proxy._relays.add(self)
        self.idle_timer = self.loop.call_later(self.proxy.idle, self._idle_check)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.ex is None:
            self._next()

    def eof_received(self) -> bool:
        self.eof = True
        if self.ex is None:
            self._close()
        return True  # the answer under way may still be written

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy._relays.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        if not self.handed_over:
            self._abort()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.ex is not None and self.ex.head_at:
            self._pump()

    def _idle_check(self) -> None:
        left = self.last + self.proxy.idle - time.monotonic()
        if self.ex is None and left <= 0:
            self._close()
        else:
            self.idle_timer = self.loop.call_later(max(left, 0.1), self._idle_check)

    def _close(self) -> None:
        if self.transport is not None and not self.handed_over:
            self.transport.close()
        self._drop_upstream()

    def _drop_upstream(self) -> None:
        up, self.up = self.up, None
        if up is not None and up.transport is not None:
            up.transport.close()

    def _abort(self) -> None:
        """The exchange under way fails: counted out, both connections closed."""
        ex, self.ex = self.ex, None
        if ex is not None:
            if ex.timer is not None:
                ex.timer.cancel()
            self.proxy._flight(-1, ex.arrived)
        self._close()

    # -- requests -----------------------------------------------------------------------------

    def _next(self) -> None:
        """Take the next request from the buffer, if its head is complete."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > _HEAD_LIMIT:
                self._close()
            elif self.eof:
                self._close()
            return
        self.last = arrived = time.monotonic()
        head = bytes(self.buf[: end + 4])
        request = Message(head)
        proxy = self.proxy
        if b" " + proxy.control_path in request.start:
            del self.buf[: end + 4]
            self.transport.write(proxy._control_answer(request))
            if self.buf:
                self._next()
            return
        if not plain_request(request):
            self._hand_over()
            return
        del self.buf[: end + 4]
        if not self.counted:
            proxy._count(connections=1)
            self.counted = True
        method = request.start.split(b" ", 1)[0].decode("ascii", "replace")
        proxy._count_request(method)
        proxy._flight(+1)
        self.ex = _Exchange(request, method, arrived)
        if self.up is None:
            self.loop.create_task(self._connect(request.encode()))
        else:
            self.up.transport.write(request.encode())

    async def _connect(self, request: bytes) -> None:
        try:
            _, up = await self.loop.create_connection(lambda: _Upstream(self), *self.proxy.upstream)
        except OSError:
            self._abort()
            return
        if self.ex is None:  # the client went away meanwhile
            up.transport.close()
            return
        self.up = up
        up.transport.write(request)

    def _hand_over(self) -> None:
        """The stream-based relay takes this connection from here (a request with a body)."""
        self.handed_over = True
        self._drop_upstream()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.proxy._relays.discard(self)
        reader, writer = to_streams(self.transport, self.buf, self.loop, self.eof)
        self.proxy._spawn(self.proxy._client(reader, writer, counted=self.counted))

    # -- answers ------------------------------------------------------------------------------

    def upstream_data(self, up: _Upstream, data: bytes) -> None:
        ex = self.ex
        if up is not self.up or ex is None:  # spoken out of turn: never reused
            up.transport.close()
            if up is self.up:
                self.up = None
            return
        ex.body += data
        if ex.response is None:
            self._answer_head(ex)
        elif ex.head_at and ex.timer is None:
            self._pump()
        if len(ex.body) > 4 * CHUNK and not self.handed_over:  # the client is slower
            up.transport.pause_reading()

    def upstream_lost(self, up: _Upstream) -> None:
        if up is not self.up:
            return
        self.up = None
        ex = self.ex
        if ex is None or self.handed_over:
            return
        if ex.response is not None and ex.sent + len(ex.body) >= ex.length:
            ex.keep_up = False  # it closed after a whole answer (HTTP/1.0): send it on
            return
        self._abort()

    def _answer_head(self, ex: _Exchange) -> None:
        while True:
            end = ex.body.find(b"\r\n\r\n")
            if end < 0:
                if len(ex.body) > _HEAD_LIMIT:
                    self._abort()
                return
            response = Message(bytes(ex.body[: end + 4]))
            status = int(response.start.split(b" ", 2)[1])
            if not 100 <= status < 200 or status == 101:
                break
            del ex.body[: end + 4]  # an interim answer: the stream relay would skip it too
        no_body = ex.method == "HEAD" or status in (204, 304) or status < 200
        length = response.get(b"content-length")
        if not no_body and (length is None or not length.strip().isdigit()):
            self._hand_over_answer(ex, response, end + 4)
            return
        del ex.body[: end + 4]
        ex.response = response
        ex.length = 0 if no_body else int(length)  # type: ignore[arg-type]
        ex.keep_client = not ex.request.closes()
        ex.keep_up = not response.closes()
        if no_body and ex.body:  # bytes after a bodiless answer: that connection is done
            ex.keep_up = False
            ex.body.clear()
        wait = ex.arrived + self.proxy.delay - time.monotonic()
        if wait > 0:
            ex.timer = self.loop.call_later(wait + TIMER_MARGIN, self._send_head)
        else:
            self._send_head()

    def _hand_over_answer(self, ex: _Exchange, response: Message, head_len: int) -> None:
        """The stream-based relay sends this answer (chunked, until close) and goes on."""
        self.handed_over = True
        self.ex = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.proxy._relays.discard(self)
        up, self.up = self.up, None
        assert up is not None
        upstream = to_streams(up.transport, ex.body[head_len:], self.loop)
        reader, writer = to_streams(self.transport, self.buf, self.loop, self.eof)
        self.proxy._spawn(
            self.proxy._finish(
                ex.request, response, ex.method, ex.arrived, reader, writer, upstream
            )
        )

    def _send_head(self) -> None:
        ex = self.ex
        if ex is None or ex.response is None:
            return
        ex.timer = None
        keep = [] if ex.keep_client else [(b"Connection", b"close")]
        self.transport.write(ex.response.encode(keep))
        ex.head_at = time.monotonic()
        self._pump()

    def _pump(self) -> None:
        """Send the next piece of the body when it is due (and buffered), or end the answer."""
        ex = self.ex
        if ex is None or ex.timer is not None or self.paused:
            return
        if ex.sent >= ex.length:
            self._done(ex)
            return
        n = min(CHUNK, ex.length - ex.sent)
        if len(ex.body) < n:
            return  # upstream_data calls again
        rate = self.proxy.rate
        wait = ex.head_at + (ex.sent + n) / rate - time.monotonic() if rate > 0 else 0.0
        if wait > 0:
            ex.timer = self.loop.call_later(wait + TIMER_MARGIN, self._piece)
        else:
            self._piece()

    def _piece(self) -> None:
        ex = self.ex
        if ex is None:
            return
        ex.timer = None
        n = min(CHUNK, ex.length - ex.sent)
        piece = bytes(ex.body[:n])
        del ex.body[:n]
        self.proxy._count_out(n)
        self.transport.write(piece)
        ex.sent += n
        if self.up is not None and len(ex.body) < CHUNK:
            self.up.transport.resume_reading()
        self._pump()

    def _done(self, ex: _Exchange) -> None:
        self.ex = None
        self.proxy._flight(-1, ex.arrived)
        self.last = time.monotonic()
        if not ex.keep_up or ex.body:  # upstream sent more than its answer: not reused
            self._drop_upstream()
        if not ex.keep_client:
            self._close()
        elif self.buf:
            self._next()
        elif self.eof:
            self._close()
