"""Real storage servers on 127.0.0.1 for the test suite: S3 (moto), HTTP (nginx), GCS (emulator).

The servers themselves are started by ``tools/localservers.py``; this module holds the fixtures.

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
one object, or all) and ``.reset_counts()``; ``/forbidden/...`` always answers 403;
``/noetag/NAME`` serves ``NAME`` with no ``ETag`` header.

Tests that use a server are marked ``servers`` automatically (deselect with
``-m "not servers"``); marking them explicitly as well does no harm.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultproxy import fault_proxy

# gcsfs probes the bucket type over gRPC (and hangs ~60 s against the emulator) unless this is
# off; it must be set before gcsfs is first imported, hence at import of this module.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from localservers import GcsEmulator, Moto, Nginx, free_port  # noqa: E402

__all__ = [
    "GcsServer",
    "HttpServer",
    "S3Server",
    "fault_proxy",
    "free_port",
    "python_http_server",
    "gcs_server",
    "http_server",
    "https_server",
    "pytest_collection_modifyitems",
    "remote_server",
    "s3_server",
]

SERVER_FIXTURES = {
    "s3_server",
    "http_server",
    "https_server",
    "gcs_server",
    "remote_server",
    "fault_proxy",
}
BUCKET = "wids-test"

S3Server = Moto
GcsServer = GcsEmulator


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Mark every test that uses a server fixture with ``servers``."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)


class HttpServer(Nginx):
    """nginx serving ``root``; ``/forbidden/*`` answers 403; requests counted per object."""

    def request_count(self, name: str | None = None) -> int:
        """Requests logged since the last reset, for object ``name`` or in total."""
        return self.requests(name)

    def reset_counts(self) -> None:
        """Start counting afresh."""
        self.reset()


def _serving(server: Any) -> Iterator[Any]:
    """Yield ``server``; stop it afterwards."""
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    yield from _serving(S3Server(BUCKET, tmp_path_factory.mktemp("moto")))


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("nginx")
    server = HttpServer(tmp_path_factory.mktemp("www"), work, workers=1)
    server.reset_counts()
    yield from _serving(server)


@pytest.fixture(scope="session")
def https_server(tmp_path_factory: pytest.TempPathFactory):
    """nginx over https: a certificate for 127.0.0.1 from a test CA (``.cafile``) no client
    trusts unless told (``SSL_CERT_FILE``)."""
    work = tmp_path_factory.mktemp("nginx-tls")
    server = HttpServer(tmp_path_factory.mktemp("www-tls"), work, workers=1, tls=True)
    server.reset_counts()
    yield from _serving(server)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory):
    yield from _serving(GcsServer(BUCKET, tmp_path_factory.mktemp("gcs")))


@pytest.fixture(scope="session", params=["s3", "http", "gcs"])
def remote_server(request: pytest.FixtureRequest):
    """Each real server in turn (S3, HTTP, GCS)."""
    return request.getfixturevalue(f"{request.param}_server")


@contextlib.contextmanager
def python_http_server(folder: Path | str) -> Iterator[str]:
    """``python -m http.server`` over ``folder`` (what tutorials start): it ignores ``Range``
    (200 and the whole file) and answers a folder with a directory page. Yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)
