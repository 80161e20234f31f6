"""wids.storage.batch: a Window bounds the requests in flight over concurrent read_ranges calls."""

from __future__ import annotations

import threading
import time

import pytest
from latencyproxy import LatencyProxy

from wids import RetryPolicy
from wids.storage import Store, Window, read_ranges

DATA = bytes((i * 13 + i // 509) % 256 for i in range(200_000))


def test_window_bounds_requests_in_flight_across_calls(http_server):
    """Three threads' calls share one window of 4: never more than 4 requests at the server
    (the proxy's own count), each call's bytes right, and the window was used to the full."""
    http_server.put_bytes(DATA, "batch/window.bin")
    window = Window(4)
    spans = [(k * 5_000, k * 5_000 + 3_000) for k in range(10)]
    out: dict[int, list[bytes]] = {}
    with LatencyProxy(http_server.base, delay=0.03, mbps=0) as proxy:
        store = Store(retry=RetryPolicy(timeout=10.0))
        src = store.source(proxy.url("batch/window.bin"), size=len(DATA))

        def call(k: int) -> None:
            out[k] = read_ranges([(src, s, e) for s, e in spans], window=window)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        counts = proxy.settled()
    assert all(out[k] == [DATA[s:e] for s, e in spans] for k in range(3))
    assert counts["GET"] == 30
    assert counts["in_flight_peak"] <= 4  # without the window: up to 30 at once
    assert window.peak == 4 and window.in_flight == 0


def test_window_size_is_checked():
    with pytest.raises(ValueError):
        Window(0)


def test_direct_reads_go_before_queued_ones_and_count_in_the_window(http_server):
    """A call waiting for its batch (``direct``) takes the window's next places before the
    requests queued earlier (prefetches), and the window never holds more than its size.

    Window 4, 10 queued requests, then 2 direct ones, each answer a round trip ``delay``
    late: the direct ones take 2 of the 4 places freed after one round trip and are done
    after two; behind the 6 queued ones (FIFO) they would be done after three.
    """
    delay = 0.4
    http_server.put_bytes(DATA, "batch/queued.bin")
    http_server.put_bytes(DATA, "batch/direct.bin")
    window = Window(4)
    spans = [(k * 5_000, k * 5_000 + 3_000) for k in range(10)]
    with LatencyProxy(http_server.base, delay=delay, mbps=0) as proxy:
        store = Store(retry=RetryPolicy(timeout=20.0))
        queued = store.source(proxy.url("batch/queued.bin"), size=len(DATA))
        direct = store.source(proxy.url("batch/direct.bin"), size=len(DATA))
        read_ranges([(queued, 0, 10), (direct, 0, 10)])  # first answers: both sources pinned
        out: list[list[bytes]] = []
        work = [(queued, s, e) for s, e in spans]
        t = threading.Thread(target=lambda: out.append(read_ranges(work, window=window)))
        started = time.perf_counter()
        t.start()
        while len(window._queue) < 6 and time.perf_counter() - started < 20:  # 4 out, 6 wait
            time.sleep(0.002)
        got = read_ranges([(direct, s, e) for s, e in spans[:2]], window=window, direct=True)
        took = time.perf_counter() - started
        t.join(60)
        counts = proxy.settled()
    assert got == [DATA[s:e] for s, e in spans[:2]] and out == [[DATA[s:e] for s, e in spans]]
    assert 2 * delay <= took < 2.5 * delay, took
    assert counts["in_flight_peak"] <= 4 and window.peak == 4 and window.in_flight == 0
