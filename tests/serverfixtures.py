"""Real storage servers on 127.0.0.1 for the test suite: S3 (moto), HTTP (nginx), GCS (emulator).

Session-scoped fixtures ``s3_server``, ``http_server``, ``gcs_server`` and the parametrized
``remote_server`` (each of the three in turn). Every server object has the same interface:

- ``.protocol``: ``"s3"``, ``"http"`` or ``"gs"``
- ``.storage_options``: the dict to hand to fsspec / wids
- ``.url(name)``: the full URL of object ``name``
- ``.put(local_path, name)``, ``.put_bytes(data, name)``: upload
- ``.fs``: an fsspec filesystem for it

``fault_proxy`` (from ``faultproxy.py``) is a factory fixture for a fault-injecting proxy in
front of one of them.

nginx also counts requests from its access log: ``.request_count(name=None)`` (requests for
one object, or all) and ``.reset_counts()``; ``/forbidden/...`` always answers 403.

Tests that use a server are marked ``servers`` automatically (deselect with
``-m "not servers"``); marking them explicitly as well does no harm.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from faultproxy import fault_proxy

# gcsfs probes the bucket type over gRPC (and hangs ~60 s against the emulator) unless this is
# off; it must be set before gcsfs is first imported, hence at import of this module.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = [
    "GcsServer",
    "HttpServer",
    "S3Server",
    "fault_proxy",
    "free_port",
    "gcs_server",
    "http_server",
    "pytest_collection_modifyitems",
    "remote_server",
    "s3_server",
    "start_process",
    "stop_process",
]

SERVER_FIXTURES = {"s3_server", "http_server", "gcs_server", "remote_server", "fault_proxy"}
BUCKET = "wids-test"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Mark every test that uses a server fixture with ``servers``."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - 127.0.0.1 only
            r.read()
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except OSError:
        return False


def start_process(cmd: list[str], probe_url: str, log: Path, timeout: float = 60.0, **kw: Any):
    """Start ``cmd`` with output to ``log`` and wait until ``probe_url`` answers."""
    out = open(log, "wb")  # noqa: SIM115 - closed by stop_process
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **kw)
    proc._wids_log = out  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if _answers(probe_url):
            return proc
        time.sleep(0.1)
    stop_process(proc)
    raise RuntimeError(f"{cmd[0]} did not start; log:\n{log.read_text(errors='replace')[-3000:]}")


def stop_process(proc: subprocess.Popen) -> None:
    """Stop one process we started, by its pid."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    log = getattr(proc, "_wids_log", None)
    if log is not None:
        log.close()


class S3Server:
    """moto_server; objects live in bucket ``wids-test``."""

    protocol = "s3"

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.bucket = BUCKET
        self.storage_options: dict[str, Any] = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }
        import fsspec

        self.fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options)
        # s3fs.mkdir sends a LocationConstraint, which us-east-1 rejects
        self.fs.call_s3("create_bucket", Bucket=self.bucket)

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"

    def put(self, local_path: str | os.PathLike[str], name: str) -> str:
        self.fs.put_file(str(local_path), f"{self.bucket}/{name}")
        self.fs.invalidate_cache()
        return self.url(name)

    def put_bytes(self, data: bytes, name: str) -> str:
        self.fs.pipe_file(f"{self.bucket}/{name}", data)
        self.fs.invalidate_cache()
        return self.url(name)


class HttpServer:
    """nginx serving ``root``; ``/forbidden/*`` answers 403; requests counted per object."""

    protocol = "http"

    def __init__(self, port: int, root: Path, access_log: Path) -> None:
        self.port = port
        self.root = root
        self.access_log = access_log
        self.base = f"http://127.0.0.1:{port}"
        self.storage_options: dict[str, Any] = {}
        import fsspec

        self.fs = fsspec.filesystem("http", skip_instance_cache=True)

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def path(self, name: str) -> Path:
        """The file behind object ``name`` (writable: tests may replace it)."""
        return self.root / name

    def put(self, local_path: str | os.PathLike[str], name: str) -> str:
        dest = self.path(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".uploading")
        shutil.copyfile(local_path, tmp)
        os.replace(tmp, dest)
        return self.url(name)

    def put_bytes(self, data: bytes, name: str) -> str:
        dest = self.path(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".uploading")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return self.url(name)

    def _uris(self) -> list[str]:
        if not self.access_log.exists():
            return []
        lines = self.access_log.read_text(errors="replace").splitlines()
        return [line.split(" ", 1)[0] for line in lines if line]

    def request_count(self, name: str | None = None) -> int:
        """Requests logged since the last reset, for object ``name`` or in total."""
        uris = self._uris()
        if name is None:
            return len(uris)
        want = "/" + name.lstrip("/")
        return sum(1 for u in uris if u == want)

    def reset_counts(self) -> None:
        # nginx keeps its log open in append mode: truncating in place is safe.
        with open(self.access_log, "r+b") as f:
            f.truncate(0)


class GcsServer:
    """gcp-storage-emulator (in memory); objects live in bucket ``wids-test``."""

    protocol = "gs"

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.bucket = BUCKET
        self.storage_options: dict[str, Any] = {
            "endpoint_url": self.endpoint,
            "token": "anon",
            "project": "test",
        }
        import fsspec

        self.fs = fsspec.filesystem("gs", skip_instance_cache=True, **self.storage_options)
        self.fs.mkdir(self.bucket)

    def url(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def put(self, local_path: str | os.PathLike[str], name: str) -> str:
        self.fs.put_file(str(local_path), f"{self.bucket}/{name}")
        self.fs.invalidate_cache()
        return self.url(name)

    def put_bytes(self, data: bytes, name: str) -> str:
        self.fs.pipe_file(f"{self.bucket}/{name}", data)
        self.fs.invalidate_cache()
        return self.url(name)


def _bin(name: str) -> str:
    """A console script of this Python environment (or from PATH)."""
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else (shutil.which(name) or name)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("moto")
    port = free_port()
    proc = start_process(
        [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        f"http://127.0.0.1:{port}/moto-api/",
        work / "moto.log",
    )
    try:
        yield S3Server(port)
    finally:
        stop_process(proc)


_NGINX_CONF = """\
{user}
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {work}/client_temp;
    proxy_temp_path {work}/proxy_temp;
    fastcgi_temp_path {work}/fastcgi_temp;
    uwsgi_temp_path {work}/uwsgi_temp;
    scgi_temp_path {work}/scgi_temp;
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 100000;
    log_format counts '$uri $status $request_method "$http_range" $body_bytes_sent';
    server {{
        listen 127.0.0.1:{port};
        root {root};
        access_log {work}/access.log counts;
        location /forbidden/ {{ return 403; }}
        location / {{ }}
    }}
}}
"""


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("nginx")
    root = tmp_path_factory.mktemp("www")
    port = free_port()
    user = "user root;" if os.geteuid() == 0 else ""
    conf = work / "nginx.conf"
    conf.write_text(_NGINX_CONF.format(user=user, work=work, port=port, root=root))
    proc = start_process(
        [NGINX, "-c", str(conf), "-p", str(work)], f"http://127.0.0.1:{port}/", work / "out.log"
    )
    try:
        server = HttpServer(port, root, work / "access.log")
        server.reset_counts()
        yield server
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("gcs")
    port = free_port()
    proc = start_process(
        [
            _bin("gcp-storage-emulator"),
            "start",
            "--host=127.0.0.1",
            f"--port={port}",
            "--in-memory",
        ],
        f"http://127.0.0.1:{port}/",
        work / "gcs.log",
        cwd=work,
    )
    try:
        yield GcsServer(port)
    finally:
        stop_process(proc)


@pytest.fixture(scope="session", params=["s3", "http", "gcs"])
def remote_server(request: pytest.FixtureRequest):
    """Each real server in turn (S3, HTTP, GCS)."""
    return request.getfixturevalue(f"{request.param}_server")
