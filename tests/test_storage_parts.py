"""wids.storage.parts: whole-file downloads as concurrent checked ranged parts (real servers)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from latencyproxy import LatencyProxy

from wids.cache import ShardCache
from wids.errors import IndexMismatchError
from wids.storage import IOStats, RetryPolicy, Store
from wids.storage.parts import PART_MAX, PART_MIN, download, part_spans

pytestmark = pytest.mark.servers

FAST = RetryPolicy(attempts=2, max_time=30.0, backoff=0.01, max_backoff=0.02, timeout=30.0)
KB = 1 << 10
CLIENTS = {
    "plain": None,  # the plain client's blocking connections, parts in threads (http1.py)
    "aiohttp": {"headers": {"X-Client": "wids"}},  # options that need aiohttp: its event loop
}
"""The two ways a plain ``http://`` download goes, by its storage options."""
by_client = pytest.mark.parametrize("client", sorted(CLIENTS))


def test_part_spans_cover_the_file_in_bounded_parts():
    assert part_spans(0) == []
    assert part_spans(10) == [(0, 10)]
    spans = part_spans(100 << 20)
    assert spans[0] == (0, PART_MAX) and spans[-1][1] == 100 << 20
    assert all(b[0] == a[1] for a, b in zip(spans, spans[1:], strict=False))  # contiguous
    assert part_spans(9 << 20) == [(0, PART_MIN), (PART_MIN, 2 * PART_MIN), (2 * PART_MIN, 9 << 20)]
    assert part_spans(10, part_size=4) == [(0, 4), (4, 8), (8, 10)]


@pytest.mark.parametrize(
    ("server", "client"), [("http_server", "plain"), ("http_server", "aiohttp"), ("s3_server", "")]
)
def test_parted_download_equals_the_file(request, server, client, tmp_path):
    """Every part lands at its offset; no stat when the size is known; one request a part."""
    srv = request.getfixturevalue(server)
    data = os.urandom(300 * KB + 7)
    url = srv.put_bytes(data, f"parts/{server}.bin")
    stats = IOStats()
    src = Store(CLIENTS.get(client) or srv.storage_options, FAST).source(url)
    if server == "http_server":
        srv.reset_counts()
    st = download(src, str(tmp_path / "copy"), stats, len(data), part_size=64 * KB, connections=3)
    assert (tmp_path / "copy").read_bytes() == data
    assert st.size == len(data) and st.etag  # the answers' etag, pinned
    assert stats.requests == 5 and stats.bytes_read == len(data)  # 5 parts, no HEAD
    if server == "http_server":
        assert srv.request_count(f"parts/{server}.bin") == 5


@by_client
def test_parts_are_concurrent(http_server, client, tmp_path):
    """Up to ``connections`` parts are in flight at once (counted by a latency proxy)."""
    data = os.urandom(256 * KB)
    http_server.put_bytes(data, "parts/concurrent.bin")
    with LatencyProxy(http_server.base, delay=0.2, mbps=0) as proxy:
        src = Store(CLIENTS[client], FAST).source(proxy.url("parts/concurrent.bin"))
        download(src, str(tmp_path / "copy"), None, len(data), part_size=32 * KB, connections=4)
        counts = proxy.settled()
    assert (tmp_path / "copy").read_bytes() == data
    assert counts["GET"] == 8 and counts.get("HEAD", 0) == 0
    assert counts["in_flight_peak"] == 4


@by_client
def test_a_file_changed_midway_is_refused_and_not_cached(http_server, client, tmp_path):
    """Parts after a replacement carry If-Match the first answer's etag: a typed error, and
    the cache keeps neither an entry nor a temporary file."""
    name = "parts/changing.bin"
    data = os.urandom(512 * KB)
    http_server.put_bytes(data, name)
    path = http_server.path(name)
    cache = ShardCache(tmp_path / "cache")
    with LatencyProxy(http_server.base, delay=0.05, mbps=0) as proxy:
        url = proxy.url(name)
        src = Store(CLIENTS[client], FAST).source(url)

        def replace_after_the_first_parts() -> None:
            deadline = time.monotonic() + 30
            while proxy.counts()["requests"] < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            http_server.put_bytes(os.urandom(len(data)), name)  # same size, new version
            os.utime(path, (time.time() + 100, time.time() + 100))  # nginx's etag: mtime-size

        changer = threading.Thread(target=replace_after_the_first_parts)
        changer.start()
        try:
            with pytest.raises(IndexMismatchError, match="changed"):
                cache.open_with(
                    url,
                    lambda dest: download(
                        src, dest, None, len(data), part_size=32 * KB, connections=1
                    ),
                    size=len(data),
                )
        finally:
            changer.join()
    assert not cache.contains(url)
    assert cache.entries() == []
    assert os.listdir(Path(cache.cache_dir) / "tmp") == []


def test_answers_without_etag_are_tied_by_their_date_and_fetched_once(http_server, tmp_path):
    """Index and server give no etag: the answers' ``Last-Modified`` ties the parts to one
    version, and the file crosses the wire once (it was fetched again whole: 2x the bytes)."""
    data = os.urandom(100 * KB)
    http_server.put_bytes(data, "parts/plain.bin")
    src = Store(None, FAST).source(f"{http_server.base}/noetag/parts/plain.bin")
    assert src.etag is None
    http_server.reset_counts()
    st = download(src, str(tmp_path / "copy"), None, len(data), part_size=32 * KB)
    assert (tmp_path / "copy").read_bytes() == data and st.etag is None
    assert http_server.counts() == (4, len(data))  # 4 parts, each byte once


@by_client
def test_a_file_without_etag_changed_midway_is_refused(http_server, client, tmp_path):
    """Without an etag, an answer with another ``Last-Modified`` than the first is a changed
    file: a typed error, never parts of two versions."""
    name = "parts/plain-changing.bin"
    data = os.urandom(256 * KB)
    http_server.put_bytes(data, name)
    path = http_server.path(name)
    with LatencyProxy(http_server.base, delay=0.05, mbps=0) as proxy:
        src = Store(CLIENTS[client], FAST).source(proxy.url(f"noetag/{name}"))

        def replace_after_the_first_parts() -> None:
            deadline = time.monotonic() + 30
            while proxy.counts()["requests"] < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            http_server.put_bytes(os.urandom(len(data)), name)  # same size, new version
            os.utime(path, (time.time() + 100, time.time() + 100))

        changer = threading.Thread(target=replace_after_the_first_parts)
        changer.start()
        try:
            with pytest.raises(IndexMismatchError, match="changed"):
                download(
                    src, str(tmp_path / "copy"), None, len(data), part_size=32 * KB, connections=1
                )
        finally:
            changer.join()
    assert not (tmp_path / "copy").exists()


def test_a_shorter_file_than_expected_is_a_mismatch(http_server, tmp_path):
    data = os.urandom(100 * KB)
    url = http_server.put_bytes(data, "parts/short.bin")
    src = Store(None, FAST).source(url)
    with pytest.raises(IndexMismatchError):
        download(src, str(tmp_path / "copy"), None, len(data) + 10, part_size=32 * KB)
    assert not (tmp_path / "copy").exists()


def test_the_cache_downloads_a_shard_in_concurrent_parts(http_server, tmp_path):
    """``ShardCache.open`` (what promotion runs) fetches a known-size file in parts, no HEAD."""
    data = os.urandom(2 * PART_MIN + 100)
    http_server.put_bytes(data, "parts/shard.tar")
    with LatencyProxy(http_server.base, delay=0.05, mbps=0) as proxy:
        src = Store(None, FAST).source(proxy.url("parts/shard.tar"))
        with ShardCache(tmp_path / "cache").open(src, size=len(data)) as shard:
            assert Path(shard.path).read_bytes() == data
        counts = proxy.settled()
    assert counts["GET"] == 3 and counts.get("HEAD", 0) == 0
    assert counts["in_flight_peak"] == 3


@pytest.mark.parametrize("server", ["http_server", "s3_server"])
def test_read_whole_is_one_request(request, server, tmp_path):
    """Index files and member-table sidecars (``index.spec.read_bytes``) cost one request
    each, not a stat and then a read."""
    from wids.errors import ShardNotFoundError
    from wids.index.spec import read_bytes

    srv = request.getfixturevalue(server)
    data = os.urandom(10 * KB)
    url = srv.put_bytes(data, f"parts/whole-{server}.json")
    store = Store(srv.storage_options, FAST)
    assert read_bytes(url, store) == data
    assert store.stats.requests == 1 and store.stats.bytes_read == len(data)
    with pytest.raises(ShardNotFoundError):
        read_bytes(url + ".missing", store)
    local = tmp_path / "local.json"
    local.write_bytes(data)
    assert read_bytes(str(local)) == data


@by_client
def test_downloads_of_a_process_share_its_connections_first_come_first_served(
    http_server, client, tmp_path
):
    """Two downloads at once: at most ``CONNECTIONS`` parts in flight for both, and the one
    started first gets its parts first, so it is complete first (a reader of shards one after
    another reads the first while the next arrives)."""
    from wids.storage.parts import CONNECTIONS

    data = [os.urandom(CONNECTIONS * 16 * KB) for _ in range(2)]
    for k, d in enumerate(data):
        http_server.put_bytes(d, f"parts/shared-{k}.bin")
    done: list[int] = []
    with LatencyProxy(http_server.base, delay=0.2, mbps=0) as proxy:
        store = Store(CLIENTS[client], FAST)

        def fetch(k: int) -> None:
            src = store.source(proxy.url(f"parts/shared-{k}.bin"))
            download(src, str(tmp_path / f"copy-{k}"), None, len(data[k]), part_size=16 * KB)
            done.append(k)

        first = threading.Thread(target=fetch, args=(0,))
        first.start()
        deadline = time.monotonic() + 30
        while proxy.counts()["requests"] < CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.005)
        second = threading.Thread(target=fetch, args=(1,))
        second.start()
        first.join()
        second.join()
        counts = proxy.settled()
    assert [(tmp_path / f"copy-{k}").read_bytes() == data[k] for k in (0, 1)] == [True, True]
    assert counts["GET"] == 2 * CONNECTIONS
    assert counts["in_flight_peak"] == CONNECTIONS  # not 2 * CONNECTIONS
    assert done == [0, 1]


class _Interrupted(Exception):
    pass


@by_client
def test_an_interrupted_download_never_writes_into_another_file(http_server, client, tmp_path):
    """A caller interrupted while parts are in flight (a signal, ``KeyboardInterrupt``) stops
    waiting; the parts still arriving are written through the download's own descriptor, never
    through a descriptor number the caller's process has reused for another file."""
    import signal

    data = os.urandom(4 * 64 * KB)
    http_server.put_bytes(data, "parts/interrupted.bin")

    def interrupt(*_: object) -> None:
        raise _Interrupted

    with LatencyProxy(http_server.base, delay=0.4, mbps=0) as proxy:
        src = Store(CLIENTS[client], FAST).source(proxy.url("parts/interrupted.bin"))
        assert src.read_range(0, 10) == data[:10]  # the client is set up: parts go out at once
        old = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # while the parts wait for their answers
        try:
            with pytest.raises(_Interrupted):
                download(src, str(tmp_path / "copy"), None, len(data), part_size=64 * KB)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        with open(tmp_path / "other", "wb") as other:  # may get the number of a closed fd
            time.sleep(0.6)  # the answers arrive meanwhile
            other.write(b"mine")
        proxy.settled()
    assert (tmp_path / "other").read_bytes() == b"mine"
    assert not (tmp_path / "copy").exists()


@by_client
def test_a_download_interrupted_before_its_parts_start_never_writes_a_new_file_at_its_path(
    http_server, client, tmp_path
):
    """The parts write through the descriptor the caller opened, not by ``dest``'s path: a
    caller interrupted before the download's parts ran (the event loop, or every thread of
    the process's parts, busy), that removes ``dest`` and creates a new file there at once,
    keeps that file as it wrote it."""
    import signal

    from wids.storage.parts import CONNECTIONS, _part_threads

    data = os.urandom(4 * 64 * KB)
    url = http_server.put_bytes(data, "parts/interrupted-early.bin")
    src = Store(CLIENTS[client], FAST).source(url)
    assert src.read_range(0, 10) == data[:10]  # the client is set up
    release = threading.Event()
    if client == "aiohttp":
        fs, _ = src._filesystem()
        fs.loop.call_soon_threadsafe(release.wait, 30)  # the loop runs nothing until released
        busy = []
    else:  # every part thread waits until released
        busy = [_part_threads().submit(release.wait, 30) for _ in range(CONNECTIONS)]

    def interrupt(*_: object) -> None:
        raise _Interrupted

    dest = tmp_path / "copy"
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        with pytest.raises(_Interrupted):
            download(src, str(dest), None, len(data), part_size=64 * KB)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        dest.write_bytes(b"mine")  # the caller starts over at the same path
        release.set()
    if client == "aiohttp":
        assert src.read_range(0, 10) == data[:10]  # the loop ran the download's coroutine first
    else:
        assert all(f.result(30) for f in busy)  # released: the download's runners came next
        _part_threads().submit(time.sleep, 0).result(30)
    time.sleep(0.2)  # and any part it fetched
    assert dest.read_bytes() == b"mine"
