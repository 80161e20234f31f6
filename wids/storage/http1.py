"""Ranged GETs over plain HTTP/1.1 keep-alive connections, without aiohttp's per-request work.

Remote random access is one small ranged GET per sample. aiohttp spends ~200 us of CPU on
each (request and response objects, header multidicts, timers, cookie and redirect handling),
several times what the request itself needs; on a machine whose cores also decode and train,
that is the cost of remote reading. :class:`Http1Pool` sends exactly one request line and
its headers on a kept-alive connection and reads back a ``Content-Length`` answer through an
``asyncio.Protocol``: half the CPU of wids on aiohttp (tools/bench_reqcpu.py). A single read
in the calling thread (``ds[i]``) takes the same exchange on a blocking socket of its own
(:meth:`Http1Pool.get_sync`): no hop into the event loop's thread, and about half the CPU of
``http.client``, whose header parsing alone costs what the whole exchange costs here
(``python tools/bench_reqcpu.py ds``).

It is used only where it does what fsspec's HTTP filesystem would (:class:`PlainTransport`,
in place of :class:`~wids.storage.transport.HttpTransport`): ``http://`` and ``https://`` URLs (TLS
verified as aiohttp's default: ``ssl.create_default_context()``, the host name checked), no
storage options that change requests (headers, auth, client settings other than the timeout).
Over TLS too it earns its place: ``ds[i]`` reads 3-10x aiohttp's samples/s on loopback
(``python tools/bench_reqcpu.py ds --tls``; batches: ``python tools/bench_reqcpu.py --tls``).
A shard's first answer in a process comes this way too, and so do a small whole file (an
index, a member sidecar: one GET bounded by its limit), a stat (one HEAD) and the parts of a
whole-shard download (:mod:`wids.storage.parts`, in threads): a process that reads such
shards never imports aiohttp (0.3 s and two TLS contexts in a fresh DataLoader worker). It is
imported, and fsspec's HTTP filesystem made, only where something needs them
(:attr:`PlainTransport.http`: a stream, an answer this client does not handle).
An answer it does not handle (a redirect, a body framed otherwise than by ``Content-Length`` or
encoded, a length that is no plain number)
raises :class:`Unsupported` before any byte is used: the caller turns to aiohttp for that file.

Every answer becomes the same :class:`~wids.storage.answer.Answer` as aiohttp's, checked by
:func:`~wids.storage.answer.check_answer`; failures are typed for the retry loop: a lost or
cut connection is ``ConnectionResetError`` (transient), an HTTP error :class:`HttpStatusError`
(classified by its ``status``). A connection is reused only after a complete answer; one that
the server closed while idle is replaced once, transparently.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any

from .answer import Answer, Pin, ignores_range, too_large
from .backends import file_stat, plain_options
from .redact import redact_url
from .retry import RetryPolicy
from .stats import FileStat
from .transport import LOOP, Transport, _date, _span, conditions

__all__ = [
    "AnswerTooLong",
    "Http1Pool",
    "Http1Pools",
    "HttpStatusError",
    "PlainTransport",
    "Unsupported",
]

_HEAD_LIMIT = 64 * 1024
_IDLE_LIMIT = 64  # kept-alive connections per host and process; more are closed after use


class Unsupported(Exception):
    """An answer this client does not handle (redirect, no ``Content-Length``): use aiohttp."""


class AnswerTooLong(Exception):
    """An answer announcing more body bytes than the request's ``limit``; none were kept."""

    def __init__(self, length: int) -> None:
        super().__init__(f"the answer announces {length} bytes")
        self.length = length


class HttpStatusError(Exception):
    """An HTTP error answer; ``status`` is what the retry loop classifies."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status


class _Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


def _number(text: str, digits: int) -> bool:
    """Whether ``text`` is a plain decimal number of at most ``digits`` digits.

    ASCII only: ``str.isdigit`` takes ``'²'``, and ``int`` refuses thousands of digits.
    """
    return 0 < len(text) <= digits and text.isascii() and text.isdigit()


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str], bool]:
    """``(status, reason, headers by lowercase name, closes)`` of a response head."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not _number(code, 3):
        raise ConnectionResetError(errno.ECONNRESET, f"not an HTTP/1.x answer: {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    conn = headers.get("connection", "").lower()
    closes = "close" in conn or (version == "HTTP/1.0" and "keep-alive" not in conn)
    return int(code), reason, headers, closes


def _body_length(head: tuple[int, str, dict[str, str], bool], limit: int) -> int:
    """The body length an answer's head announces, if this client handles it.

    :data:`_SKIP` for an error answer announcing more than ``limit``: its status is the
    answer (as aiohttp's ``raise_for_status`` before any body byte), its body is not read and
    its connection not reused.

    Raises:
        Unsupported: A redirect, an encoded body, or a body not framed by ``Content-Length``.
        AnswerTooLong: More than ``limit`` bytes announced in a success answer (never
            buffered: a server that ignores ``Range`` would send the whole file).
    """
    status, _, headers, _ = head
    encoded = headers.get("content-encoding", "identity").lower() != "identity"
    if 300 <= status < 400 or "transfer-encoding" in headers or encoded:
        raise Unsupported(f"HTTP {status}, {headers.get('transfer-encoding')}")
    length = headers.get("content-length")
    if length is None or not _number(length, 18):
        raise Unsupported("no Content-Length")
    if int(length) > limit:
        if status >= 400:  # an error page (a proxy's HTML): its status matters, not its body
            return _SKIP
        raise AnswerTooLong(int(length))
    return int(length)


_SKIP = -1
"""The body length of an error answer whose body is longer than asked for: not read."""


def _request(target: str, host_header: str, headers: str, method: str = "GET") -> bytes:
    """A GET (or HEAD) request's bytes; ``headers`` are CRLF-ended ``Name: value`` lines."""
    return (
        f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n"
        f"Accept-Encoding: identity\r\n{headers}\r\n"
    ).encode("latin-1")


class _Silent(ConnectionResetError):
    """A connection that ended before any byte of the answer (closed by the server while idle)."""


class _SyncConn:
    """One thread's blocking kept-alive connection (:meth:`Http1Pool.get_sync`).

    A socket and nothing else: the request is one ``sendall``, the answer a few ``recv`` calls
    parsed by the same rules as :class:`_Conn`'s (``http.client`` would spend about as much
    CPU on its header parsing as the whole exchange costs here).
    """

    __slots__ = ("poller", "sock", "timeout", "tls")

    def __init__(
        self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None
    ) -> None:
        sock = socket.create_connection((host, port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # refused: only slower
            pass
        if tls is not None:
            try:  # the handshake, under the timeout
                sock = tls.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock: socket.socket | None = sock
        self.timeout = timeout
        self.tls = tls is not None
        self.poller = select.poll()  # a third of select.select's cost, paid per request
        self.poller.register(sock, select.POLLIN)

    def spoke(self) -> bool:
        """Whether it has something to read while idle (the server closed it, or sent junk).

        Over TLS also bytes already decrypted and held by the TLS layer; a record that is no
        data (a session ticket coming late) counts too: the connection is only replaced.
        """
        sock = self.sock
        if sock is None:
            return False
        if self.tls and sock.pending():  # type: ignore[attr-defined]
            return True
        return bool(self.poller.poll(0))

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def _shorten(self, sock: socket.socket, deadline: float, timeout: float) -> None:
        """Wait no longer than ``deadline`` for the rest of an answer (raise past it)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete answer within {timeout:g}s")
        if left < self.timeout:
            sock.settimeout(left)
            self.timeout = left

    def exchange(
        self, request: bytes, limit: int, timeout: float, bodiless: bool = False
    ) -> tuple[_Answer, bool]:
        """Send ``request``; its whole answer, and whether the connection may be reused.

        ``bodiless``: the answer has no body whatever its head says (a HEAD request's); a
        redirect is :class:`Unsupported`.

        ``timeout`` is the request's (its store's): a connection made for another store's
        request keeps the timeout it was made with otherwise. It bounds the whole exchange,
        as the asynchronous path's attempt is bounded, not only each ``recv``: a server
        trickling its answer a byte at a time would otherwise hold one attempt for as many
        timeouts as the answer has bytes.

        Raises:
            _Silent: The connection ended before any byte of the answer.
            ConnectionResetError: It failed or ended mid-answer, or the answer is no HTTP/1.x.
            AnswerTooLong, Unsupported: As :func:`_body_length`.
            TimeoutError: The server stalled.
        """
        sock = self.sock
        if sock is None:
            raise _Silent(errno.ECONNRESET, "not connected")
        if timeout != self.timeout:
            sock.settimeout(timeout)
            self.timeout = timeout
        deadline = time.monotonic() + timeout
        buf = b""
        try:
            sock.sendall(request)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    break
                if len(buf) > _HEAD_LIMIT:
                    raise ConnectionResetError(errno.ECONNRESET, "answer head too long")
                self._shorten(sock, deadline, timeout)
        except ConnectionError as exc:
            if buf:
                raise ConnectionResetError(errno.ECONNRESET, str(exc)) from None
            raise _Silent(errno.ECONNRESET, str(exc)) from None
        if not buf:
            raise _Silent(errno.ECONNRESET, "connection closed before the answer")
        if end < 0:
            raise ConnectionResetError(errno.ECONNRESET, "connection closed mid-answer")
        head = _parse_head(buf[:end])
        if bodiless:
            if 300 <= head[0] < 400:
                raise Unsupported(f"HTTP {head[0]}")
            return _Answer(head[0], head[2], b""), not head[3] and len(buf) == end + 4
        length = _body_length(head, limit)
        if length == _SKIP:
            return _Answer(head[0], head[2], b""), False
        start = end + 4
        have = len(buf) - start
        if have >= length:
            body = buf[start : start + length]
        else:
            parts, missing = [buf[start:]], length - have
            while missing:
                try:
                    chunk = sock.recv(min(missing, 1 << 20))
                except ConnectionError as exc:
                    raise ConnectionResetError(errno.ECONNRESET, str(exc)) from None
                if not chunk:
                    raise ConnectionResetError(
                        errno.ECONNRESET, "connection closed before the answer ended"
                    )
                parts.append(chunk)
                missing -= len(chunk)
                if missing:
                    self._shorten(sock, deadline, timeout)
            body = b"".join(parts)
        status, _, headers, closes = head
        # bytes nobody asked for after the answer: never read as the next one
        return _Answer(status, headers, body), not closes and have <= length


class _Conn(asyncio.Protocol):
    """One connection: at most one request outstanding; its answer resolves ``waiter``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[_Answer] | None = None
        self.buf = bytearray()
        self.head: tuple[int, str, dict[str, str], bool] | None = None
        self.length = 0
        self.limit = 0  # the most body bytes the outstanding request accepts
        self.got_any = False
        self.reusable = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_any = True
        waiter = self.waiter
        if waiter is None or waiter.done():  # spoken out of turn: never buffered, never reused
            self.reusable = False
            self.buf.clear()
            if self.transport is not None:
                self.transport.close()
            return
        self.buf += data
        try:
            if self.head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > _HEAD_LIMIT:
                        raise ConnectionResetError(errno.ECONNRESET, "answer head too long")
                    return
                head = self.head = _parse_head(bytes(self.buf[:end]))
                del self.buf[: end + 4]
                self.length = _body_length(head, self.limit)
                if self.length == _SKIP:  # the status is the answer; the body is not read
                    self.buf.clear()
                    self.head = None
                    self.reusable = False
                    waiter.set_result(_Answer(head[0], head[2], b""))
                    return
            if len(self.buf) >= self.length:
                status, _, headers, closes = self.head
                body = bytes(self.buf[: self.length])
                extra = len(self.buf) > self.length  # bytes nobody asked for: do not reuse
                self.buf.clear()
                self.head = None
                self.reusable = not closes and not extra
                waiter.set_result(_Answer(status, headers, body))
        except Exception as exc:  # noqa: BLE001 - handed to the request
            self.reusable = False
            waiter.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(
                ConnectionResetError(errno.ECONNRESET, "connection closed before the answer ended")
            )


class Http1Pool:
    """Kept-alive connections to one ``host:port``, for one process and event loop.

    Args:
        host: The server's host name or address.
        port: Its port.
        tls: Whether to speak HTTPS, verified as aiohttp verifies by default
            (``ssl.create_default_context()``: the system's trusted certificates, the host
            name checked).
    """

    def __init__(self, host: str, port: int, tls: bool = False) -> None:
        self.host, self.port = host, port
        self.host_header = host if port == (443 if tls else 80) else f"{host}:{port}"
        self.tls = _tls_context() if tls else None
        self._idle: list[_Conn] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # where its connections live
        # each thread's blocking connection (get_sync): this process's, shared by its stores
        self._sync = blocking_connections(host, port, tls)

    def get_sync(
        self, target: str, headers: str, limit: int, timeout: float, method: str = "GET"
    ) -> _Answer:
        """:meth:`get` in the calling thread, on its own kept-alive blocking connection.

        One sample read by ``ds[i]`` then costs no hop into the event loop's thread and back
        (most of a loopback request's time). A connection the server closed while idle is
        replaced once.

        Raises:
            AnswerTooLong, Unsupported: As :meth:`get` (the connection is closed).
            ConnectionResetError, TimeoutError: The connection failed, stalled or closed.
        """
        sync = self._sync
        request = _request(target, self.host_header, headers, method)
        for attempt in (0, 1):
            conn: _SyncConn | None = getattr(sync.local, "conn", None)
            if conn is not None and conn.spoke():  # closed, or bytes nobody asked for: never
                self._drop(conn)  # read as the next answer
                conn = None
            reused = conn is not None and attempt == 0
            if conn is None:
                conn = _SyncConn(self.host, self.port, timeout, self.tls)
                sync.local.conn = conn
                with sync.lock:
                    sync.conns.append(conn)
            try:
                answer, reusable = conn.exchange(request, limit, timeout, method == "HEAD")
            except _Silent:
                self._drop(conn)
                if reused:  # closed by the server while idle: a new connection, once
                    continue
                raise
            except BaseException:
                self._drop(conn)
                raise
            if not reusable:
                self._drop(conn)
            return answer
        raise ConnectionResetError(errno.ECONNRESET, "no connection")  # not reached

    def _drop(self, conn: Any) -> None:
        conn.close()
        sync = self._sync
        if getattr(sync.local, "conn", None) is conn:
            sync.local.conn = None
        with sync.lock:
            if conn in sync.conns:
                sync.conns.remove(conn)

    async def _connect(self) -> _Conn:
        loop = self._loop = asyncio.get_running_loop()
        if self.tls is None:
            _, conn = await loop.create_connection(_Conn, self.host, self.port)
        else:
            _, conn = await loop.create_connection(
                _Conn, self.host, self.port, ssl=self.tls, server_hostname=self.host
            )
        return conn

    async def get(self, target: str, headers: str, limit: int) -> _Answer:
        """``GET target`` with ``headers`` (CRLF-ended ``Name: value`` lines); the whole answer.

        ``limit`` bounds the body: an answer announcing more (a server that ignores ``Range``
        and sends a whole file) fails before any of it is buffered.

        Raises:
            AnswerTooLong: The answer announced more than ``limit`` bytes (the connection is
                closed).
            Unsupported: The answer needs aiohttp (redirect, other framing).
            ConnectionResetError: The connection failed or closed mid-answer.
        """
        request = _request(target, self.host_header, headers)
        while self._idle:
            conn = self._idle.pop()
            if conn.transport is None or conn.transport.is_closing():
                continue
            if conn.buf:  # the server sent bytes nobody asked for while it was idle
                conn.transport.close()
                continue
            try:
                return await self._exchange(conn, request, limit)
            except ConnectionResetError:
                if conn.got_any:  # it answered, then failed: a real failure
                    raise
                # closed by the server while idle: a new connection, once (as aiohttp does)
            break
        return await self._exchange(await self._connect(), request, limit)

    async def _exchange(self, conn: _Conn, request: bytes, limit: int) -> _Answer:
        transport = conn.transport
        if transport is None:
            raise ConnectionResetError(errno.ECONNRESET, "not connected")
        conn.got_any = conn.reusable = False
        conn.limit = limit
        conn.waiter = asyncio.get_running_loop().create_future()
        done = False
        try:
            transport.write(request)
            answer = await conn.waiter
            done = conn.reusable
            return answer
        finally:
            conn.waiter = None
            if done and len(self._idle) < _IDLE_LIMIT:
                self._idle.append(conn)
            else:  # failed, cancelled (a timeout) or not reusable: never half-read again
                transport.close()

    def close(self) -> None:
        """Close the idle connections (from any thread: on their event loop, soon)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._idle = []
            self._close_idle()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._close_idle()
        else:
            loop.call_soon_threadsafe(self._close_idle)

    def _close_idle(self) -> None:
        with self._sync.lock:
            blocking, self._sync.conns = self._sync.conns, []
        for blocked in blocking:  # (a thread's next request opens a new one)
            blocked.close()
        idle, self._idle = self._idle, []
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()


def _tls_context() -> ssl.SSLContext:
    """This process's TLS context, verified as aiohttp verifies by default (made once).

    Loading the system's certificates costs ~20 ms; one context serves every pool (an
    ``SSLContext`` is shared safely between threads and connections). Which certificates
    OpenSSL loads by default follows ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``: a pool made
    after they changed gets a context that loaded them.
    """
    from .clients import get

    def make() -> ssl.SSLContext:
        context = ssl.create_default_context()
        context.set_alpn_protocols(["http/1.1"])  # as aiohttp's: never offered HTTP/2
        return context

    paths = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    return get((os.getpid(), "http1-tls", *paths), make)


class _Blocking:
    """A process's blocking connections to one ``host:port``: one per thread (``local``)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.conns: list[_SyncConn] = []
        self.lock = threading.Lock()


def blocking_connections(host: str, port: int, tls: bool = False) -> _Blocking:
    """This process's blocking connections to ``host:port`` (a forked child makes its own)."""
    from .clients import get

    return get((os.getpid(), "http1-blocking", host, port, tls), _Blocking)


class Http1Pools:
    """This process's :class:`Http1Pool` per ``host:port``.

    A store keeps one; after a fork the child starts afresh (the parent's connections belong
    to the parent's event loop).
    """

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._pools: dict[tuple[str, int, bool], Http1Pool] = {}

    def pool(self, url: Any) -> Http1Pool | None:
        """The pool for a ``yarl.URL`` (``http://``, ``https://``; no IPv6 literal), or ``None``."""
        if url.scheme not in ("http", "https") or not url.raw_host or ":" in url.raw_host:
            return None
        if url.user is not None or url.password is not None:  # aiohttp sends them as auth
            return None
        tls = url.scheme == "https"
        return self.pool_at(str(url.raw_host), int(url.port or (443 if tls else 80)), tls)

    def pool_at(self, host: str, port: int, tls: bool) -> Http1Pool:
        """The pool for ``host:port`` (a host name or IPv4 address), made on first use."""
        if self._pid != os.getpid():
            self._pid, self._pools = os.getpid(), {}
        key = (host, port, tls)
        found = self._pools.get(key)
        if found is None:
            found = self._pools[key] = Http1Pool(*key)
        return found

    def close(self) -> None:
        """Close this process's idle connections; a forked child only forgets its parent's."""
        if self._pid != os.getpid():
            self._pid, self._pools = os.getpid(), {}
        for pool in self._pools.values():
            pool.close()


class PlainTransport(Transport):
    """:class:`~wids.storage.transport.HttpTransport`'s reads on plain keep-alive connections.

    The same request and the same :class:`~wids.storage.answer.Answer`; an answer this client
    does not handle (:class:`Unsupported`) sends this file's reads to aiohttp from then on.
    Nothing of aiohttp or of fsspec's HTTP filesystem is made (or imported) until something
    needs it (:attr:`http`): a stat, a streamed or parted download, such an answer. A process
    that only reads ranges and small whole files (an index, its sidecars) never imports
    aiohttp; batches run on fsspec's event loop (:data:`~wids.storage.transport.LOOP`).

    Args:
        url: The file (``http://`` or ``https://``, options as :func:`plain_options` allows).
        options: Its storage options (what :attr:`http` is made with).
        policy: The retry policy (its timeout bounds each exchange).
        pool: The connections to the file's server.
    """

    checked = True
    asynchronous = True
    direct = True  # one read at a time in the calling thread: get_sync (no hop into the loop)

    @classmethod
    def of(
        cls, url: str, options: Mapping[str, Any], policy: RetryPolicy, pools: Http1Pools
    ) -> PlainTransport | None:
        """The plain transport of ``url``, or ``None`` where its requests are not plain GETs."""
        if not plain_options(url, {k: v for k, v in options.items() if k != "transport"}):
            return None
        simple = _SIMPLE_URL.fullmatch(url)
        if simple is not None and "/." not in url and int(simple["port"] or 0) <= 65535:
            scheme, host, port, path = simple.group("scheme", "host", "port", "path")
            tls = scheme.lower() == "https"
            pool = pools.pool_at(host.lower(), int(port or (443 if tls else 80)), tls)
            return cls(url, options, policy, pool, path or "/")
        target = _yarl().URL(url)  # what fsspec's HTTP filesystem requests (encode_url)
        found = pools.pool(target)
        return None if found is None else cls(url, options, policy, found, target.raw_path_qs)

    def __init__(
        self,
        url: str,
        options: Mapping[str, Any],
        policy: RetryPolicy,
        pool: Http1Pool,
        target: str,
    ) -> None:
        super().__init__(url, LOOP, url, policy.timeout)
        self.options, self.policy = options, policy
        self.pool: Http1Pool | None = pool
        self.target = target
        self._http: Transport | None = None
        self._lock = threading.Lock()

    @property
    def http(self) -> Transport:
        """The file's aiohttp transport (fsspec's HTTP filesystem), made on first use."""
        http = self._http
        if http is None:
            with self._lock:
                http = self._http
                if http is None:
                    from .objectstores import fsspec_transport

                    http = self._http = fsspec_transport(self.url, self.options, self.policy)
        return http

    def stat_sync(self) -> FileStat:
        """A stat: one plain HEAD (what fsspec's HTTP filesystem sends), read as fsspec reads it.

        The size from ``Content-Length``, the version from ``ETag`` and ``Last-Modified``. A
        404 is :class:`FileNotFoundError`; any other answer but a success with a plain length
        (a redirect, a server refusing HEAD, an error) is left to fsspec, whose rules (a GET
        after a failed HEAD, its errors) then decide, as before this client made stats.
        """
        pool = self.pool
        if pool is not None:
            try:
                answer = pool.get_sync(self.target, "", 0, self.timeout, "HEAD")
            except Unsupported:  # a redirect: aiohttp from now on
                self.pool = None
            else:
                status, got = answer.status, answer.headers
                if status == 404:
                    raise FileNotFoundError(redact_url(self.url))
                length = got.get("content-length", "")
                encoded = got.get("content-encoding", "identity").lower() != "identity"
                if 200 <= status < 300 and _number(length, 18) and not encoded:
                    info = {"ETag": got.get("etag"), "Last-Modified": got.get("last-modified")}
                    return file_stat(info, int(length))
        stat: FileStat = self.http.stat_sync()
        return stat

    async def prepare(self) -> None:
        """Nothing to make: connections open on first use."""

    def get_sync(self, start: int, end: int, pin: Pin) -> Answer:
        """:meth:`get` in the calling thread, on its blocking keep-alive connection."""
        pool = self.pool
        if pool is None:
            return self._via_aiohttp(start, end, pin)
        asked = conditions(pin)
        headers = _headers(start, end, asked)
        try:
            answer = pool.get_sync(self.target, headers, max(end - start, 1 << 16), self.timeout)
        except AnswerTooLong as e:
            raise ignores_range(pin.url, start, end, e.length) from None
        except Unsupported:  # a redirect, another framing: aiohttp from now on
            self.pool = None
            return self._via_aiohttp(start, end, pin)
        return self._answer(pin, answer, asked, start, end)

    def _via_aiohttp(self, start: int, end: int, pin: Pin) -> Answer:
        import fsspec.asyn

        http = self.http
        got: Answer = fsspec.asyn.sync(http.fs.loop, http.get, start, end, pin)
        return got

    def get_whole_sync(self, limit: int | None) -> bytes:
        """The whole file in the calling thread: one plain GET, refused past ``limit`` bytes.

        The answer's announced length is checked before any body byte is kept; an answer
        this client does not handle (a redirect, chunked, encoded) is fetched again through
        aiohttp, whose rules are the same (:func:`~wids.storage.transport.read_body`).
        """
        pool = self.pool
        bound = _NO_LIMIT if limit is None else limit
        if pool is not None:
            try:
                answer = pool.get_sync(self.target, "", bound, self.timeout)
            except AnswerTooLong as e:
                raise too_large(self.url, e.length, bound) from None
            except Unsupported:  # aiohttp from now on
                self.pool = None
            else:
                if answer.status == 404:
                    raise FileNotFoundError(redact_url(self.url))
                if answer.status >= 300:
                    raise HttpStatusError(answer.status, "")
                return answer.body
        import fsspec.asyn

        http = self.http
        data: bytes = fsspec.asyn.sync(http.fs.loop, http.get_whole, limit)
        return data

    async def get_whole(self, limit: int | None) -> bytes:
        """A whole file, through aiohttp."""
        return await self.http.get_whole(limit)

    async def get(self, start: int, end: int, pin: Pin) -> Answer:
        """One conditional ranged GET (as :meth:`HttpTransport.get`)."""
        pool = self.pool
        if pool is None:
            return await self.http.get(start, end, pin)
        asked = conditions(pin)
        headers = _headers(start, end, asked)
        try:  # an error page is small; a range answer is the range
            answer = await pool.get(self.target, headers, max(end - start, 1 << 16))
        except AnswerTooLong as e:
            raise ignores_range(pin.url, start, end, e.length) from None
        except Unsupported:  # a redirect, another framing: aiohttp from now on
            self.pool = None
            return await self.http.get(start, end, pin)
        return self._answer(pin, answer, asked, start, end)

    def _answer(
        self, pin: Pin, answer: _Answer, asked: dict[str, str], start: int, end: int
    ) -> Answer:
        status, got = answer.status, answer.headers
        if status == 412:
            raise pin.refused("HTTP 412 for " + " ".join(f"{k}: {v}" for k, v in asked.items()))
        if status == 404:
            raise FileNotFoundError(redact_url(pin.url))
        etag = got.get("etag") or None
        mtime = _date(got.get("last-modified")) if etag is None or pin.wants_date else None
        if status == 416:
            pin.learn(_span(got.get("content-range"))[1], etag, mtime)
        if status >= 400:
            raise HttpStatusError(status, "")
        if status == 200:
            return Answer(answer.body, len(answer.body), etag, mtime, None, True)
        span, total = _span(got.get("content-range"))
        return Answer(answer.body, total, etag, mtime, span, False, got.get("content-range", ""))


_SIMPLE_URL = re.compile(
    r"(?P<scheme>[hH][tT][tT][pP][sS]?)://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[1-9][0-9]{0,4}))?(?P<path>/[A-Za-z0-9._~/-]*)?",
    re.ASCII,
)
"""A URL whose request target is its path as written (what yarl makes of it too): no query,
no escapes, no dot segments, a plain host name or IPv4 address. Any other goes through yarl
(imported then), as aiohttp and fsspec encode it."""

_NO_LIMIT = 1 << 62
"""The body bound of a whole-file read without a limit (``read_whole(limit=None)``)."""


def _yarl() -> Any:
    """The module that encodes URLs for aiohttp and fsspec; an ``ImportError`` names the extra."""
    try:
        import yarl
    except ImportError as e:
        from ..extras import missing

        raise missing("aiohttp", "http(s):// URLs", e) from None
    return yarl


def _headers(start: int, end: int, asked: dict[str, str]) -> str:
    """A ranged GET's own header lines (CRLF-ended): ``Range`` and the pin's conditions."""
    headers = f"Range: bytes={start}-{end - 1}\r\n"
    for name, value in asked.items():
        headers += f"{name}: {value}\r\n"
    return headers
