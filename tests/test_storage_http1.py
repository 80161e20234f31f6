"""wids.storage.http1: pinned HTTP range reads on plain keep-alive connections, and when not.

A real HTTP/1.1 server on 127.0.0.1 (``http.server``) answers ranges in the ways servers do:
kept alive, closing idle connections, redirecting, chunked. Every read must return the right
bytes; the plain client must be the one used where it can be (the server sees its
absence of aiohttp's ``User-Agent``), and aiohttp everywhere else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from wids import IOStats, RetryPolicy
from wids.storage import Store, read_ranges

DATA = bytes((i * 31 + i // 97) % 256 for i in range(100_000))
ETAG = '"v1"'
STREAMED: list[int] = []  # bytes written by each answer that ignored Range
INJECTED: list[str] = []  # paths of requests that carried a header an etag smuggled in
SPANS = [(k * 7_000, k * 7_000 + 3_000) for k in range(12)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str | None]]  # (path, User-Agent) of each GET

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.seen.append((self.path, self.headers.get("User-Agent")))
        if self.headers.get("X-Injected") is not None:
            INJECTED.append(self.path)
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/plain")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/auth") and self.headers.get("Authorization") is None:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/gzip") or self.path.startswith("/odd-length"):
            gzip = self.path.startswith("/gzip")  # compressed whatever was asked: 1 MB of zeros
            body = __import__("gzip").compress(bytes(1 << 20)) if gzip else b"x"
            self.send_response(206)
            self.send_header("ETag", ETAG)
            self.send_header("Content-Encoding" if gzip else "X-Odd", "gzip")
            self.send_header("Content-Length", str(len(body)) if gzip else "\u00b2")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            return
        if self.path.startswith("/huge"):  # ignores Range: a "whole file" of 10 GB, streamed
            self._stream_forever(chunked=self.path.startswith("/huge-chunked"))
            return
        match = self.headers.get("If-Match")
        if match is not None and match != ETAG:
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, last = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
        body = DATA[first : last + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(DATA)}")
        self.send_header("ETag", ETAG)
        if self.path.startswith("/chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.path.startswith("/close-idle"):  # kept alive by its headers, then dropped
            self.wfile.flush()
            self.close_connection = True

    def _stream_forever(self, chunked: bool) -> None:
        self.send_response(200)
        self.send_header("ETag", ETAG)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(10**10))
        self.end_headers()
        piece = DATA[: 1 << 16]
        frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
        STREAMED.append(0)
        try:
            while STREAMED[-1] < 256 << 20:  # bounded: the test must end either way
                self.wfile.write(frame)
                STREAMED[-1] += len(piece)
        except OSError:  # the client hung up: what a bounded reader does
            pass
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list]]:
    seen: list[tuple[str, str | None]] = []
    handler = type("Handler", (_Handler,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def _read(base: str, path: str, options: dict | None = None) -> tuple[list[bytes], IOStats]:
    stats = IOStats()
    store = Store(options, RetryPolicy(attempts=3, backoff=0.01, timeout=10.0))
    src = store.source(f"{base}/{path}", size=len(DATA), etag="v1")
    got = []
    for _ in range(2):  # twice: the second round reuses (or replaces) connections
        got += read_ranges([(src, s, e) for s, e in SPANS], stats)
    return got, stats


@pytest.mark.parametrize("path", ["plain", "close-idle"])
def test_pinned_reads_use_plain_connections(server, path):
    base, seen = server
    seen.clear()
    got, stats = _read(base, path)
    assert got == [DATA[s:e] for s, e in SPANS] * 2
    assert [agent for _, agent in seen] == [None] * len(got)  # never aiohttp (it names itself)
    assert stats.requests == len(got) and stats.retries == 0  # a dropped idle one: no retry


@pytest.mark.parametrize("path", ["redirect", "chunked"])
def test_answers_it_does_not_handle_go_to_aiohttp(server, path):
    base, seen = server
    seen.clear()
    got, stats = _read(base, path)
    assert got == [DATA[s:e] for s, e in SPANS] * 2
    assert any(agent is not None for _, agent in seen)  # aiohttp took over
    assert stats.retries == 0


def test_request_options_keep_aiohttp(server):
    base, seen = server
    seen.clear()
    got, _ = _read(base, "plain", {"headers": {"X-Token": "t"}})
    assert got == [DATA[s:e] for s, e in SPANS] * 2
    assert all(agent is not None for _, agent in seen)


def test_a_replaced_file_is_refused(server):
    from wids.errors import IndexMismatchError

    base, _ = server
    src = Store().source(f"{base}/plain", size=len(DATA), etag="v0")  # the index's: stale
    with pytest.raises(IndexMismatchError, match="412"):
        read_ranges([(src, s, e) for s, e in SPANS[:3]])


def test_a_connection_that_spoke_out_of_turn_is_not_reused():
    """Bytes a server sends on an idle connection are never read as the next answer."""
    import socket

    body = DATA[:100]
    answer = (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/%d\r\nETag: %s\r\n"
        b"Content-Length: 100\r\n\r\n%s" % (len(DATA), ETAG.encode(), body)
    )
    junk = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def answer_all(conn: socket.socket, first: bool) -> None:
        try:
            while conn.recv(65536):
                conn.sendall(answer)
                if first:
                    time.sleep(0.05)  # the answer was taken: the connection is idle
                    conn.sendall(junk)  # unasked
                    first = False
        except OSError:  # closed by the client or at the end of the test
            pass

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=answer_all, args=(conn, len(conns) == 1), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{listener.getsockname()[1]}"
        src = Store().source(f"{base}/x", size=len(DATA), etag="v1")
        assert src.read_range(0, 100) == body
        time.sleep(0.2)  # the junk has arrived on the idle connection
        assert src.read_range(0, 100) == body  # not the junk: a new connection
        assert len(conns) == 2
    finally:
        listener.close()
        for c in conns:
            c.close()


@pytest.mark.parametrize(
    ("path", "options"),
    [
        ("huge", None),  # the plain client: refused from Content-Length
        ("huge", {"headers": {"X-Token": "t"}}),  # aiohttp: the same
        ("huge-chunked", None),  # no length: refused once the body passes the range's
    ],
)
def test_a_server_that_ignores_range_is_refused_without_reading_the_file(server, path, options):
    from wids.errors import PermanentRemoteError

    base, _ = server
    store = Store(options, RetryPolicy(attempts=3, backoff=0.01, timeout=10.0))
    src = store.source(f"{base}/{path}", size=10**10, etag="v1")
    before = len(STREAMED)
    with pytest.raises(PermanentRemoteError, match="ignores Range"):
        read_ranges([(src, 1000, 4000)])
    time.sleep(0.5)  # the server notices the hang-up
    # refused, not retried (a chunked answer: the plain client hands it to aiohttp first)
    assert len(STREAMED) == before + (2 if path == "huge-chunked" else 1)
    assert STREAMED[-1] < 32 << 20  # it stopped early (socket buffers), not at 256 MB


def test_credentials_in_the_url_keep_aiohttp(server):
    base, seen = server
    seen.clear()
    got, _ = _read(base.replace("http://", "http://user:secret@"), "auth")
    assert got == [DATA[s:e] for s, e in SPANS] * 2  # aiohttp sent them as Basic auth
    assert all(agent is not None for _, agent in seen)


@pytest.mark.parametrize(
    ("path", "options"),
    [("gzip", None), ("gzip", {"headers": {"X-Token": "t"}}), ("odd-length", None)],
)
def test_an_encoded_or_oddly_framed_answer_is_a_typed_error(server, path, options):
    from wids.errors import WidsError

    base, _ = server
    store = Store(options, RetryPolicy(attempts=2, backoff=0.01, timeout=10.0))
    src = store.source(f"{base}/{path}", size=len(DATA), etag="v1")
    with pytest.raises(WidsError, match=path) as got:  # names the file; never a ValueError
        read_ranges([(src, 1000, 4000)])
    if path == "gzip":  # refused as encoded, before aiohttp expands it (1 MB here; any size)
        assert "Content-Encoding 'gzip'" in str(got.value)


def test_a_shard_s_first_answer_is_checked_on_a_plain_connection(server):
    """The first answer of a source that knows only the size pins its etag (from ``ETag``)
    without aiohttp; an answer that contradicts the index's values fails the read."""
    from wids.errors import IndexMismatchError

    base, seen = server
    seen.clear()
    store = Store(None, RetryPolicy(attempts=2, backoff=0.01, timeout=10.0))
    src = store.source(f"{base}/plain", size=len(DATA))
    got = read_ranges([(src, s, e) for s, e in SPANS])
    assert got == [DATA[s:e] for s, e in SPANS]
    assert [agent for _, agent in seen] == [None] * len(SPANS)  # never aiohttp
    assert src.pin.size == len(DATA) and src.pin.etag.strip('"') == "v1"  # pinned from now on

    other = Store(None, RetryPolicy(attempts=2, backoff=0.01, timeout=10.0))
    wrong = other.source(f"{base}/plain", size=len(DATA) + 1)
    with pytest.raises(IndexMismatchError, match="not the shard the index describes"):
        read_ranges([(wrong, s, e) for s, e in SPANS[:3]])


@pytest.mark.parametrize("options", [None, {"headers": {"X-Token": "t"}}])
@pytest.mark.parametrize("batch", [False, True])
def test_an_etag_with_a_line_break_never_adds_headers(server, options, batch):
    """A hostile index's etag is not sent as header lines (it was, in a batch's plain GETs);
    the answers are still held to it: a typed error naming the shard."""
    from wids import IndexMismatchError

    base, _ = server
    INJECTED.clear()
    store = Store(options, RetryPolicy(attempts=2, backoff=0.01, timeout=10.0))
    etag = 'v1"\r\nX-Injected: yes\r\nX-Pad: "'
    src = store.source(f"{base}/plain", size=len(DATA), etag=etag)
    with pytest.raises(IndexMismatchError, match="plain"):
        if batch:
            read_ranges([(src, s, e) for s, e in SPANS[:3]])
        else:
            src.read_range(*SPANS[0])
    assert INJECTED == []


def test_https_reads_use_the_plain_client_verified_as_aiohttp_verifies(https_server, monkeypatch):
    """``https://`` shards read on the plain client's TLS connections (blocking for one read,
    asynchronous for a batch), trusting what ``ssl.create_default_context()`` trusts."""
    import ssl

    from wids import PermanentRemoteError
    from wids.storage.http1 import blocking_connections

    url = https_server.put_bytes(DATA, "tls/data.bin")
    port = int(https_server.base.rsplit(":", 1)[1])
    policy = RetryPolicy(attempts=2, backoff=0.01, timeout=10.0)
    monkeypatch.setenv("SSL_CERT_FILE", https_server.cafile)
    store = Store(None, policy)
    src = store.source(url, size=len(DATA))
    https_server.reset_counts()
    for s, e in SPANS[:4]:
        assert src.read_range(s, e) == DATA[s:e]
    assert read_ranges([(src, s, e) for s, e in SPANS]) == [DATA[s:e] for s, e in SPANS]
    assert https_server.request_count() == 4 + len(SPANS)
    conns = blocking_connections("127.0.0.1", port, True).conns
    assert conns and all(isinstance(c.sock, ssl.SSLSocket) for c in conns)
    assert {c.sock.selected_alpn_protocol() for c in conns} == {"http/1.1"}  # as aiohttp asks
    # the certificate names 127.0.0.1, not localhost: refused, as a wrong name
    other = Store(None, policy).source(url.replace("127.0.0.1", "localhost"), size=len(DATA))
    with pytest.raises(PermanentRemoteError, match="certificate"):
        other.read_range(0, 100)
    monkeypatch.delenv("SSL_CERT_FILE")  # a CA nobody trusts: refused, nothing read
    store.close_idle()  # (this process's verified connections are shared by its stores)
    https_server.reset_counts()
    untrusted = Store(None, policy).source(url, size=len(DATA))
    with pytest.raises(PermanentRemoteError, match="certificate"):
        untrusted.read_range(0, 100)
    with pytest.raises(PermanentRemoteError, match="certificate"):
        read_ranges([(untrusted, s, e) for s, e in SPANS[:2]])
    assert https_server.request_count() == 0


def _raw_server(answer_all) -> tuple[str, list, Any]:
    """A server on 127.0.0.1 that hands each connection to ``answer_all(conn)`` in a thread."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=answer_all, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", conns, listener


def _answer(start: int, end: int) -> bytes:
    return (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nETag: %s\r\n"
        b"Content-Length: %d\r\n\r\n%s"
        % (start, end - 1, len(DATA), ETAG.encode(), end - start, DATA[start:end])
    )


def _ranges(request: bytes) -> tuple[int, int]:
    line = next(x for x in request.split(b"\r\n") if x.lower().startswith(b"range:"))
    first, last = line.split(b"=")[1].split(b"-")
    return int(first), int(last) + 1


@pytest.mark.parametrize("junk", [False, True])
def test_a_single_read_takes_an_answer_in_any_pieces(junk):
    """``ds[i]``'s blocking read: an answer trickled in pieces (a byte at a time in its head)
    is read whole; bytes after an answer (in the same packet) are never read as the next
    answer: that connection is not reused."""
    from wids.storage.http1 import blocking_connections

    def answer_all(conn) -> None:
        try:
            while True:
                request = conn.recv(65536)
                if not request:
                    return
                answer = _answer(*_ranges(request))
                if junk:
                    conn.sendall(answer + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")
                    continue
                cut = answer.index(b"\r\n\r\n") + 4
                for k in range(cut):  # the head a byte at a time, the body in three pieces
                    conn.sendall(answer[k : k + 1])
                    if k % 40 == 0:
                        time.sleep(0.001)
                third = (len(answer) - cut) // 3
                for piece in (answer[cut : cut + third], answer[cut + third : cut + 2 * third]):
                    conn.sendall(piece)
                    time.sleep(0.005)
                conn.sendall(answer[cut + 2 * third :])
        except OSError:
            pass

    base, conns, listener = _raw_server(answer_all)
    try:
        store = Store(None, RetryPolicy(attempts=1, timeout=10.0))
        src = store.source(f"{base}/x", size=len(DATA), etag="v1")
        for s, e in SPANS[:4]:
            assert src.read_range(s, e) == DATA[s:e]
        port = int(base.rsplit(":", 1)[1])
        assert len(conns) == (4 if junk else 1)
        assert len(blocking_connections("127.0.0.1", port).conns) == (0 if junk else 1)
        store.close_idle()
    finally:
        listener.close()
        for c in conns:
            c.close()


def test_a_single_read_cut_mid_answer_is_retried_and_typed():
    """A connection closed mid-answer is a transient failure: retried on a new connection;
    one that keeps failing ends in a typed error, never in a short read."""
    from wids import RetriesExhaustedError

    cuts: list[int] = []

    def answer_all(conn) -> None:
        try:
            request = conn.recv(65536)
            answer = _answer(*_ranges(request))
            cuts.append(len(cuts))
            if len(cuts) % 2:  # every other connection: half the answer, then closed
                conn.sendall(answer[: len(answer) // 2])
            else:
                conn.sendall(answer)
                conn.recv(65536)
        except OSError:
            pass
        finally:
            conn.close()

    base, conns, listener = _raw_server(answer_all)
    try:
        src = Store(None, RetryPolicy(attempts=3, backoff=0.01, timeout=10.0)).source(
            f"{base}/x", size=len(DATA), etag="v1"
        )
        s, e = SPANS[1]
        assert src.read_range(s, e) == DATA[s:e]
        assert len(cuts) == 2
        once = Store(None, RetryPolicy(attempts=1, timeout=10.0)).source(
            f"{base}/x", size=len(DATA), etag="v1"
        )
        with pytest.raises(RetriesExhaustedError, match="closed"):
            once.read_range(s, e)
    finally:
        listener.close()
        for c in conns:
            c.close()


@pytest.mark.parametrize("batch", [False, True])
def test_an_error_page_longer_than_the_range_is_its_status(batch):
    """A 503 whose page is longer than the range asked for (a proxy's HTML) is a 503: retried,
    then the right bytes. Main took its length for a server ignoring Range and raised
    RangeNotSupportedError at once (the dataset then read the shard whole and warned)."""
    page = b"<html>" + b"busy " * 30_000 + b"</html>"
    answers: list[int] = []

    def answer_all(conn) -> None:
        try:
            while True:
                request = conn.recv(65536)
                if not request:
                    return
                if not answers:
                    answers.append(503)
                    head = b"HTTP/1.1 503 Busy\r\nContent-Length: %d\r\n\r\n" % len(page)
                    conn.sendall(head + page)
                    continue
                answers.append(206)
                conn.sendall(_answer(*_ranges(request)))
        except OSError:
            pass

    base, conns, listener = _raw_server(answer_all)
    try:
        store = Store(None, RetryPolicy(attempts=3, backoff=0.01, timeout=10.0))
        src = store.source(f"{base}/x", size=len(DATA), etag="v1")
        s, e = SPANS[2]
        got = read_ranges([(src, s, e)]) if batch else [src.read_range(s, e)]
        assert got == [DATA[s:e]]
        assert answers[0] == 503 and answers[1:] == [206]
        store.close_idle()
    finally:
        listener.close()
        for c in conns:
            c.close()


def test_a_reused_blocking_connection_takes_the_timeout_of_the_store_reading():
    """``ds[i]``'s blocking connections are the process's, shared by stores: one made for a
    store with a long timeout kept it for another store's reads (main: a store with a 0.5 s
    timeout waited the other's 30 s for a stalled answer)."""
    from wids import RetriesExhaustedError

    def answer_all(conn) -> None:
        try:
            request = conn.recv(65536)
            conn.sendall(_answer(*_ranges(request)))
            conn.recv(65536)  # the second request: never answered
            time.sleep(40)
        except OSError:
            pass

    base, conns, listener = _raw_server(answer_all)
    try:
        patient = Store(None, RetryPolicy(attempts=1, timeout=30.0))
        s, e = SPANS[0]
        assert patient.source(f"{base}/x", size=len(DATA), etag="v1").read_range(s, e) == DATA[s:e]
        hasty = Store(None, RetryPolicy(attempts=1, timeout=0.5, max_time=5.0))
        began = time.monotonic()
        with pytest.raises(RetriesExhaustedError):
            hasty.source(f"{base}/x", size=len(DATA), etag="v1").read_range(s, e)
        assert time.monotonic() - began < 5.0
        assert len(conns) == 1  # the same connection was reused
        patient.close_idle()
    finally:
        listener.close()
        for c in conns:
            c.close()


def test_a_single_read_trickled_a_byte_at_a_time_ends_within_its_timeout():
    """``ds[i]``'s blocking read is bounded as a whole by the timeout, as a batch's attempt
    is: a server sending its answer a byte every 0.3 s (never silent for a whole timeout)
    held one attempt of a 1 s timeout for as long as the answer has bytes (main: ~35 s for
    this 100-byte range, and a real range of 20 KB for hours)."""
    from wids import RetriesExhaustedError

    def answer_all(conn) -> None:
        try:
            request = conn.recv(65536)
            for k, byte in enumerate(_answer(*_ranges(request))):
                conn.sendall(bytes([byte]))
                if k > 60:  # the head whole and fast, then the body a byte at a time
                    time.sleep(0.3)
        except OSError:
            pass

    base, conns, listener = _raw_server(answer_all)
    try:
        src = Store(None, RetryPolicy(attempts=1, timeout=1.0)).source(
            f"{base}/x", size=len(DATA), etag="v1"
        )
        began = time.monotonic()
        with pytest.raises(RetriesExhaustedError, match="TimeoutError"):
            src.read_range(0, 100)
        assert time.monotonic() - began < 3.0
    finally:
        listener.close()
        for c in conns:
            c.close()


_NO_AIOHTTP = r"""
import json, sys
from wids.storage import Store, read_ranges, read_whole
from wids.storage.parts import download

url, size = sys.argv[1], int(sys.argv[2])
store = Store()
src = store.source(url, size=size)
got = [src.read_range(100, 5000), *read_ranges([(src, s, s + 700) for s in range(0, 9000, 900)])]
whole = read_whole(store.source(url), limit=size)
download(store.source(url), sys.argv[4], None, size, part_size=4096)  # as a promotion does
stat = store.source(url).info()  # a HEAD
print(json.dumps({
    "stat": [stat.size, stat.etag, stat.mtime],
    "got": [g.hex() for g in got],
    "whole": whole == open(sys.argv[3], "rb").read() == open(sys.argv[4], "rb").read(),
    "imported": sorted(m for m in ("aiohttp", "fsspec.implementations.http", "yarl")
                       if m in sys.modules),
}))
"""


def test_a_process_reading_ranges_and_whole_files_never_imports_aiohttp(http_server, tmp_path):
    """Plain ``http://`` reads (one range, a batch, a small whole file, a parted download of
    a whole file, a stat) need no aiohttp; the stat says what aiohttp's says.

    Importing aiohttp costs a fresh DataLoader worker (forkserver, spawn) ~0.3 s and two TLS
    contexts before its first sample, for a client it does not use.
    """
    import json
    import os
    import subprocess
    import sys

    local = tmp_path / "lazy.bin"
    local.write_bytes(DATA[:20_000])
    url = http_server.put(str(local), "lazy.bin")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": repo}
    run = subprocess.run(
        [sys.executable, "-c", _NO_AIOHTTP, url, "20000", str(local), str(tmp_path / "copy")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    spans = [(100, 5000), *((s, s + 700) for s in range(0, 9000, 900))]
    assert found["got"] == [DATA[s:e].hex() for s, e in spans]
    assert found["whole"]
    assert found["imported"] == []
    stat = Store({"headers": {"X-Client": "aiohttp"}}).source(url).info()  # fsspec's HEAD
    assert found["stat"] == [stat.size, stat.etag, stat.mtime]
    assert stat.size == 20_000 and stat.etag and stat.mtime


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/a/b-c_d.tar",
        "HTTP://Example.COM/x",
        "https://example.com",
        "https://h:443/x/",
        "http://h/a//b",
        "http://h/a.b/c~d",
        "http://h:080/x",  # the rest through yarl
        "http://h/a/../b",
        "http://h/a b/%41%2f?q=1&r=a+b",
        "http://bücher.example/ä",
        "http://h./x",
    ],
)
def test_the_plain_client_requests_what_aiohttp_would(url):
    """The request target and server of a URL are yarl's (what fsspec and aiohttp send)."""
    import yarl

    from wids.storage.http1 import Http1Pools, PlainTransport

    plain = PlainTransport.of(url, {}, RetryPolicy(), Http1Pools())
    assert plain is not None and plain.pool is not None
    want = yarl.URL(url)
    tls = want.scheme == "https"
    assert (plain.pool.host, plain.pool.port, plain.pool.tls is not None) == (
        want.raw_host,
        want.port,
        tls,
    )
    assert plain.target == want.raw_path_qs


@pytest.mark.parametrize("name", ["forbidden/lazy.bin", "missing/lazy.bin", "noetag/lazy.bin"])
def test_a_stat_fails_or_answers_as_aiohttp_s(http_server, name):
    """A plain HEAD: a 404 is not found, any other failure is left to fsspec's rules, and an
    answer without an etag says the date (nginx: 403 on ``/forbidden/``)."""
    http_server.put_bytes(DATA[:1000], "lazy.bin")
    policy = RetryPolicy(attempts=2, backoff=0.01, timeout=10.0)
    found = []
    for options in (None, {"headers": {"X-Client": "aiohttp"}}):
        src = Store(options, policy).source(http_server.url(name))
        try:
            stat = src.info()
        except Exception as e:  # noqa: BLE001 - compared below
            found.append(type(e))
        else:
            found.append((stat.size, stat.etag, stat.mtime))
    assert found[0] == found[1]
    if name.startswith("noetag"):
        assert found[0][:2] == (1000, None) and found[0][2]  # type: ignore[index]
