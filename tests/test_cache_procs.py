"""Acceptance tests of the shard cache: many processes, SIGKILL, tampering, against nginx."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time

import pytest

from wids.cache import ShardCache
from wids.storage import Source, url_name
from wids.synth import write_dataset

pytestmark = pytest.mark.servers


def _names(directory: str, sub: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(directory, sub)))
    except FileNotFoundError:
        return []


def _data_bytes(directory: str) -> int:
    d = os.path.join(directory, "data")
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))


def _random_reader(cache_dir, urls, paths, budget, seed, reads, result) -> None:
    rng = random.Random(seed)
    cache = ShardCache(cache_dir, max_bytes=budget, lock_timeout=60)
    originals = [open(p, "rb").read() for p in paths]
    bad = 0
    for _ in range(reads):
        picks = rng.sample(range(len(urls)), rng.choice([1, 1, 2]))
        shards = [cache.open(Source(urls[i]), size=len(originals[i])) for i in picks]
        for i, shard in zip(picks, shards, strict=True):
            for _ in range(5):
                a = rng.randrange(len(originals[i]))
                b = min(len(originals[i]), a + rng.randrange(1, 5000))
                bad += shard.read_range(a, b) != originals[i][a:b]
        for shard in shards:
            shard.close()
    result.put(bad)


def test_four_processes_random_reads_within_budget(http_server, tmp_path):
    paths = write_dataset(
        str(tmp_path / "src"),
        shards=8,
        samples_per_shard=60,
        real_images=False,
        jpg_bytes=3000,
        prefix="procs",
    )
    urls = [http_server.put(p, f"procs/{os.path.basename(p)}") for p in paths]
    budget = 3 * max(os.path.getsize(p) for p in paths)
    cache_dir = str(tmp_path / "cache")
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    http_server.reset_counts()
    t0 = time.monotonic()
    procs = [
        ctx.Process(target=_random_reader, args=(cache_dir, urls, paths, budget, seed, 40, result))
        for seed in range(4)
    ]
    for p in procs:
        p.start()
    bad = [result.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    elapsed = time.monotonic() - t0
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert bad == [0, 0, 0, 0]
    assert elapsed < 120
    assert http_server.request_count() > 8  # entries were evicted and fetched again
    # Idle now: within budget, nothing half-written left behind.
    assert _data_bytes(cache_dir) <= budget
    assert 1 <= len(_names(cache_dir, "data")) <= 3
    assert _names(cache_dir, "tmp") == []
    assert [n for n in _names(cache_dir, "meta") if n.endswith(".tmp")] == []
    assert len(_names(cache_dir, "meta")) == len(_names(cache_dir, "data"))
    cache = ShardCache(cache_dir)
    for e in cache.entries():
        i = urls.index(e.url)
        assert open(e.path, "rb").read() == open(paths[i], "rb").read()


def _read_whole(cache_dir, url, size) -> None:
    with ShardCache(cache_dir).open(Source(url), size=size) as shard:
        shard.read_range(0, size)


def _write(dest: str, data: bytes) -> None:
    with open(dest, "wb") as f:
        f.write(data)


def _two_fetches(cache_dir, x, y, downloading, release, fetched_y) -> None:
    """Fetch ``x`` (held until ``release``) and then ``y``: one download at a time here."""
    cache = ShardCache(cache_dir, lock_timeout=60)

    def slow(dest: str) -> None:
        downloading.set()
        release.wait(60)
        _write(dest, b"x" * 1000)

    def quick(dest: str) -> None:
        fetched_y.set()
        _write(dest, b"y" * 1000)

    first = threading.Thread(target=lambda: cache.open_with(x, slow, size=1000).close())
    first.start()
    downloading.wait(60)
    cache.open_with(y, quick, size=1000).close()  # waits for this process's download slot
    first.join(60)


def test_a_process_waiting_for_its_download_slot_lets_another_fetch_the_shard(tmp_path):
    """A process downloading one shard and wanting a second held the second's lock while it
    waited for its own download to end: every other process wanting the second waited for
    both downloads (DataLoader workers' first batches waited on a sibling's downloads)."""
    cache_dir = str(tmp_path / "cache")
    x, y = "http://127.0.0.1:9/slot/x.tar", "http://127.0.0.1:9/slot/y.tar"
    ctx = mp.get_context("spawn")
    downloading, release, fetched_y = ctx.Event(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_two_fetches, args=(cache_dir, x, y, downloading, release, fetched_y))
    p.start()
    try:
        assert downloading.wait(60)
        time.sleep(0.5)  # the other process now waits for its slot to fetch y
        got: list[bytes] = []
        mine = ShardCache(cache_dir, lock_timeout=60)

        def open_y() -> None:
            with mine.open_with(y, lambda dest: _write(dest, b"y" * 1000), size=1000) as shard:
                got.append(shard.read_range(0, 1000))

        reader = threading.Thread(target=open_y)
        reader.start()
        reader.join(10)
        assert got == [b"y" * 1000], "y waited for another process's download of x"
    finally:
        release.set()
        p.join(60)
    assert p.exitcode == 0
    assert not fetched_y.is_set()  # fetched once, here: the other process opened this copy


def _slow_fetches(cache_dir, urls, downloading, release) -> None:
    """Fetch each of ``urls`` (as a process of its own each), held until ``release``."""

    def fetch(url: str) -> None:
        def slow(dest: str) -> None:
            downloading.put(url)
            release.wait(60)
            _write(dest, b"x" * 1000)

        ShardCache(cache_dir, lock_timeout=60).open_with(url, slow, size=1000).close()

    threads = [threading.Thread(target=fetch, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_fetches_ahead_of_shards_another_process_downloads_hold_up_none_after_them(
    http_server, tmp_path
):
    """The fetches ahead of a process waited for other processes' downloads of the same
    shards, and the fetch queued behind them (the shard a worker read next) waited for both:
    a DataLoader worker's next shard began downloading only when its siblings' shards had."""
    cache_dir = str(tmp_path / "cache")
    held = ["http://127.0.0.1:9/ahead/x1.tar", "http://127.0.0.1:9/ahead/x2.tar"]
    data = random.Random(7).randbytes(50_000)
    url = http_server.put_bytes(data, "ahead/y.tar")
    ctx = mp.get_context("spawn")
    downloading, release = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_slow_fetches, args=(cache_dir, held, downloading, release))
    p.start()
    cache = ShardCache(cache_dir, lock_timeout=60)
    try:
        assert sorted(downloading.get(timeout=60) for _ in held) == held
        skipped = [cache.prefetch(Source(u), size=1000) for u in held]  # both threads' first
        cache.prefetch(Source(url), size=len(data)).result(timeout=10)
        assert all(f.done() for f in skipped)  # left to their readers, none was fetched here
        with cache.open(Source(url), size=len(data)) as shard:
            assert shard.read_range(0, len(data)) == data
    finally:
        release.set()
        p.join(60)
        cache.close()
    assert p.exitcode == 0


def test_sigkill_mid_download_then_next_reader_refetches(http_server, tmp_path):
    size = 96 << 20
    data = random.Random(5).randbytes(size)
    url = http_server.put_bytes(data, "kill/big.tar")
    ctx = mp.get_context("spawn")
    for attempt in range(3):  # the download may (rarely) finish before we catch it
        cache_dir = str(tmp_path / f"cache{attempt}")
        tmpdir = os.path.join(cache_dir, "tmp")
        p = ctx.Process(target=_read_whole, args=(cache_dir, url, size))
        p.start()
        killed = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.exitcode is None:
            parts = [n for n in _names(cache_dir, "tmp") if n.endswith(".tmp")]
            if parts and 0 < os.path.getsize(os.path.join(tmpdir, parts[0])) < size:
                os.kill(p.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.0005)
        p.join(30)
        if killed:
            break
    assert killed, "never caught the download in progress"
    assert p.exitcode == -signal.SIGKILL
    assert len(_names(cache_dir, "tmp")) == 1  # the partial file, abandoned
    cache = ShardCache(cache_dir)
    assert not cache.contains(url)
    http_server.reset_counts()
    with cache.open(Source(url), size=size) as shard:
        assert shard.read_range(0, size) == data
    assert http_server.request_count("kill/big.tar") >= 1
    assert _names(cache_dir, "tmp") == []


@pytest.mark.parametrize("how", ["truncate", "overwrite", "flip-restore-mtime"])
def test_tampered_cache_file_is_fetched_again(http_server, tmp_path, how):
    """``flip-restore-mtime`` (issue 26): one byte flipped, the mtime set back; main served it.
    The record's ctime (which no user can set back) catches it."""
    data = random.Random(6).randbytes(200_000)
    name = f"tamper/{how}.tar"
    url = http_server.put_bytes(data, name)
    cache = ShardCache(tmp_path / "cache")
    http_server.reset_counts()
    with cache.open(Source(url), size=len(data)) as shard:
        assert shard.read_range(0, len(data)) == data
    first = http_server.request_count(name)
    assert first >= 1
    with cache.open(Source(url), size=len(data)) as shard:
        assert shard.read_range(0, 100) == data[:100]
    assert http_server.request_count(name) == first  # served from the cache
    path = cache.files.data(url_name(url))
    time.sleep(0.01)
    if how == "truncate":
        os.truncate(path, 1000)
    elif how == "flip-restore-mtime":
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(5000)
            f.write(bytes([data[5000] ^ 1]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        with open(path, "r+b") as f:
            f.seek(5000)
            f.write(b"\0" * 64)
    with cache.open(Source(url), size=len(data)) as shard:
        assert shard.read_range(0, len(data)) == data
    assert http_server.request_count(name) > first


# -- the budget at rest -------------------------------------------------------------------------

_EXIT_WITHOUT_CLOSE = r"""
import os, sys
from wids.dataset.listdataset import ShardListDataset

index, cache_dir, budget, per_shard, how = sys.argv[1:]
ds = ShardListDataset(
    index, access="shard", cache_dir=cache_dir, cache_size=int(budget), lru_size=100,
    transformations=[],
)
for shard in range(len(ds.lengths)):
    ds[shard * int(per_shard)]
data = os.path.join(cache_dir, "data")
print(sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)), flush=True)
if how == "daemon":  # still referenced at exit, so never collected: no __del__ runs
    import threading, time
    threading.Thread(target=lambda ds=ds: time.sleep(600), daemon=True).start()
if how == "os._exit":  # what a DataLoader worker does: no atexit, no finalizers
    os._exit(0)
"""


@pytest.fixture(scope="module")
def rest_dataset(http_server, tmp_path_factory):
    from wids import build_index

    src = tmp_path_factory.mktemp("rest")
    paths = write_dataset(
        str(src), shards=5, samples_per_shard=10, real_images=False, prefix="rest"
    )
    urls = [http_server.put(p, f"rest/{os.path.basename(p)}") for p in paths]
    index = str(src / "rest.json")
    build_index(urls, index, name="rest")
    return {"index": index, "urls": urls, "size": max(os.path.getsize(p) for p in paths)}


def _run_without_close(rest_dataset, cache_dir: str, budget: int, how: str) -> int:
    """A process reads one sample of every shard (all held open) and exits without close()."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_WITHOUT_CLOSE, rest_dataset["index"], cache_dir]
        + [str(budget), "10", how],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


@pytest.mark.parametrize("how", ["return", "daemon", "os._exit"])
def test_a_process_exiting_without_close_leaves_the_cache_within_budget(
    rest_dataset, tmp_path, how
):
    """Issue 26: shards held open took the cache over its budget, and a process ending without
    finalizers (``os._exit``, as DataLoader workers do; ``daemon``: a thread still references
    the dataset) left it there until the next opener. The budget now holds while they are
    open, so nothing has to run at exit."""
    budget = 2 * rest_dataset["size"]
    cache_dir = str(tmp_path / "cache")
    while_open = _run_without_close(rest_dataset, cache_dir, budget, how)
    assert while_open <= budget  # five shards held open, a budget of two
    assert _data_bytes(cache_dir) <= budget  # after exit, with no other process
    assert _names(cache_dir, "tmp") == []
    assert len(ShardCache(cache_dir).entries()) >= 1


def _two_caches(cache_dir: str, ready, done) -> None:
    caches = [ShardCache(cache_dir, max_bytes=10_000) for _ in range(2)]
    for c in caches:
        c.active_readers()
    ready.set()
    done.wait(30)


def _marks(cache_dir: str) -> list[str]:
    return [n for n in _names(cache_dir, "locks") if n.startswith(".reader.")]


def test_reader_marks_count_processes_and_go_with_their_cache(tmp_path):
    """Caches made and dropped one after another count as one reader, not one each (main:
    six dropped caches made active_readers 7 and roomy False with room for 10 shards); a
    process with two caches is one reader; close() and collection remove the mark."""
    import gc

    d = str(tmp_path / "cache")
    for k in range(6):
        c = ShardCache(d, max_bytes=10_000)
        assert c.active_readers() == 1
        if k % 2:
            c.close()
        del c
        gc.collect()
    assert _marks(d) == []
    c = ShardCache(d, max_bytes=10_000)
    assert c.active_readers() == 1 and c.roomy(1000)
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_two_caches, args=(d, ready, done))
    p.start()
    try:
        assert ready.wait(60)
        time.sleep(1.1)  # past the reuse of the last count
        assert c.active_readers() == 2 and len(_marks(d)) == 3
        assert c.roomy(2500) and not c.roomy(2501)
    finally:
        done.set()
        p.join(30)
    c.close()
    assert _marks(d) == []


def _slow_counter(cache_dir: str, started, stop) -> None:
    """What another process's count does to each mark (try its lock), slowed down."""
    import fcntl

    locks = os.path.join(cache_dir, "locks")
    started.set()
    while not stop.is_set():
        for name in [n for n in _names(cache_dir, "locks") if n.startswith(".reader.")]:
            try:
                fd = os.open(os.path.join(locks, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                time.sleep(0.002)
            except OSError:
                pass
            finally:
                os.close(fd)


def test_a_new_reader_mark_waits_for_a_process_counting_marks(tmp_path):
    """Another process counting marks may hold a fresh mark's lock for a moment: making the
    mark waits for it (main raised BlockingIOError into the read path, about 1 in 300)."""
    d = str(tmp_path / "cache")
    ShardCache(d, max_bytes=10**6).total_bytes()
    ctx = mp.get_context("spawn")
    started, stop = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_slow_counter, args=(d, started, stop))
    p.start()
    try:
        assert started.wait(60)
        for _ in range(3000):
            c = ShardCache(d, max_bytes=10**6)
            assert c.active_readers() >= 1
            c.close()
    finally:
        stop.set()
        p.join(30)
    assert _marks(d) == []
