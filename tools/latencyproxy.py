#!/usr/bin/env python
"""An HTTP reverse proxy on 127.0.0.1 that makes a local server behave like a distant one.

Every request waits ``delay`` seconds (from the moment its headers arrived) before the first
byte of its answer goes back, and every connection's response bodies are paced to at most
``mbps`` megabytes (10^6 bytes) per second: what an object store looks like from a machine in
the same region (tens of ms to the first byte, tens of MB/s per connection). Connections are
kept alive on both sides (one upstream connection per client connection), so a client that
reuses its connections pays the delay per request, not per connection, as against a real store.

It forwards requests byte for byte, ``Host`` included, so S3 SigV4 signatures made for the
proxy's address still verify (point s3fs's ``endpoint_url`` at the proxy), and the GCS
emulator's self-links point back at the proxy. It works in front of nginx, moto_server and
the GCS emulator. It never listens on or connects to anything but 127.0.0.1, and stops by
itself after ``lifetime`` seconds.

It stands in for a store whose CPU is not the client's, so it is kept cheap per request (on
the same cores as the client it measures): a request without a body whose answer is framed by
``Content-Length`` (every ranged GET) is relayed by protocol callbacks and two timers
(``tools/fastrelay.py``), anything else by the stream-based relay below, on the same
connection; each head is parsed once into a lookup map and forwarded as it came unless a
hop-by-hop header must go; a ``Content-Length`` body is relayed in whole pieces of up to
256 KiB (one pacing wait and one write per piece: a small answer's body is one piece); the
event loop is uvloop's where it is installed (the test extra installs it). In one run
through 4 DataLoader workers (load ~2.3) the fast path took it from ~184 to ~115 us of CPU per
23 KB ranged GET, and the mean time a request spends in the proxy from ~34 to ~28 ms (25 ms
emulated + 0.5 ms transfer): bursts of 128 requests had queued behind its CPU.
What it emulates is unchanged: each answer's head leaves ``delay`` after the request's head
arrived, and the body's byte ``n`` no earlier than ``n / mbps`` after the head.

Counters: requests (by method), response body bytes sent, request body bytes received,
connections. In a subprocess they are read from ``GET /__latencyproxy__/stats`` (JSON) and
reset by ``POST /__latencyproxy__/reset``; neither is delayed or counted.

Library use::

    from latencyproxy import LatencyProxy
    with LatencyProxy("http://127.0.0.1:8080", delay=0.025, mbps=50) as proxy:  # a thread
        fs.cat_file(proxy.url("shard-000.tar"))
        print(proxy.counts())          # {"requests": 1, "bytes_out": ..., ...}

    with ProxyProcess("http://127.0.0.1:8080") as proxy:  # its own process (no shared GIL)
        ...

Command line::

    python tools/latencyproxy.py --upstream http://127.0.0.1:PORT --delay-ms 25 --mbps 50

prints ``listening on http://127.0.0.1:PORT`` (then serves until ``--lifetime`` seconds pass or
it is interrupted) and, at the end, its counters as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from fastrelay import Relay
from httprelay import TIMER_MARGIN, Message, Pacer, is_chunked, relay_body

__all__ = ["LatencyProxy", "ProxyProcess", "main"]

CONTROL = "/__latencyproxy__/"
_HEAD_LIMIT = 1 << 20
_ZEROS = (
    "requests",
    "bytes_out",
    "bytes_in",
    "connections",
    "in_flight_peak",
    "request_us",
    "in_flight_us",
    "active_us",
)


class LatencyProxy:
    """The proxy, run in a daemon thread with its own event loop.

    Args:
        upstream: Base URL of the server behind it (``http://127.0.0.1:PORT``).
        delay: Seconds from a request's arrival to the first byte of its answer.
        mbps: Cap on each connection's response bodies, in 10^6 bytes/s (``0``: none).
        port: Port to listen on (``0``: a free one).
        lifetime: Seconds after which the proxy stops by itself.
        idle: Seconds an idle client connection is kept open.
    """

    def __init__(
        self,
        upstream: str,
        delay: float = 0.025,
        mbps: float = 50.0,
        port: int = 0,
        lifetime: float = 3600.0,
        idle: float = 60.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or parsed.hostname not in ("127.0.0.1", "localhost"):
            raise ValueError(f"upstream must be http://127.0.0.1:PORT, not {upstream!r}")
        if delay < 0 or mbps < 0 or lifetime <= 0:
            raise ValueError("delay and mbps must be >= 0, lifetime > 0")
        self.upstream = ("127.0.0.1", parsed.port or 80)
        self.delay, self.rate = delay, mbps * 1e6
        self.port, self.lifetime, self.idle = port, lifetime, idle
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._in_flight = 0
        self._changed = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._relays: set[Relay] = set()  # connections on the fast path
        self.control_path = CONTROL.encode()
        self.stopped = threading.Event()

    # -- control, from any thread ---------------------------------------------------------------

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "") -> str:
        """The proxy's URL for ``path`` on the upstream server."""
        return f"{self.base}/{path.lstrip('/')}"

    def counts(self) -> dict[str, int]:
        """The counters since the last reset.

        ``requests`` and per method (``GET``, ``HEAD``, ...); ``bytes_out`` (response bodies),
        ``bytes_in`` (request bodies); ``connections`` (client connections that sent a
        request); ``in_flight_peak`` (most requests open at once); ``request_us`` (their
        durations, arrival to last byte, summed); ``in_flight_us`` (requests in flight
        integrated over time) and ``active_us`` (time with at least one in flight), so that
        ``in_flight_us / active_us`` is the mean number in flight while busy.
        """
        with self._lock:
            self._tick(time.monotonic())
            out = dict.fromkeys(_ZEROS, 0)
            out.update(self._counts)
            out["in_flight"] = self._in_flight
            return out

    def settled(self, timeout: float = 10.0) -> dict[str, int]:
        """The counters once no request is in flight (or ``timeout`` seconds passed)."""
        return _settled(self.counts, timeout)

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()
            self._counts["in_flight_peak"] = self._in_flight

    def _tick(self, now: float) -> None:
        """Integrate the in-flight count up to ``now`` (under the lock)."""
        dt = int((now - self._changed) * 1e6)
        if self._in_flight:
            self._counts["in_flight_us"] += self._in_flight * dt
            self._counts["active_us"] += dt
        self._changed = now

    def _flight(self, change: int, started: float | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            self._tick(now)
            self._in_flight += change
            peak = self._counts["in_flight_peak"]
            self._counts["in_flight_peak"] = max(peak, self._in_flight)
            if started is not None:
                self._counts["request_us"] += int((now - started) * 1e6)

    def _count(self, **kw: int) -> None:
        with self._lock:
            self._counts.update(kw)

    def _count_request(self, method: str) -> None:
        with self._lock:
            self._counts["requests"] += 1
            self._counts[method] += 1

    def _count_out(self, nbytes: int) -> None:
        with self._lock:
            self._counts["bytes_out"] += nbytes

    def start(self) -> LatencyProxy:
        """Start serving in a daemon thread; returns once the port is bound."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = _new_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:  # handed to start()
                errors.append(exc)
                ready.set()
                loop.close()
                self.stopped.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()
            self.stopped.set()

        self._thread = threading.Thread(target=run, name="latencyproxy", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        """Stop serving and close every connection."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed (lifetime over)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        self._loop = self._thread = None

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the server ---------------------------------------------------------------------------

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Relay(self), "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        loop.call_later(self.lifetime, loop.stop)

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for relay in list(self._relays):
            relay._close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _spawn(self, coro: Any) -> None:
        """Run a stream-based relay of a connection the fast path handed over."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(
        self,
        request: Message,
        response: Message,
        method: str,
        arrived: float,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """An answer the fast path handed over (its head read), then the connection's relay."""
        try:
            keep_client, keep_up = await self._answer(
                request, response, method, arrived, writer, up[0]
            )
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            up[1].close()
            writer.close()
            return
        except asyncio.CancelledError:
            up[1].close()
            writer.close()
            return
        finally:
            self._flight(-1, arrived)
        if not keep_up:
            up[1].close()
        if not keep_client:
            if keep_up:
                up[1].close()
            writer.close()
            return
        await self._client(reader, writer, counted=True, up=up if keep_up else None)

    async def _client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counted: bool = False,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None,
    ) -> None:
        """The stream-based relay of one connection (what the fast path does not take)."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                try:
                    head = await _within(self.idle, reader.readuntil(b"\r\n\r\n"))
                except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                    return
                arrived = time.monotonic()
                request = Message(head)
                if b" " + CONTROL.encode() in request.start:
                    await self._control(request, writer)
                    continue
                if not counted:  # (control requests are not counted)
                    self._count(connections=1)
                    counted = True
                if up is None:
                    up = await asyncio.open_connection(*self.upstream, limit=_HEAD_LIMIT)
                self._flight(+1)
                try:
                    keep_client, keep_up = await self._exchange(
                        request, arrived, reader, writer, up
                    )
                finally:
                    self._flight(-1, arrived)
                if not keep_up:
                    up[1].close()
                    up = None
                if not keep_client:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        except asyncio.CancelledError:  # the proxy is stopping
            return
        finally:
            self._tasks.discard(task)
            if up is not None:
                up[1].close()
            writer.close()

    async def _exchange(
        self,
        request: Message,
        arrived: float,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> tuple[bool, bool]:
        """Forward one request and its answer; whether the client and upstream connections
        stay open."""
        method = request.start.split(b" ", 1)[0].decode("ascii", "replace")
        self._count_request(method)
        if (request.get(b"expect") or b"").lower() == b"100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # we take the body ourselves
        up_reader, up_writer = up
        up_writer.write(request.encode())
        await relay_body(request, reader, up_writer, None, lambda n: self._count(bytes_in=n))
        while True:
            response = Message(await up_reader.readuntil(b"\r\n\r\n"))
            status = int(response.start.split(b" ", 2)[1])
            if status >= 200 or status == 101:
                break
        return await self._answer(request, response, method, arrived, writer, up_reader)

    async def _answer(
        self,
        request: Message,
        response: Message,
        method: str,
        arrived: float,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
    ) -> tuple[bool, bool]:
        """Send an answer whose head was read: at the delay, its body paced."""
        status = int(response.start.split(b" ", 2)[1])
        wait = arrived + self.delay - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait + TIMER_MARGIN)
        no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        framed = no_body or response.get(b"content-length") is not None or is_chunked(response)
        # upstream closing is upstream's business (we reconnect); a body that ends only when
        # upstream closes ends the client's connection too
        keep_client = framed and not request.closes()
        keep_up = framed and not response.closes()
        writer.write(response.encode([] if keep_client else [(b"Connection", b"close")]))
        pacer = Pacer(self.rate)
        if not no_body:
            await relay_body(response, up_reader, writer, pacer, self._count_out)
        await writer.drain()
        return keep_client, keep_up

    def _control_answer(self, request: Message) -> bytes:
        if b"/reset" in request.start:
            self.reset_counts()
        body = json.dumps(self.counts()).encode()
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )

    async def _control(self, request: Message, writer: asyncio.StreamWriter) -> None:
        writer.write(self._control_answer(request))
        await writer.drain()


_timeout = getattr(asyncio, "timeout", None)


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (a fraction of asyncio's CPU per request),
    else asyncio's; the proxy behaves the same on either."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def _within(seconds: float, awaitable: Awaitable[bytes]) -> bytes:
    """``await awaitable`` within ``seconds``: ``asyncio.timeout`` where there is one (3.11+),
    which, unlike ``wait_for``, makes no task per call."""
    if _timeout is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with _timeout(seconds):
        return await awaitable


def _settled(counts: Callable[[], dict[str, int]], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        now = counts()
        if now["in_flight"] == 0 or time.monotonic() > deadline:
            return now
        time.sleep(0.005)


class ProxyProcess:
    """The proxy in a subprocess (``python tools/latencyproxy.py``), same interface.

    Its counters come over HTTP from the control path, so benchmarks in other processes (or
    the parent) can read and reset them.
    """

    def __init__(
        self,
        upstream: str,
        delay: float = 0.025,
        mbps: float = 50.0,
        lifetime: float = 3600.0,
    ) -> None:
        self.args = [
            sys.executable,
            __file__,
            "--upstream",
            upstream,
            "--delay-ms",
            str(delay * 1000),
            "--mbps",
            str(mbps),
            "--lifetime",
            str(lifetime),
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.base = ""

    def start(self) -> ProxyProcess:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"latencyproxy did not start: {line!r}")
        self.base = line.split()[-1]
        return self

    def url(self, path: str = "") -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def _call(self, what: str, method: str = "GET") -> dict[str, int]:
        req = urllib.request.Request(self.base + CONTROL + what, method=method, data=None)
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - 127.0.0.1 only
            return json.loads(r.read())

    def counts(self) -> dict[str, int]:
        return self._call("stats")

    def settled(self, timeout: float = 10.0) -> dict[str, int]:
        return _settled(self.counts, timeout)

    def reset_counts(self) -> None:
        self._call("reset", "POST")

    def stop(self) -> None:
        """Stop the process (by its pid)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate(timeout=10)

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT of the server")
    p.add_argument("--delay-ms", type=float, default=25.0, help="to each answer's first byte")
    p.add_argument(
        "--mbps", type=float, default=50.0, help="per-connection cap, 10^6 bytes/s (0: none)"
    )
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    p.add_argument("--lifetime", type=float, default=3600.0, help="stop after this many seconds")
    args = p.parse_args(argv)
    proxy = LatencyProxy(
        args.upstream,
        delay=args.delay_ms / 1000,
        mbps=args.mbps,
        port=args.port,
        lifetime=args.lifetime,
    ).start()
    print(f"listening on {proxy.base}", flush=True)
    try:
        proxy.stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
        print(json.dumps(proxy.counts()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
