"""Background fetches and promotion into the cache (``wids.cache.promote``)."""

from __future__ import annotations

import hashlib
import random
import threading
import time

import fsspec

from wids.cache import Promoter, ShardCache
from wids.cache.promote import BackgroundFetches
from wids.index import Fingerprint
from wids.storage import Source


def blob(n: int, seed: int = 0) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (n // 32) + b"x" * (n % 32)


def test_background_fetches_run_one_job_per_url_and_close_waits():
    pool = BackgroundFetches(thread_name_prefix="wids-test")
    release = threading.Event()
    ran: list[str] = []

    def job(name: str):
        def run() -> None:
            release.wait(10)
            ran.append(name)

        return run

    first = pool.submit("s3://b/a.tar", job("a1"))
    assert pool.submit("s3://b/a.tar", job("a2")) is first  # running: the same fetch
    other = pool.submit("s3://b/b.tar", job("b"))
    assert other is not first
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("wids-test") for n in names)
    release.set()
    pool.close()  # waits for the running jobs
    assert first.done() and other.done() and sorted(ran) == ["a1", "b"]
    assert not any(t.name.startswith("wids-test") for t in threading.enumerate())
    again = pool.submit("s3://b/a.tar", job("a3"))  # done before: a new fetch, a new pool
    again.result(10)
    assert ran[-1] == "a3"
    pool.close()


def test_promoter_share_wait_failure_and_backoff(tmp_path):
    fs = fsspec.filesystem("memory")
    data = blob(10_000, 7)
    fs.pipe_file("/wids-promote/a.tar", data)
    src = Source("memory://wids-promote/a.tar")
    cache = ShardCache(tmp_path)
    promoter = Promoter(cache, share=0.1, wait=True, focus=0.0)
    promoter.requested(src, 500, shard_bytes=10_000, expected=Fingerprint(10_000))
    assert promoter.open_if_ready(src.url) is None  # below the share: nothing started
    promoter.requested(src, 500, shard_bytes=10_000, expected=Fingerprint(10_000))  # 10 %: promote
    with promoter.open_if_ready(
        src.url, expected=Fingerprint(10_000)
    ) as shard:  # waits for the fetch
        assert shard.read_range(0, 10_000) == data
    # Evicted later: promoting again needs twice the share.
    assert cache.remove(src.url)
    promoter.requested(src, 1500, shard_bytes=10_000, expected=Fingerprint(10_000))
    assert promoter.open_if_ready(src.url) is None
    promoter.requested(src, 500, shard_bytes=10_000, expected=Fingerprint(10_000))
    again = promoter.open_if_ready(src.url)
    assert again is not None
    again.close()
    # A fetch that fails leaves the shard on range requests, for good.
    missing = Source("memory://wids-promote/missing.tar")
    promoter.requested(missing, 10_000, shard_bytes=10_000)
    assert promoter.open_if_ready(missing.url) is None
    promoter.requested(missing, 10_000, shard_bytes=10_000)
    assert missing.url not in promoter._futures
    # Larger than the budget: never promoted.
    small = Promoter(ShardCache(tmp_path / "small", max_bytes=100), share=0.0)
    small.requested(src, 1, shard_bytes=10_000, expected=Fingerprint(10_000))
    assert src.url not in small._futures
    promoter.close()
    fs.rm("/wids-promote", recursive=True)


def _sources(fs, n, size):
    out = []
    for k in range(n):
        fs.pipe_file(f"/wids-focus/s{k}.tar", blob(size, k))
        out.append(Source(f"memory://wids-focus/s{k}.tar"))
    return out


def test_promoter_random_traffic_over_many_shards_is_never_promoted(tmp_path):
    fs = fsspec.filesystem("memory")
    srcs = _sources(fs, 16, 10_000)
    promoter = Promoter(ShardCache(tmp_path), share=0.05)
    rng = random.Random(0)
    for _ in range(2000):  # each shard gets far more than its 5 % share, but spread out
        promoter.requested(rng.choice(srcs), 200, shard_bytes=10_000)
    assert promoter._futures == {}
    # one shard read in a row (a chunked order): promoted after its share
    for _ in range(100):
        promoter.requested(srcs[3], 200, shard_bytes=10_000)
    assert list(promoter._futures) == [srcs[3].url]
    promoter.close()
    fs.rm("/wids-focus", recursive=True)


def test_promoter_planned_starts_at_once_and_later_reads_of_promoted_shards_wait(tmp_path):
    fs = fsspec.filesystem("memory")
    planned, read = _sources(fs, 2, 10_000)
    cache = ShardCache(tmp_path)
    promoter = Promoter(cache, share=0.05, focus=0.0)
    assert not promoter.planned(planned, 0.3, shard_bytes=10_000)  # a plan reading 30 %: no
    assert not promoter.fetching(planned.url)
    gate = threading.Event()
    cache._background.submit("blocker-1", lambda: gate.wait(10))
    cache._background.submit("blocker-2", lambda: gate.wait(10))  # both fetch threads busy
    assert promoter.planned(planned, 0.9, shard_bytes=10_000, expected=Fingerprint(10_000))
    promoter.requested(read, 10_000, shard_bytes=10_000, expected=Fingerprint(10_000))
    assert promoter.fetching(planned.url) and promoter.fetching(read.url)
    threading.Timer(0.3, gate.set).start()
    t0 = time.monotonic()
    with promoter.open_if_ready(planned.url, expected=Fingerprint(10_000)) as shard:
        assert time.monotonic() - t0 >= 0.2  # waited for the download the plan started
        assert shard.read_range(0, 10) == blob(10_000, 0)[:10]
    # promoted on the reads' evidence: the batch that gave it went by range; later reads wait
    # for the download instead of requesting the shard a second time
    with promoter.open_if_ready(read.url, expected=Fingerprint(10_000)) as shard:
        assert shard.read_range(0, 10) == blob(10_000, 1)[:10]
    promoter.close()
    fs.rm("/wids-focus", recursive=True)


def test_promoter_wait_all_has_every_started_promotion_close_cancels_queued_ones(tmp_path):
    fs = fsspec.filesystem("memory")
    srcs = _sources(fs, 3, 10_000)
    cache = ShardCache(tmp_path)
    promoter = Promoter(cache, share=0.05, focus=0.0)
    gate = threading.Event()
    cache._background.submit("blocker-1", lambda: gate.wait(10))
    cache._background.submit("blocker-2", lambda: gate.wait(10))  # the promotions queue up
    for src in srcs:
        promoter.requested(src, 10_000, shard_bytes=10_000)
    assert not promoter.wait_all(timeout=0.1)  # queued behind the blockers
    gate.set()
    assert promoter.wait_all(timeout=30)
    assert all(promoter.open_if_ready(s.url) is not None for s in srcs)
    promoter.close()
    # close() alone cancels promotions still queued: what wait_all() is for
    gate2 = threading.Event()
    cache2 = ShardCache(tmp_path / "second")
    second = Promoter(cache2, share=0.05, focus=0.0)
    cache2._background.submit("blocker-1", lambda: gate2.wait(10))
    cache2._background.submit("blocker-2", lambda: gate2.wait(10))
    second.requested(srcs[0], 10_000, shard_bytes=10_000)
    threading.Timer(0.2, gate2.set).start()
    second.close()
    assert [e.url for e in cache2.entries()] == []
    fs.rm("/wids-focus", recursive=True)


def test_a_plan_beyond_the_share_is_deferred_then_fetched_as_room_frees_or_reads_begin(tmp_path):
    """A plan announcing a whole epoch: shards beyond this process's share of the budget were
    read by range (prefetched, then their first batches) and downloaded whole as well. They
    are now deferred (``planned`` says they are fetched whole, so nothing reads them by range),
    fetched in the plan's order as a copy fetched ahead is opened, or at once when their reads
    begin; one another process fetched (read from the cache) is never fetched here."""
    fs = fsspec.filesystem("memory")
    srcs = _sources(fs, 6, 10_000)
    cache = ShardCache(tmp_path, max_bytes=100_000)  # 10 shards; at most 3 fetched ahead
    promoter = Promoter(cache, share=0.05)
    fp = Fingerprint(10_000)
    assert all(promoter.planned(s, 1.0, shard_bytes=10_000, expected=fp) for s in srcs)
    assert [promoter.fetching(s.url) for s in srcs] == [True] * 3 + [False] * 3
    assert promoter.wait_all(30)
    assert [cache.contains(s.url) for s in srcs] == [True] * 3 + [False] * 3
    with promoter.open_if_ready(srcs[0].url, expected=fp) as shard:  # its room is free again
        assert shard.read_range(0, 10) == blob(10_000, 0)[:10]
    assert promoter.fetching(srcs[3].url) and not promoter.fetching(srcs[4].url)
    promoter.reading(srcs[5].url)  # its reads begin: fetched now, out of the plan's order
    assert promoter.fetching(srcs[5].url)
    promoter.reading(srcs[4].url, cached=True)  # read from another process's copy
    assert promoter.wait_all(30)
    for k in (1, 2, 3):  # each opening frees room; nothing is left deferred to fetch
        with promoter.open_if_ready(srcs[k].url, expected=fp):
            pass
    assert not promoter.fetching(srcs[4].url) and not cache.contains(srcs[4].url)
    with promoter.open_if_ready(srcs[5].url, expected=fp) as shard:
        assert shard.read_range(0, 10) == blob(10_000, 5)[:10]
    promoter.close()
    fs.rm("/wids-focus", recursive=True)


class _Stalling:
    """A Range-honouring HTTP server on 127.0.0.1 whose GETs wait while ``stall`` is set."""

    def __init__(self, data: bytes) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.data, self.stall, self.gets = data, threading.Event(), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                self._head(200, len(outer.data))

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.gets += 1
                deadline = time.monotonic() + 60
                while outer.stall.is_set() and time.monotonic() < deadline:
                    time.sleep(0.02)
                spec = self.headers.get("Range")
                first, last = 0, len(outer.data) - 1
                if spec:
                    a, _, b = spec.split("=", 1)[1].partition("-")
                    first, last = int(a), min(int(b or last), last)
                part = outer.data[first : last + 1]
                self._head(206 if spec else 200, len(part), (first, last) if spec else None)
                self.wfile.write(part)

            def _head(self, status: int, length: int, span: tuple[int, int] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(length))
                self.send_header("ETag", '"v1"')
                if span is not None:
                    self.send_header(
                        "Content-Range", f"bytes {span[0]}-{span[1]}/{len(outer.data)}"
                    )
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/shard.tar"

    def close(self) -> None:
        self.stall.clear()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_planned_shard_whose_downloader_process_is_killed_is_not_waited_for_long(tmp_path):
    """A plan's first reads wait for the shard's download. When another process is the one
    downloading it and is killed (SIGKILL, mid-download), its lock goes with it: this
    process's fetch takes over at once, the wait ends with the right bytes (not after
    lock_timeout), and the killed download's temporary file does not stay in the cache."""
    import os
    import signal
    import subprocess
    import sys

    data = blob(300_000, 5)
    server = _Stalling(data)
    server.stall.set()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from wids.cache import ShardCache; from wids.storage import Source;"
            "from wids.index import Fingerprint;"
            "n = Fingerprint(int(sys.argv[3]));"
            "ShardCache(sys.argv[1]).open(Source(sys.argv[2]), expected=n)",
            str(tmp_path),
            server.url,
            str(len(data)),
        ],
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 30
        while server.gets == 0 and time.monotonic() < deadline:  # the child is downloading
            time.sleep(0.05)
        assert server.gets > 0
        time.sleep(0.3)
        cache = ShardCache(tmp_path)  # lock_timeout: 600 s
        promoter = Promoter(cache, share=0.05, focus=0.0)
        src = Source(server.url)
        assert promoter.planned(src, 0.9, shard_bytes=len(data), expected=Fingerprint(len(data)))
        time.sleep(0.5)  # this process's fetch waits for the child's lock
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        server.stall.clear()
        began = time.monotonic()
        shard = promoter.open_if_ready(src.url, expected=Fingerprint(len(data)))
        assert shard is not None and time.monotonic() - began < 20
        with shard:
            assert shard.read_range(0, len(data)) == data
        promoter.close()
        assert not list((tmp_path / "tmp").iterdir())  # the killed download's copy is gone
    finally:
        if child.poll() is None:
            child.kill()
        server.close()
