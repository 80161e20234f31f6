"""A tiny HTTP server for tests that must see the headers wids sends, or falsify its answers.

``RecordingServer(root)`` serves the files under ``root`` on 127.0.0.1 (any port) as nginx does
(``Range``, ``ETag``, ``Last-Modified``, ``Content-Length``, HTTP/1.1 keep-alive), records every
request's path and headers (``.seen``), and answers 401 unless a request's ``Authorization`` is
``.require`` (when set). A request with a query is served from the file named by path and query
together (``get?key=a``), if there is one, so tests can serve distinct files that differ only in
a query parameter. For hostile-server tests, ``lie(path, status, headers)`` is handed each
answer's status and headers before they are sent and returns what is sent instead (a
``Content-Range`` the test chooses, a redirect loop, ...). ``.base`` is its
``http://127.0.0.1:PORT``; ``.stop()`` ends it.
"""

from __future__ import annotations

import email.utils
import hashlib
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["Lie", "RecordingServer"]

Lie = Callable[[str, int, dict[str, str]], tuple[int, dict[str, str]]]
"""``(path, status, headers) -> (status, headers)``: what the server sends instead."""


def _truth(path: str, status: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    return status, headers


class _Recorder(BaseHTTPRequestHandler):
    """Serves ``server.root`` with Range and an ETag; records each request's headers."""

    server: RecordingServer
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
        status, headers, data, start, end = self._truth()
        status, headers = srv.lie(self.path, status, headers)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if body and 200 <= status < 300:
            self.wfile.write(data[start:end])

    def _truth(self) -> tuple[int, dict[str, str], bytes, int, int]:
        """``(status, headers, data, start, end)`` of the honest answer."""
        srv = self.server
        if srv.require is not None and self.headers.get("Authorization") != srv.require:
            return (
                401,
                {"WWW-Authenticate": 'Bearer realm="test"', "Content-Length": "0"},
                b"",
                0,
                0,
            )
        path = srv.root / urllib.parse.unquote(self.path.lstrip("/"))
        if not path.is_file():
            path = srv.root / urllib.parse.unquote(self.path.split("?", 1)[0].lstrip("/"))
        if not path.is_file():
            return 404, {"Content-Length": "0"}, b"", 0, 0
        data = path.read_bytes()
        headers = {
            "ETag": '"' + hashlib.md5(data).hexdigest() + '"',
            "Last-Modified": email.utils.formatdate(path.stat().st_mtime, usegmt=True),
            "Accept-Ranges": "bytes",
        }
        start, end, status = 0, len(data), 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            lo, _, hi = rng[6:].partition("-")
            start, end, status = int(lo), min(len(data), int(hi) + 1 if hi else len(data)), 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        headers["Content-Length"] = str(end - start)
        return status, headers, data, start, end


class RecordingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, require: str | None = None, lie: Lie = _truth) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.root = root
        self.require = require
        self.lie = lie
        self.lock = threading.Lock()
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up (on a lie, or when a test ended) is expected

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def auth_seen(self) -> set[str | None]:
        with self.lock:
            return {h.get("authorization") for _, h in self.seen}

    def all_header_values(self) -> str:
        with self.lock:
            return repr(self.seen)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
