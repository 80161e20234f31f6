"""Storage servers on 127.0.0.1 for the tools and the tests: nginx, moto_server, GCS emulator.

Each server is a process we start on a free port, wait for, and stop by its pid. Nothing here
talks to any address but 127.0.0.1. Every server has the same small interface:

- ``.protocol``: ``"http"``, ``"s3"`` or ``"gs"``
- ``.storage_options``: the dict to hand to fsspec / wids
- ``.url(name)``: the full URL of object ``name``
- ``.put(local_path, name)``, ``.put_bytes(data, name)``: upload; return the URL
- ``.fs``: an fsspec filesystem for it
- ``.stop()``: stop the process

nginx also counts requests from its access log (:meth:`Nginx.counts`, :meth:`Nginx.requests`,
:meth:`Nginx.reset`).

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

import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["GcsEmulator", "Moto", "Nginx", "free_port", "which"]


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


def _answers(url: str, cafile: str | None = None) -> bool:
    import ssl

    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as r:  # noqa: S310
            r.read()
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer: the server is up
    except OSError:
        return False


class _Server:
    """A server process we started: waited for, and stopped by its pid."""

    protocol = "local"
    _own_work = False
    cafile: str | None = None  # the certificate a TLS server's clients must trust

    def __init__(self, cmd: list[str], probe: str, work: Path, log_name: str, **kw: Any) -> None:
        self.storage_options: dict[str, Any] = {}
        self.work = work
        log = work / log_name
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, **kw)
        deadline = time.monotonic() + 60
        while not _answers(probe, self.cafile):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = log.read_text(errors="replace")[-3000:]
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


def _workdir(work: str | Path | None, prefix: str) -> tuple[Path, bool]:
    """``work`` (created if missing), or a new temp dir; and whether it is ours to remove."""
    wdir = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix=prefix))
    wdir.mkdir(parents=True, exist_ok=True)
    return wdir, work is None


class _Bucket(_Server):
    """A server holding objects in one bucket, reached through an fsspec filesystem ``fs``."""

    bucket: str
    fs: Any

    def _open_bucket(self, create: Callable[[], None]) -> None:
        try:
            import fsspec

            self.fs = fsspec.filesystem(
                self.protocol, skip_instance_cache=True, **self.storage_options
            )
            create()
        except BaseException:
            self.stop()
            raise

    def url(self, name: str) -> str:
        """URL of object ``name`` in the bucket."""
        return f"{self.protocol}://{self.bucket}/{name}"

    def put(self, local_path: str | os.PathLike[str], name: str) -> str:
        """Upload a local file as object ``name``; return its URL."""
        self.fs.put_file(str(local_path), f"{self.bucket}/{name}")
        self.fs.invalidate_cache()
        return self.url(name)

    def put_bytes(self, data: bytes, name: str) -> str:
        """Store ``data`` as object ``name``; return its URL."""
        self.fs.pipe_file(f"{self.bucket}/{name}", data)
        self.fs.invalidate_cache()
        return self.url(name)


_NGINX_CONF = """\
{user}
daemon off;
worker_processes {workers};
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
    log_format counts '$uri $status $request_method "$http_range" $body_bytes_sent';
    {zone}
    server {{
        listen 127.0.0.1:{port}{tls};
        root {root};
        access_log {work}/access.log counts;
        location /forbidden/ {{ return 403; }}
        location /noetag/ {{ alias {root}/; etag off; {limit} }}
        location / {{ {limit} }}
    }}
}}
"""


def _self_signed(wdir: Path) -> str:
    """A test CA and a certificate for 127.0.0.1 it signed (``cert.pem``, ``key.pem`` in
    ``wdir``); returns the CA's file. (Rust clients refuse a self-signed CA as the server's.)
    """
    exe = which("openssl", "/usr/bin/openssl")
    if exe is None:
        raise RuntimeError("openssl is not installed (apt-get install openssl)")
    ca, ext = wdir / "ca.pem", wdir / "leaf.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    for args in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=wids-ca"]
        + ["-keyout", f"{wdir}/ca.key", "-out", str(ca)],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"]
        + ["-keyout", f"{wdir}/key.pem", "-out", f"{wdir}/leaf.csr"],
        ["x509", "-req", "-in", f"{wdir}/leaf.csr", "-CA", str(ca), "-CAkey", f"{wdir}/ca.key"]
        + ["-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", f"{wdir}/cert.pem"],
    ):
        subprocess.run([exe, *args], check=True, capture_output=True)
    return str(ca)


class Nginx(_Server):
    """nginx serving ``root`` over HTTP (it honours Range), counting requests in its log.

    ``/forbidden/...`` always answers 403; ``/noetag/NAME`` serves ``NAME`` without an ``ETag``
    header (Last-Modified only), as some servers do. Each access-log line reads
    ``URI STATUS METHOD "RANGE" BODY_BYTES``.

    Args:
        root: Directory to serve.
        work: Directory for its config, logs and temp files (default: a new temp dir,
            removed by :meth:`stop`).
        pace: If > 0, limit to this many requests per second (a slow store).
        workers: nginx worker processes.
        tls: Serve ``https://`` with a certificate for 127.0.0.1 from a test CA made by
            ``openssl`` (the CA's file is :attr:`cafile`: trust it, e.g. ``SSL_CERT_FILE``).
    """

    protocol = "http"

    def __init__(
        self,
        root: str | Path,
        work: str | Path | None = None,
        pace: int = 0,
        workers: int = 2,
        tls: bool = False,
    ) -> None:
        exe = which("nginx", "/usr/sbin/nginx")
        if exe is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        wdir, self._own_work = _workdir(work, "wids-nginx-")
        self.port = free_port()
        self.root = Path(root)
        user = "user root;" if os.geteuid() == 0 else ""  # else workers can't read mkdtemp dirs
        # the key must not be empty ($server_name is, here): empty keys are not limited
        zone = f"limit_req_zone $server_addr zone=pace:1m rate={pace}r/s;" if pace else ""
        limit = "limit_req zone=pace burst=1000000;" if pace else ""
        tls_conf = ""
        if tls:
            self.cafile = _self_signed(wdir)
            cert, key = wdir / "cert.pem", wdir / "key.pem"
            tls_conf = f" ssl; ssl_certificate {cert}; ssl_certificate_key {key}"
        conf = wdir / "nginx.conf"
        conf.write_text(
            _NGINX_CONF.format(
                user=user,
                workers=workers,
                work=wdir,
                port=self.port,
                tls=tls_conf,
                root=root,
                zone=zone,
                limit=limit,
            )
        )
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        super().__init__([exe, "-c", str(conf), "-p", str(wdir)], self.base + "/", wdir, "out.log")

    @property
    def access_log(self) -> Path:
        """nginx's access log (one line per request, see the class docstring)."""
        return self.work / "access.log"

    @functools.cached_property
    def fs(self) -> Any:
        """An fsspec HTTP filesystem (needs aiohttp)."""
        import fsspec

        return fsspec.filesystem("http", skip_instance_cache=True)

    def url(self, path: str | Path) -> str:
        """URL of a file under ``root`` (a path inside it, or a name relative to it)."""
        p = Path(path)
        rel = p.relative_to(self.root) if p.is_absolute() else p
        return f"{self.base}/{rel.as_posix()}"

    def path(self, name: str) -> Path:
        """The file behind object ``name`` (writable: callers may replace it)."""
        return self.root / name

    def put(self, local_path: str | os.PathLike[str], name: str) -> str:
        """Copy a local file under ``root`` as ``name`` (atomically); return its URL."""
        dest = self.path(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".uploading")
        shutil.copyfile(local_path, tmp)
        os.replace(tmp, dest)
        return self.url(name)

    def put_bytes(self, data: bytes, name: str) -> str:
        """Write ``data`` under ``root`` as ``name`` (atomically); return its URL."""
        dest = self.path(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".uploading")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return self.url(name)

    def _lines(self) -> list[str]:
        if not self.access_log.exists():
            return []
        _settled(self.access_log)
        return [ln for ln in self.access_log.read_text(errors="replace").splitlines() if ln]

    def counts(self) -> tuple[int, int]:
        """(requests, body bytes) since the last :meth:`reset`."""
        lines = self._lines()
        return len(lines), sum(int(line.rsplit(" ", 1)[-1]) for line in lines)

    def requests(self, name: str | None = None) -> int:
        """Requests since the last :meth:`reset`, for object ``name`` or in total."""
        lines = self._lines()
        if name is None:
            return len(lines)
        want = "/" + name.lstrip("/")
        return sum(1 for line in lines if line.split(" ", 1)[0] == want)

    def reset(self) -> None:
        """Start counting afresh."""
        # nginx keeps its log open in append mode: truncating in place is safe. It writes a
        # request's line after the answer is sent, so a client may hold a whole answer before
        # its line is there: wait for the log to settle, or that line lands after the reset.
        if self.access_log.exists():
            _settled(self.access_log)
        with open(self.access_log, "a+b") as f:
            f.truncate(0)


def _settled(path: Path, quiet: float = 0.02, limit: float = 1.0) -> None:
    """Wait until ``path`` has not grown for ``quiet`` seconds (at most ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    size = path.stat().st_size
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = path.stat().st_size
        if now == size:
            return
        size = now


class Moto(_Bucket):
    """moto_server: a local S3 with one bucket.

    Args:
        bucket: Bucket to create.
        work: Directory for its log (default: a new temp dir, removed by :meth:`stop`).
    """

    protocol = "s3"

    def __init__(self, bucket: str = "wids", work: str | Path | None = None) -> None:
        exe = which("moto_server")
        if exe is None:
            raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
        wdir, self._own_work = _workdir(work, "wids-moto-")
        self.port = free_port()
        self.bucket = bucket
        self.endpoint = f"http://127.0.0.1:{self.port}"
        cmd = [exe, "-H", "127.0.0.1", "-p", str(self.port)]
        super().__init__(cmd, self.endpoint + "/moto-api/", wdir, "moto.log")
        self.storage_options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }
        # s3fs.mkdir sends a LocationConstraint, which us-east-1 rejects
        self._open_bucket(lambda: self.fs.call_s3("create_bucket", Bucket=bucket))

    def upload(self, path: str | Path) -> str:
        """Put a local file into the bucket under its basename; return its s3:// URL."""
        return self.put(path, Path(path).name)


class GcsEmulator(_Bucket):
    """gcp-storage-emulator (in memory): a local GCS with one bucket.

    gcsfs reads ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` when it is first imported; unless it is
    ``false`` then, gcsfs probes the bucket type over gRPC and hangs ~60 s against the emulator.
    This class sets it (if unset) before it imports gcsfs; a process that imports gcsfs earlier
    must set it itself.

    Args:
        bucket: Bucket to create.
        work: Directory for its log, and its working directory (default: a new temp dir,
            removed by :meth:`stop`).
    """

    protocol = "gs"

    def __init__(self, bucket: str = "wids", work: str | Path | None = None) -> None:
        exe = which("gcp-storage-emulator")
        if exe is None:
            raise RuntimeError("gcp-storage-emulator is not installed (pip install it)")
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        wdir, self._own_work = _workdir(work, "wids-gcs-")
        self.port = free_port()
        self.bucket = bucket
        self.endpoint = f"http://127.0.0.1:{self.port}"
        cmd = [exe, "start", "--host=127.0.0.1", f"--port={self.port}", "--in-memory"]
        super().__init__(cmd, self.endpoint + "/", wdir, "gcs.log", cwd=wdir)
        self.storage_options = {"endpoint_url": self.endpoint, "token": "anon", "project": "test"}
        self._open_bucket(lambda: self.fs.mkdir(bucket))
