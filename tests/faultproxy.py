"""A fault-injecting HTTP reverse proxy on 127.0.0.1, for tests and the soak tool.

It sits in front of nginx or moto and forwards every request, except that a seeded schedule
replaces some of them by a fault:

- ``drop``: close the connection without answering
- ``delay``: wait ``delay`` seconds, then answer normally
- ``500``, ``503``, ``429``: answer with that status
- ``truncate``: announce the full ``Content-Length``, send half the body, close the connection
- ``short``: a well-formed answer with only half the body (a short read the transport cannot
  see; only a length check catches it)
- ``stall``: never answer (until the client gives up, ``stall`` seconds pass, or the proxy stops)
- ``wrong``: a well-formed ``206`` with the ``Content-Range`` and length asked for, but bytes
  from another offset of the object (read cyclically ``wrong_shift`` bytes further on; seeded
  when ``None``); only a check of the bytes themselves catches it. Injected only into ranged
  GETs.

and ``permanent`` maps path substrings to a status (403, 404, ...) returned on every request.
``script`` (a list of kinds, ``None`` for a clean answer) replaces the random schedule: the
n-th eligible request gets the n-th entry, later ones none.
``injected`` counts faults by kind; ``requests`` counts all requests, ``forwarded`` the clean ones,
``connections`` the TCP connections clients opened (peer addresses not seen before), ``paths``
the requests per path, ``peak_in_flight`` the most requests under way at once and
``peak_delayed`` the most ``delay`` faults under way at once.

Example:
    >>> proxy = FaultProxy(http_server.base, FaultPlan({"503": 1}, rate=1.0, max_faults=2))
    >>> proxy.start()  # a thread with its own event loop  # doctest: +SKIP
    >>> proxy.url("shard.tar")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["BODY_FAULTS", "FAULT_KINDS", "FaultPlan", "FaultProxy", "fault_proxy"]

TRANSIENT_STATUS = ("500", "503", "429")
BODY_FAULTS = ("truncate", "short")
FAULT_KINDS = ("drop", "delay", *TRANSIENT_STATUS, *BODY_FAULTS, "stall", "wrong")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


@dataclass
class FaultPlan:
    """Which requests fail, and how.

    Args:
        kinds: Relative weights of the fault kinds to inject (keys from ``FAULT_KINDS``).
        rate: Probability that a request gets a fault.
        max_faults: Stop injecting after this many faults (``None``: no limit).
        only: Inject only into requests whose path contains this substring.
        methods: Inject only into requests with these methods.
        delay: Seconds of a ``delay`` fault.
        stall: Seconds a ``stall`` fault holds the request at most.
        permanent: Path substring → status answered on every matching request.
        seed: Seed of the schedule.
        script: Fault kinds (``None``: none) for the eligible requests in order, instead of
            the random schedule.
        wrong_shift: How far from the requested offset a ``wrong`` answer's bytes come from
            (cyclically in the object); ``None``: a seeded random shift per fault.
        wrong_min: ``wrong`` answers only for ranges of at least this many bytes (so that,
            e.g., whole-shard downloads get wrong bytes and sample reads do not).
    """

    kinds: dict[str, float] = field(default_factory=dict)
    rate: float = 0.0
    max_faults: int | None = None
    only: str | None = None
    methods: tuple[str, ...] = ("GET", "HEAD")
    delay: float = 0.2
    stall: float = 120.0
    permanent: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    script: tuple[str | None, ...] = ()
    wrong_shift: int | None = None
    wrong_min: int = 0

    def __post_init__(self) -> None:
        unknown = (set(self.kinds) | set(self.script)) - set(FAULT_KINDS) - {None}
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")


class FaultProxy:
    """The proxy; ``start()`` runs it in a daemon thread, ``stop()`` ends it."""

    def __init__(self, upstream: str, plan: FaultPlan | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = 0
        self.requests = 0
        self.forwarded = 0
        self.injected: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        self.in_flight = self.peak_in_flight = 0
        self.delayed = self.peak_delayed = 0
        self._seen: set[Any] = set()  # every client connection so far
        self._peers: set[Any] = set()  # those opened since the last reset
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._session: Any = None
        self._closing: asyncio.Event | None = None
        self.set_plan(plan or FaultPlan())

    # -- control (from any thread) ------------------------------------------------------------

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"{self.base}/{name.lstrip('/')}"

    def set_plan(self, plan: FaultPlan) -> None:
        """Replace the schedule (counters are kept; see ``reset_counts``)."""
        self.plan = plan
        self._rng = random.Random(plan.seed)
        self._plan_faults = 0
        self._scripted = 0

    def reset_counts(self) -> None:
        self.requests = 0
        self.forwarded = 0
        self.injected = Counter()
        self.paths = Counter()
        self._peers = set()
        self.peak_in_flight = self.in_flight
        self.peak_delayed = self.delayed

    @property
    def connections(self) -> int:
        """TCP connections opened since the last reset (that sent a request)."""
        return len(self._peers)

    def counts(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "forwarded": self.forwarded,
            "injected": dict(self.injected),
        }

    def start(self) -> FaultProxy:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="faultproxy", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        self._loop = self._thread = None

    # -- the server ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web

        self._closing = asyncio.Event()
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=120)
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _shutdown(self) -> None:
        assert self._closing is not None
        self._closing.set()
        await self._runner.cleanup()
        await self._session.close()

    def _pick(self, method: str, path: str, ranged: int | None) -> str | None:
        plan = self.plan
        for needle, status in plan.permanent.items():
            if needle in path:
                return str(status)
        if not (plan.kinds or plan.script) or method not in plan.methods:
            return None
        if plan.only is not None and plan.only not in path:
            return None
        if plan.max_faults is not None and self._plan_faults >= plan.max_faults:
            return None
        if plan.script:
            if self._scripted >= len(plan.script):
                return None
            kind = plan.script[self._scripted]
            self._scripted += 1
            if kind is None:
                return None
        else:
            if plan.rate <= 0 or self._rng.random() >= plan.rate:
                return None
            kinds = list(plan.kinds)
            kind = self._rng.choices(kinds, weights=[plan.kinds[k] for k in kinds])[0]
        if kind in BODY_FAULTS and method != "GET":
            return None
        if kind == "wrong" and (method != "GET" or ranged is None or ranged < plan.wrong_min):
            return None
        self._plan_faults += 1
        return kind

    async def _handle(self, request: Any) -> Any:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._handle_one(request)
        finally:
            self.in_flight -= 1

    async def _handle_one(self, request: Any) -> Any:
        from aiohttp import web

        self.requests += 1
        self.paths[request.path] += 1
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer not in self._seen:
            self._seen.add(peer)
            self._peers.add(peer)
        fault = self._pick(request.method, request.path_qs, _range_length(request.headers))
        if fault is not None:
            self.injected[fault] += 1
        if fault is not None and fault.isdigit():
            return web.Response(status=int(fault), text=f"injected {fault}\n")
        if fault == "drop":
            _close(request)
            raise asyncio.CancelledError  # ends the handler without writing anything
        if fault == "stall":
            assert self._closing is not None
            try:
                await asyncio.wait_for(self._closing.wait(), self.plan.stall)
            except asyncio.TimeoutError:
                pass
            _close(request)
            raise asyncio.CancelledError
        if fault == "delay":
            self.delayed += 1
            self.peak_delayed = max(self.peak_delayed, self.delayed)
            try:
                await asyncio.sleep(self.plan.delay)
            finally:
                self.delayed -= 1
        return await self._forward(request, fault)

    async def _forward(self, request: Any, fault: str | None) -> Any:
        from aiohttp import web

        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        wanted = None
        if fault == "wrong":  # fetch the whole object, answer with other bytes of it
            wanted = headers.pop("Range", None) or headers.pop("range", None)
        data = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=data or None,
            allow_redirects=False,
        ) as up:
            body = await up.read()
            status = up.status
            out = {k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP}
            length = up.headers.get("Content-Length")
        if fault in BODY_FAULTS and len(body) < 2:
            self.injected[fault] -= 1  # nothing to cut; count only faults really injected
            fault = None
        if fault == "wrong":
            wrong = self._wrong(status, out, body, wanted)
            if wrong is not None:
                return wrong
            self.injected[fault] -= 1  # not a plain ranged answer: passed through unchanged
            fault = None
        if fault == "short":
            return web.Response(status=status, headers=out, body=body[: len(body) // 2])
        if fault == "truncate":
            resp = web.StreamResponse(status=status, headers=out)
            resp.content_length = len(body)
            await resp.prepare(request)
            await resp.write(body[: len(body) // 2])
            _close(request)
            raise asyncio.CancelledError
        self.forwarded += 1
        if request.method == "HEAD":
            resp = web.Response(status=status, headers=out)
            if length is not None:
                resp.headers["Content-Length"] = length
            return resp
        return web.Response(status=status, headers=out, body=body)

    def _wrong(self, status: int, headers: dict[str, str], body: bytes, wanted: str | None) -> Any:
        """A 206 for range ``wanted`` (``bytes=a-b``) of ``body`` with bytes from elsewhere."""
        from aiohttp import web

        total = len(body)
        if status != 200 or wanted is None or total < 2 or not wanted.startswith("bytes="):
            return None
        first, _, last = wanted[len("bytes=") :].partition("-")
        if not first.isdigit() or "," in last:
            return None
        a = int(first)
        b = min(int(last), total - 1) if last.strip() else total - 1
        if not 0 <= a <= b:
            return None
        shift = self.plan.wrong_shift
        if shift is None:
            shift = self._rng.randrange(1, total)
        start = (a + shift) % total
        n = b - a + 1
        data = (body[start:] + body[:start]) * (1 + n // total)
        # (a whole object's checksum headers do not go with a range; S3 sends none for one)
        out = {
            k: v
            for k, v in headers.items()
            if k.lower() != "content-range" and not k.lower().startswith("x-amz-checksum")
        }
        out["Content-Range"] = f"bytes {a}-{b}/{total}"
        self.forwarded += 1
        return web.Response(status=206, headers=out, body=data[:n])


def _range_length(headers: Any) -> int | None:
    """Bytes asked for by a request's ``Range: bytes=a-b`` (a large number for ``a-``)."""
    value = headers.get("Range")
    if value is None or not value.startswith("bytes="):
        return None
    first, _, last = value[len("bytes=") :].partition("-")
    if not first.isdigit():
        return None
    return int(last) - int(first) + 1 if last.isdigit() else 1 << 62


def _close(request: Any) -> None:
    """Close the client's connection (it may be gone already: a client that timed out)."""
    if request.transport is not None:
        request.transport.close()


@pytest.fixture
def fault_proxy():
    """A factory: ``fault_proxy(upstream_base_url, plan=None) -> FaultProxy`` (started)."""
    proxies: list[FaultProxy] = []

    def make(upstream: str, plan: FaultPlan | None = None) -> FaultProxy:
        proxy = FaultProxy(upstream, plan).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()
