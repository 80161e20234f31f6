"""A tiny HTTP server for tests that must see the headers wids sends (127.0.0.1, any port).

``RecordingServer(root)`` serves the files under ``root`` with ``Range``, ``ETag`` and
``Last-Modified``, records every request's path and headers (``.seen``), and answers 401
unless a request's ``Authorization`` is ``.require`` (when set). A request with a query is
served from the file named by path and query together (``get?key=a``), if there is one, so
tests can serve distinct files that differ only in a query parameter.
"""

from __future__ import annotations

import email.utils
import hashlib
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["RecordingServer"]


class _Recorder(BaseHTTPRequestHandler):
    """Serves ``server.root`` with Range and an ETag; records each request's headers."""

    server: RecordingServer

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
        if srv.require is not None and self.headers.get("Authorization") != srv.require:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Bearer realm="test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = srv.root / urllib.parse.unquote(self.path.lstrip("/"))
        if not path.is_file():
            path = srv.root / urllib.parse.unquote(self.path.split("?", 1)[0].lstrip("/"))
        if not path.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = path.read_bytes()
        st = path.stat()
        etag = '"' + hashlib.md5(data).hexdigest() + '"'
        start, end, status = 0, len(data), 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            lo, _, hi = rng[6:].partition("-")
            start, end, status = int(lo), min(len(data), int(hi) + 1 if hi else len(data)), 206
        self.send_response(status)
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(data[start:end])


class RecordingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, require: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.root = root
        self.require = require
        self.lock = threading.Lock()
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

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
