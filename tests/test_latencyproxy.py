"""tools/latencyproxy.py: the delay and the bandwidth cap are real, and clients work through it.

The timing assertions are lower bounds of physics (a response cannot arrive before the delay
plus its size over the cap), not speed goals: a loaded machine only makes them easier to meet.
"""

from __future__ import annotations

import http.client
import os
import time

import fsspec
import pytest
from latencyproxy import LatencyProxy, ProxyProcess

pytestmark = pytest.mark.servers

MB = 1_000_000


@pytest.fixture(scope="module")
def big(http_server):
    """A 4 MB object on nginx: its name and bytes."""
    data = os.urandom(4 * MB)
    http_server.put_bytes(data, "latency/big.bin")
    return "latency/big.bin", data


def _get(conn: http.client.HTTPConnection, path: str, headers: dict | None = None) -> bytes:
    conn.request("GET", "/" + path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status in (200, 206), resp.status
    return body


def test_delay_and_cap_are_lower_bounds(http_server, big):
    name, data = big
    delay, mbps = 0.1, 20.0
    with LatencyProxy(http_server.base, delay=delay, mbps=mbps) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
        t = time.perf_counter()
        body = _get(conn, name)
        whole = time.perf_counter() - t
        t = time.perf_counter()
        part = _get(conn, name, {"Range": "bytes=1000-1999"})
        small = time.perf_counter() - t
        conn.close()
        counts = proxy.settled()
    assert body == data and part == data[1000:2000]
    assert whole >= delay + len(data) / (mbps * MB)  # 0.1 s + 0.2 s
    assert small >= delay
    assert counts["requests"] == counts["GET"] == 2
    assert counts["bytes_out"] == len(data) + 1000
    assert counts["connections"] == 1  # kept alive
    assert counts["in_flight_peak"] == 1
    assert counts["request_us"] >= 1e6 * (2 * delay + len(data) / (mbps * MB))
    assert counts["active_us"] >= 1e6 * 2 * delay


def test_cap_is_per_connection(http_server, big):
    """Two connections at once each get the full cap (not a shared one)."""
    import threading

    name, data = big
    mbps = 20.0
    with LatencyProxy(http_server.base, delay=0.0, mbps=mbps) as proxy:
        times: list[float] = []

        def fetch() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
            t = time.perf_counter()
            assert _get(conn, name) == data
            times.append(time.perf_counter() - t)
            conn.close()

        threads = [threading.Thread(target=fetch) for _ in range(2)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        both = time.perf_counter() - t
        counts = proxy.settled()
        assert counts["connections"] == 2
        assert counts["in_flight_peak"] == 2  # both requests were open at once
        # Little's law: the mean number in flight while busy is between 1 and 2
        assert 1.0 <= counts["in_flight_us"] / counts["active_us"] <= 2.0
    assert len(times) == 2
    assert min(times) >= len(data) / (mbps * MB)
    # a shared cap would need 2 x 0.2 s for both; per connection they overlap (generous slack)
    assert both < 2 * len(data) / (mbps * MB) + 1.5


def test_keepalive_pays_the_delay_per_request(http_server, big):
    name, data = big
    delay = 0.05
    with LatencyProxy(http_server.base, delay=delay, mbps=0) as proxy:
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        t = time.perf_counter()
        for k in range(5):
            assert (
                fs.cat_file(proxy.url(name), start=k * 100, end=k * 100 + 10)
                == data[k * 100 : k * 100 + 10]
            )
        spent = time.perf_counter() - t
        counts = proxy.counts()
    assert spent >= 5 * delay
    assert counts["requests"] >= 5
    assert counts["connections"] < counts["requests"]  # connections were reused


def test_s3fs_through_the_proxy(s3_server):
    import s3fs

    payload = os.urandom(300_000)
    with LatencyProxy(s3_server.endpoint, delay=0.01, mbps=0) as proxy:
        fs = s3fs.S3FileSystem(
            key="testing",
            secret="testing",
            client_kwargs={"endpoint_url": proxy.base, "region_name": "us-east-1"},
            skip_instance_cache=True,
        )
        path = f"{s3_server.bucket}/latency/obj.bin"
        fs.pipe_file(path, payload)  # a signed PUT with a body, through the proxy
        fs.invalidate_cache()
        assert fs.info(path)["size"] == len(payload)
        assert fs.cat_file(path) == payload
        assert fs.cat_file(path, start=1000, end=5000) == payload[1000:5000]
        counts = proxy.counts()
    assert counts.get("PUT", 0) >= 1 and counts["bytes_in"] >= len(payload)
    assert counts["bytes_out"] >= len(payload) + 4000
    # and the object is really on the server behind it
    assert s3_server.fs.cat_file(path) == payload


def test_gcsfs_through_the_proxy(gcs_server):
    import gcsfs

    payload = os.urandom(100_000)
    gcs_server.put_bytes(payload, "latency/obj.bin")
    with LatencyProxy(gcs_server.endpoint, delay=0.01, mbps=0) as proxy:
        fs = gcsfs.GCSFileSystem(
            endpoint_url=proxy.base, token="anon", project="test", skip_instance_cache=True
        )
        path = f"{gcs_server.bucket}/latency/obj.bin"
        assert fs.cat_file(path, start=10, end=2010) == payload[10:2010]
        assert proxy.counts()["requests"] >= 1


def test_command_line_process_and_control_path(http_server, big):
    name, data = big
    with ProxyProcess(http_server.base, delay=0.02, mbps=100, lifetime=120) as proxy:
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        assert fs.cat_file(proxy.url(name), start=0, end=100) == data[:100]
        counts = proxy.counts()
        assert counts["requests"] >= 1 and counts["bytes_out"] >= 100
        proxy.reset_counts()
        assert proxy.counts()["requests"] == 0  # control requests are not counted
    assert proxy.proc is not None and proxy.proc.returncode == 0


def test_lifetime_bounds_the_run(http_server):
    proxy = LatencyProxy(http_server.base, lifetime=0.3).start()
    try:
        assert proxy.stopped.wait(10)
    finally:
        proxy.stop()


def test_upstream_must_be_loopback():
    with pytest.raises(ValueError):
        LatencyProxy("http://example.com:80")


def test_chunked_and_unframed_answers_pass_through():
    """Bodies framed by chunks or by closing the connection arrive whole and are counted."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pieces = [b"a" * 70_000, b"b" * 10, b"c" * 5]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self.send_response(200)
            if self.path == "/chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for p in pieces:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
                self.wfile.write(b"0\r\n\r\n")
            else:  # no length: the body ends when the connection does
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"".join(pieces))
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        upstream = f"http://127.0.0.1:{server.server_address[1]}"
        with LatencyProxy(upstream, delay=0.0, mbps=10) as proxy:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            assert _get(conn, "chunked") == b"".join(pieces)
            assert _get(conn, "chunked") == b"".join(pieces)  # the connection stayed usable
            assert _get(conn, "plain") == b"".join(pieces)
            conn.close()
            counts = proxy.settled()
        assert counts["requests"] == 3
        assert counts["bytes_out"] == 3 * sum(map(len, pieces))
    finally:
        server.shutdown()
        server.server_close()


def test_heads_pass_byte_for_byte_unless_a_hop_header_goes():
    """A head with no hop-by-hop header is forwarded as it came (no re-spacing, no reorder);
    one with them loses exactly those. (The proxy parses each head once, for its lookups.)"""
    from httprelay import Message

    raw = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Odd:a  b\r\nRange:bytes=0-9\r\n\r\n"
    request = Message(raw)
    assert request.encode() == raw
    assert request.get(b"RANGE") == b"bytes=0-9" and request.get(b"x-odd") == b"a  b"
    hop = Message(b"HTTP/1.1 206 Partial\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n")
    assert hop.encode() == b"HTTP/1.1 206 Partial\r\nContent-Length: 3\r\n\r\n"
    assert hop.encode([(b"Connection", b"close")]).endswith(b"Connection: close\r\n\r\n")
    assert not hop.closes() and Message(b"GET / HTTP/1.0\r\n\r\n").closes()


def test_plain_requests_take_the_fast_path_and_bodies_the_stream_relay(http_server, big):
    """GETs without a body are relayed by protocol callbacks (tools/fastrelay.py); a request
    with a body hands its connection to the stream-based relay, which goes on serving it."""
    name, data = big
    with LatencyProxy(http_server.base, delay=0.01, mbps=100) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        for k in range(3):
            assert _get(conn, name, {"Range": f"bytes={k}-{k + 999}"}) == data[k : k + 1000]
        assert len(proxy._relays) == 1 and not proxy._tasks  # no task per connection
        conn.request("PUT", "/latency/nowhere.bin", body=b"x" * 1000)
        conn.getresponse().read()  # nginx refuses it; the answer still comes back whole
        assert not proxy._relays and len(proxy._tasks) == 1
        assert _get(conn, name, {"Range": "bytes=5-9"}) == data[5:10]
        conn.close()
        counts = proxy.settled()
    assert counts["requests"] == 5 and counts["PUT"] == 1 and counts["bytes_in"] == 1000
    assert counts["connections"] == 1 and counts["in_flight"] == 0


def test_a_client_gone_mid_answer_is_counted_out(http_server, big):
    import socket

    name, _ = big
    with LatencyProxy(http_server.base, delay=0.0, mbps=10) as proxy:  # 0.4 s for 4 MB
        sock = socket.create_connection(("127.0.0.1", proxy.port))
        sock.sendall(f"GET /{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        sock.close()
        counts = proxy.settled()
    assert counts["in_flight"] == 0 and counts["requests"] == 1
    assert counts["bytes_out"] < 4 * MB
