"""A small HTTP server on 127.0.0.1 whose answers a test may falsify, for hostile-server tests.

``HostileServer(root)`` serves the files under ``root`` as nginx does (``Range``, ``ETag``,
``Last-Modified``, ``Content-Length``), and hands each answer's status and headers to
``.lie(path, status, headers)`` before sending them: a test sets ``lie`` to answer with a
``Content-Range`` it chooses, a redirect loop, and so on. ``.seen`` records every request's path
and headers. ``.base`` is its ``http://127.0.0.1:PORT``; ``.stop()`` ends it.
"""

from __future__ import annotations

import email.utils
import hashlib
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["HostileServer", "Lie"]

Lie = Callable[[str, int, dict[str, str]], tuple[int, dict[str, str]]]
"""``(path, status, headers) -> (status, headers)``: what the server sends instead."""


def _truth(path: str, status: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    return status, headers


class _Handler(BaseHTTPRequestHandler):
    server: HostileServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        srv = self.server
        with srv.lock:
            srv.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        path = srv.root / urllib.parse.unquote(self.path.split("?", 1)[0].lstrip("/"))
        data = path.read_bytes() if path.is_file() else b""
        status, start, end = (200, 0, len(data)) if path.is_file() else (404, 0, 0)
        headers: dict[str, str] = {}
        if path.is_file():
            headers["ETag"] = '"' + hashlib.md5(data).hexdigest() + '"'
            headers["Last-Modified"] = email.utils.formatdate(path.stat().st_mtime, usegmt=True)
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                lo, _, hi = rng[6:].partition("-")
                start, end = int(lo), min(len(data), int(hi) + 1 if hi else len(data))
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        headers["Content-Length"] = str(end - start)
        status, headers = srv.lie(self.path, status, headers)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if body and 200 <= status < 300:
            self.wfile.write(data[start:end])


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, lie: Lie = _truth) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.lie = lie
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up on a lie is expected

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
