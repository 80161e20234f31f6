"""wids.storage uses other libraries through their public seams only (STYLE rule 14).

No private attribute of fsspec, s3fs, gcsfs, aiohttp or asyncio: every ``x._name`` that
``wids/storage`` reads or writes is a name wids itself defines, and a list of private names
that were used once (and broke when those libraries changed) never comes back anywhere in
``wids/``. The behaviour these private attributes bought is held by behaviour tests: a forked
child leaves the parent's connections alone (``tests/test_storage_forks.py``), and one retry
layer per request (below).
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from wids import RetryPolicy
from wids.errors import RetriesExhaustedError
from wids.storage import Store

WIDS = Path(__file__).resolve().parents[1] / "wids"

NEVER = {
    "_call_s3",  # s3fs: its own retry loop inside ours
    "_cat_file",  # fsspec/gcsfs: gcsfs's retries inside ours
    "_info",
    "_set_session",
    "_closed",  # asyncio loop internals patched in a forked child
    "_thread_id",
    "_connector",  # aiohttp
    "_get_headers",  # gcsfs
    "_strip_protocol",  # fsspec
}


def _trees(folder: Path) -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted(folder.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _defined_names() -> set[str]:
    """Every name wids defines: functions, classes, assigned names and attributes, slots."""
    names: set[str] = set()
    for _, tree in _trees(WIDS):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("_") and node.value.isidentifier():
                    names.add(node.value)  # __slots__ entries, state keys
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _private_uses(folder: Path) -> Iterator[tuple[str, int, str]]:
    for path, tree in _trees(folder):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attr = node.attr
                mine = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if attr.startswith("_") and not attr.startswith("__") and not mine:
                    yield f"{path.relative_to(WIDS.parent)}", node.lineno, attr


def test_storage_reads_no_private_attribute_it_does_not_define() -> None:
    ours = _defined_names()
    foreign = [use for use in _private_uses(WIDS / "storage") if use[2] not in ours]
    assert not foreign, f"private attributes of other libraries: {foreign}"


def test_private_names_once_used_never_return() -> None:
    found = [use for use in _private_uses(WIDS) if use[2] in NEVER or use[2].startswith("_wids")]
    assert not found, f"private attributes of other libraries: {found}"


class _Unavailable(BaseHTTPRequestHandler):
    """Answers every request 503 and counts them."""

    count = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).count += 1
        body = b'{"error": {"code": 503, "message": "unavailable"}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unavailable() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Unavailable.count = 0
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_gcs_makes_one_request_per_attempt(unavailable: str, monkeypatch: pytest.MonkeyPatch):
    """gcsfs retried 6 times (with the global ``random`` state) inside each of wids's attempts."""
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    pytest.importorskip("gcsfs")
    options = {"endpoint_url": unavailable, "token": "anon", "project": "test"}
    policy = RetryPolicy(attempts=3, backoff=0.0, max_backoff=0.0, timeout=10.0, max_time=60.0)
    src = Store(options, policy).source("gs://wids-test/x.tar", size=1000)
    with pytest.raises(RetriesExhaustedError):
        src.read_range(0, 10)
    assert _Unavailable.count == 3
