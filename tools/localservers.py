"""Storage servers on 127.0.0.1 for the tools (demo, benchmarks, soak): nginx and moto_server.

Each server is a process we start on a free port, wait for, and stop by its pid. Nothing here
talks to any address but 127.0.0.1.

Example:
    server = Nginx("/data/shards")
    try:
        print(server.base)           # http://127.0.0.1:PORT
        ...
        print(server.counts())       # (requests, body bytes) from its access log
    finally:
        server.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["Moto", "Nginx", "free_port", "which"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def which(name: str, *extra: str) -> str | None:
    """An executable next to this Python, on PATH, or at one of ``extra``."""
    here = Path(sys.executable).with_name(name)
    if here.exists():
        return str(here)
    return shutil.which(name) or next((p for p in extra if os.path.exists(p)), None)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - 127.0.0.1 only
            r.read()
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer: the server is up
    except OSError:
        return False


class _Server:
    """A server process we started: waited for, and stopped by its pid."""

    kind = "local"

    def __init__(self, cmd: list[str], probe: str, work: Path, log_name: str) -> None:
        self.storage_options: dict[str, Any] = {}
        self.work = work
        log = work / log_name
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not _answers(probe):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = log.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{cmd[0]} did not start:\n{tail}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the process (by pid) and remove the server's own work directory."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        if self._own_work:
            shutil.rmtree(self.work, ignore_errors=True)

    _own_work = False


_NGINX_CONF = """\
{user}
daemon off;
worker_processes 2;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {work}/client_temp;
    proxy_temp_path {work}/proxy_temp;
    fastcgi_temp_path {work}/fastcgi_temp;
    uwsgi_temp_path {work}/uwsgi_temp;
    scgi_temp_path {work}/scgi_temp;
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 1000000;
    log_format counts '$uri $status $body_bytes_sent';
    {zone}
    server {{
        listen 127.0.0.1:{port};
        root {root};
        access_log {work}/access.log counts;
        location / {{ {limit} }}
    }}
}}
"""


class Nginx(_Server):
    """nginx serving ``root`` over HTTP (it honours Range), counting requests in its log.

    Args:
        root: Directory to serve.
        work: Directory for its config, logs and temp files (default: a new temp dir,
            removed by :meth:`stop`).
        pace: If > 0, limit to this many requests per second (a slow store).
    """

    kind = "http"

    def __init__(self, root: str | Path, work: str | Path | None = None, pace: int = 0) -> None:
        exe = which("nginx", "/usr/sbin/nginx")
        if exe is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        self._own_work = work is None
        wdir = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="wids-nginx-"))
        wdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.root = Path(root)
        user = "user root;" if os.geteuid() == 0 else ""  # else workers can't read mkdtemp dirs
        zone = f"limit_req_zone $server_name zone=pace:1m rate={pace}r/s;" if pace else ""
        limit = "limit_req zone=pace burst=1000000;" if pace else ""
        conf = wdir / "nginx.conf"
        conf.write_text(
            _NGINX_CONF.format(
                user=user, work=wdir, port=self.port, root=root, zone=zone, limit=limit
            )
        )
        self.base = f"http://127.0.0.1:{self.port}"
        super().__init__([exe, "-c", str(conf), "-p", str(wdir)], self.base + "/", wdir, "out.log")

    def url(self, path: str | Path) -> str:
        """URL of a file under ``root`` (a path inside it, or a name relative to it)."""
        p = Path(path)
        rel = p.relative_to(self.root) if p.is_absolute() else p
        return f"{self.base}/{rel.as_posix()}"

    def counts(self) -> tuple[int, int]:
        """(requests, body bytes) since the last :meth:`reset`."""
        n = total = 0
        log = self.work / "access.log"
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                n += 1
                total += int(line.rsplit(" ", 1)[-1])
        return n, total

    def requests(self) -> int:
        """Requests since the last :meth:`reset`."""
        return self.counts()[0]

    def reset(self) -> None:
        """Start counting afresh."""
        with open(self.work / "access.log", "a+b") as f:
            f.truncate(0)


class Moto(_Server):
    """moto_server: a local S3 with one bucket.

    Args:
        bucket: Bucket to create.
        work: Directory for its log (default: a new temp dir, removed by :meth:`stop`).
    """

    kind = "s3"

    def __init__(self, bucket: str = "wids", work: str | Path | None = None) -> None:
        exe = which("moto_server")
        if exe is None:
            raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
        self._own_work = work is None
        wdir = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="wids-moto-"))
        wdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.bucket = bucket
        endpoint = f"http://127.0.0.1:{self.port}"
        cmd = [exe, "-H", "127.0.0.1", "-p", str(self.port)]
        super().__init__(cmd, endpoint + "/moto-api/", wdir, "moto.log")
        self.storage_options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        try:
            import fsspec

            self.fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options)
            self.fs.call_s3("create_bucket", Bucket=bucket)
        except BaseException:
            self.stop()
            raise

    def upload(self, path: str | Path) -> str:
        """Put a local file into the bucket under its basename; return its s3:// URL."""
        name = Path(path).name
        self.fs.put_file(str(path), f"{self.bucket}/{name}")
        return f"s3://{self.bucket}/{name}"
