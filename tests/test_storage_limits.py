"""wids.storage.limits: remote index reads are bounded per kind (issue 21 item 8).

A 200 MB description was read whole, a small gzip-encoded answer inflated before parsing
failed, and an endless chunked answer ran until the attempt timeout. Each is refused now.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from wids import ReadLimits, RetryPolicy, ShardListDataset, build_index
from wids.errors import PermanentRemoteError, TooLargeError
from wids.index import open_index
from wids.storage import Store

POLICY = RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.02, timeout=20.0, max_time=60.0)
BOMB = gzip.compress(b'{"shardlist": [' + b" " * (50 << 20) + b"]}")  # 50 KB -> 50 MB


class _Hostile(BaseHTTPRequestHandler):
    """``/gzip/...`` a gzip bomb, ``/endless/...`` a chunked answer that never ends,
    ``/big/...`` an announced 200 MB."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path.startswith("/gzip/"):
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(BOMB)))
            self.end_headers()
            self.wfile.write(BOMB)
        elif self.path.startswith("/endless/"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"%x\r\n%s\r\n" % (1 << 16, b" " * (1 << 16))
            try:
                while True:
                    self.wfile.write(chunk)
            except OSError:  # the client hung up
                pass
        else:
            self.send_header("Content-Length", str(200 << 20))
            self.end_headers()
            try:
                self.wfile.write(b"{" + b" " * (1 << 20))
            except OSError:
                pass
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_encoded_description_is_refused_before_it_inflates(hostile):
    with pytest.raises(PermanentRemoteError, match="Content-Encoding 'gzip'"):
        len(ShardListDataset(f"{hostile}/gzip/train.json", retry=POLICY))


def test_an_endless_answer_stops_at_the_bound(hostile):
    start = time.monotonic()
    with pytest.raises(TooLargeError, match="limit"):
        len(ShardListDataset(f"{hostile}/endless/train.json", retry=POLICY))  # 256 MiB default
    assert time.monotonic() - start < POLICY.timeout  # not the attempt's timeout


def test_an_announced_size_over_the_bound_is_refused_unread(hostile):
    limits = ReadLimits(description=10 << 20)
    with pytest.raises(TooLargeError, match="209715200 bytes"):
        len(ShardListDataset(f"{hostile}/big/train.json", retry=POLICY, read_limits=limits))


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(20):
            info = tarfile.TarInfo(f"k{i:04d}.cls")
            info.size = 2
            tf.addfile(info, io.BytesIO(b"%d\n" % (i % 10)))
    return buf.getvalue()


def test_a_remote_sqlite_index_over_its_bound_is_not_downloaded(http_server, tmp_path):
    shard = tmp_path / "a.tar"
    shard.write_bytes(_tar())
    url = http_server.put_bytes(_tar(), f"limits/{tmp_path.name}/a.tar")
    build_index([url], str(tmp_path / "i.sqlite"))
    index_url = http_server.put((tmp_path / "i.sqlite"), f"limits/{tmp_path.name}/i.sqlite")
    size = (tmp_path / "i.sqlite").stat().st_size
    http_server.reset_counts()
    store = Store(None, POLICY, limits=ReadLimits(sqlite=size - 1))
    with pytest.raises(TooLargeError):
        open_index(index_url, store).shards  # noqa: B018 - opening it downloads it
    assert open_index(index_url, Store(None, POLICY)).shards[0].nsamples == 20
