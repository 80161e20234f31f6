from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time

import pytest

import wids.cache.handle as handle_mod
from wids.cache import ShardCache
from wids.cache.handle import CachedShard
from wids.errors import (
    CacheBudgetError,
    CacheError,
    IndexMismatchError,
    LockTimeoutError,
    OfflineError,
    ShardNotFoundError,
)
from wids.index import Fingerprint
from wids.lock import FileLock
from wids.storage import FileStat, Source, url_name


def blob(n: int, seed: int = 0) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (n // 32) + b"x" * (n % 32)


class Store:
    """A pretend remote: ``download(url)`` returns a callable that writes the object."""

    def __init__(self, delay: float = 0.0):
        self.objects: dict[str, bytes] = {}
        self.etags: dict[str, str] = {}
        self.calls: dict[str, int] = {}
        self.delay = delay
        self._mutex = threading.Lock()

    def put(self, url: str, data: bytes, etag: str | None = None) -> str:
        self.objects[url] = data
        self.etags[url] = etag or hashlib.md5(data).hexdigest()
        return url

    def download(self, url: str):
        def run(dest: str) -> FileStat:
            with self._mutex:
                self.calls[url] = self.calls.get(url, 0) + 1
            data = self.objects[url]
            with open(dest, "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                time.sleep(self.delay)
                f.write(data[len(data) // 2 :])
            return FileStat(len(data), self.etags[url], None)

        return run

    def open(self, cache: ShardCache, url: str, **kw) -> CachedShard:
        kw.setdefault("size", len(self.objects[url]))
        return cache.open_with(url, self.download(url), **kw)


def listing(cache: ShardCache, sub: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(cache.cache_dir, sub)))
    except FileNotFoundError:
        return []


def data_bytes(cache: ShardCache) -> int:
    d = os.path.join(cache.cache_dir, "data")
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))


# -- names --------------------------------------------------------------------------------------


def test_entry_names_are_collision_free_and_readable():
    a = url_name("s3://bucket-a/train/train-000000.tar")
    b = url_name("s3://bucket-b/train/train-000000.tar")
    assert a != b
    assert a.endswith("-train-000000.tar") and b.endswith("-train-000000.tar")
    assert url_name("https://h/x.tar?v=1") != url_name("https://h/x.tar?v=2")


@pytest.mark.parametrize(
    "url",
    [
        "../../../etc/passwd",
        "http://host/..",
        "http://host/a/../../..",
        "s3://b/",
        "s3://b/.hidden",
        "http://h/a b/ç€/shard\x00.tar",
        "http://h/" + "x" * 5000,
        "memory://..\\..\\evil",
    ],
)
def test_no_url_escapes_the_cache_dir(tmp_path, url):
    key = url_name(url)
    assert "/" not in key and "\\" not in key and not key.startswith(".")
    assert len(key) < 120
    cache = ShardCache(tmp_path / "c")
    path = os.path.realpath(cache.files.data(key))
    assert os.path.dirname(path) == os.path.realpath(tmp_path / "c" / "data")


# -- fetch once, verify -------------------------------------------------------------------------


def test_open_downloads_once_and_reads(tmp_path):
    store = Store()
    url = store.put("s3://b/a/shard-0.tar", blob(10_000))
    cache = ShardCache(tmp_path)
    with store.open(cache, url) as shard:
        assert shard.read_range(0, 10_000) == store.objects[url]
        assert shard.read_range(100, 132) == store.objects[url][100:132]
        assert shard.read_range(5, 5) == b""
        with pytest.raises(ValueError):
            shard.read_range(0, 10_001)
        assert shard.path == os.path.join(str(tmp_path), "data", url_name(url))
    assert shard.closed
    with pytest.raises(CacheError):
        shard.read_range(0, 1)
    with store.open(cache, url) as shard:
        assert shard.read_range(9990, 10_000) == store.objects[url][9990:]
    assert store.calls[url] == 1
    assert cache.contains(url) and not cache.contains("s3://b/other.tar")
    (entry,) = cache.entries()
    assert entry.url == url and entry.size == 10_000 and entry.etag == store.etags[url]
    assert cache.total_bytes() == 10_000
    assert listing(cache, "tmp") == []


def test_record_keeps_no_credentials(tmp_path):
    store = Store()
    url = store.put("https://user:pw@h/x.tar?X-Amz-Signature=secret&v=1", blob(100))
    cache = ShardCache(tmp_path)
    store.open(cache, url).close()
    text = open(cache.files.meta(url_name(url))).read()
    assert "secret" not in text and "pw" not in text
    assert cache.entries()[0].url == "https://h/x.tar?v=1"


def test_concurrent_threads_fetch_once(tmp_path):
    store = Store(delay=0.3)
    url = store.put("s3://b/slow.tar", blob(50_000))
    cache = ShardCache(tmp_path)
    results, errors = [], []

    def reader():
        try:
            with store.open(cache, url) as shard:
                results.append(shard.read_range(0, 50_000))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert results == [store.objects[url]] * 8
    assert store.calls[url] == 1


def test_size_mismatch_is_not_cached(tmp_path):
    store = Store()
    url = store.put("s3://b/x.tar", blob(1000))
    cache = ShardCache(tmp_path)
    with pytest.raises(IndexMismatchError, match="1000"):
        store.open(cache, url, size=999)
    assert listing(cache, "data") == [] and listing(cache, "tmp") == []
    with store.open(cache, url) as shard:  # the lock was released
        assert shard.size == 1000


def test_md5_verified(tmp_path):
    store = Store()
    url = store.put("s3://b/x.tar", blob(1000))
    cache = ShardCache(tmp_path)
    with pytest.raises(IndexMismatchError, match="md5"):
        store.open(cache, url, md5sum="0" * 32)
    assert listing(cache, "data") == []
    good = hashlib.md5(store.objects[url]).hexdigest()
    store.open(cache, url, md5sum=good.upper()).close()
    assert cache.entries()[0].md5sum == good
    store.open(cache, url, md5sum=good).close()
    assert store.calls[url] == 2


def test_expected_fingerprint_is_the_keywords_in_one(tmp_path):
    # ``expected=`` (what the dataset passes: ShardInfo.fingerprint, mtime included) checks
    # the same as size=/etag=/md5sum=; giving both ways at once is refused.
    store = Store()
    url = store.put("s3://b/x.tar", blob(1000), etag="v1")
    good = hashlib.md5(store.objects[url]).hexdigest()
    cache = ShardCache(tmp_path)
    wrong = [Fingerprint(999), Fingerprint(1000, '"v0"'), Fingerprint(1000, md5="0" * 32)]
    for fp, what in zip(wrong, ["size", "etag", "md5"], strict=True):
        with pytest.raises(IndexMismatchError, match=what):
            cache.open_with(url, store.download(url), expected=fp)
    assert listing(cache, "data") == []
    expected = Fingerprint(1000, "v1", mtime=12345.0, md5=good)
    cache.open_with(url, store.download(url), expected=expected).close()
    assert cache.entries()[0].md5sum == good
    with cache.open_cached(url, expected=expected) as shard:
        assert shard.read_range(0, 1000) == store.objects[url]
    assert cache.open_cached(url, expected=Fingerprint(1000, "v2")) is None
    assert store.calls[url] == 4
    with pytest.raises(ValueError, match="not both"):
        cache.open_with(url, store.download(url), expected=expected, size=1000)


def test_etag_checked_on_download_and_on_open(tmp_path):
    store = Store()
    url = store.put("s3://b/x.tar", blob(1000), etag="v1")
    cache = ShardCache(tmp_path)
    with pytest.raises(IndexMismatchError, match="etag"):
        store.open(cache, url, etag='"v0"')
    store.open(cache, url, etag='"v1"').close()
    store.open(cache, url, etag="v1").close()
    assert store.calls[url] == 2
    # The remote changed and the index knows: the stale copy is replaced.
    store.put(url, blob(1000, seed=1), etag="v2")
    with store.open(cache, url, etag="v2") as shard:
        assert shard.read_range(0, 1000) == store.objects[url]
    assert store.calls[url] == 3


def test_failed_download_leaves_nothing(tmp_path):
    cache = ShardCache(tmp_path)

    def broken(dest):
        with open(dest, "wb") as f:
            f.write(b"partial")
        raise ConnectionError("boom")

    with pytest.raises(ConnectionError):
        cache.open_with("s3://b/x.tar", broken)
    assert listing(cache, "data") == [] and listing(cache, "tmp") == []
    assert listing(cache, "meta") == []


def test_lock_timeout_names_the_shard(tmp_path):
    store = Store()
    url = store.put("s3://b/busy.tar", blob(100))
    cache = ShardCache(tmp_path, lock_timeout=0.2)
    cache._prepare()
    with FileLock(cache.files.lockfile(url_name(url))):
        with pytest.raises(LockTimeoutError, match="busy.tar"):
            store.open(cache, url)


# -- tamper -------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["truncate", "overwrite", "delete_meta", "corrupt_meta", "swap"])
def test_tampered_entry_is_fetched_again(tmp_path, how):
    store = Store()
    url = store.put("s3://b/x.tar", blob(4096))
    cache = ShardCache(tmp_path)
    store.open(cache, url).close()
    data, meta = cache.files.data(url_name(url)), cache.files.meta(url_name(url))
    time.sleep(0.01)  # so an in-place write changes the mtime
    if how == "truncate":
        os.truncate(data, 1000)
    elif how == "overwrite":
        with open(data, "r+b") as f:
            f.seek(100)
            f.write(b"EVIL")
    elif how == "delete_meta":
        os.unlink(meta)
    elif how == "corrupt_meta":
        with open(meta, "w") as f:
            f.write("{not json")
    elif how == "swap":
        other = tmp_path / "other"
        other.write_bytes(blob(4096, seed=9))
        os.replace(other, data)
    with store.open(cache, url, size=None) as shard:
        assert shard.read_range(0, 4096) == store.objects[url]
    assert store.calls[url] == 2


# -- budget -------------------------------------------------------------------------------------


def test_shard_larger_than_budget_fails_at_once(tmp_path):
    store = Store()
    url = store.put("s3://b/big.tar", blob(5000))
    cache = ShardCache(tmp_path, max_bytes=4000)
    with pytest.raises(CacheBudgetError, match="4000"):
        store.open(cache, url)
    assert url not in store.calls
    # Size unknown up front: found out after the download, and nothing is kept.
    with pytest.raises(CacheBudgetError):
        store.open(cache, url, size=None)
    assert listing(cache, "data") == [] and listing(cache, "tmp") == []


def test_lru_eviction(tmp_path, monkeypatch):
    monkeypatch.setattr(handle_mod, "_TOUCH_EVERY", 0.0)
    store = Store()
    urls = [store.put(f"s3://b/{i}/shard.tar", blob(1000, i)) for i in range(4)]
    cache = ShardCache(tmp_path, max_bytes=2500)
    for u in urls[:2]:
        store.open(cache, u).close()
        time.sleep(0.01)
    store.open(cache, urls[0]).close()  # now urls[1] is least recently used
    time.sleep(0.01)
    store.open(cache, urls[2]).close()
    assert cache.contains(urls[0]) and cache.contains(urls[2])
    assert not cache.contains(urls[1])
    assert data_bytes(cache) <= 2500
    assert [e.url for e in cache.entries()] == [urls[0], urls[2]]
    assert len(listing(cache, "locks")) == 2  # the evicted entry's lock file went too


def test_open_entries_never_hold_the_cache_above_its_budget(tmp_path):
    """Issue 26: open readers pinned a cache above its budget (2.57x with four processes).

    Eviction now unlinks open entries; their readers keep reading the right bytes."""
    store = Store()
    urls = [store.put(f"s3://b/{i}.tar", blob(1000, i)) for i in range(4)]
    cache = ShardCache(tmp_path, max_bytes=2000)
    held = [store.open(cache, u) for u in urls[:3]]
    assert data_bytes(cache) <= 2000  # was 3000 while all three were open
    assert held[0].evicted and not held[2].evicted
    for u, shard in zip(urls[:3], held, strict=True):
        assert shard.read_range(0, 1000) == store.objects[u]
    for shard in held:
        shard.close()
    assert data_bytes(cache) <= 2000
    with store.open(cache, urls[3]) as shard:
        assert shard.read_range(0, 1000) == store.objects[urls[3]]
    assert data_bytes(cache) <= 2000


def test_keep_never_evicts(tmp_path):
    store = Store()
    urls = [store.put(f"s3://b/{i}.tar", blob(1000, i)) for i in range(3)]
    cache = ShardCache(tmp_path, max_bytes=2500, keep=True)
    store.open(cache, urls[0]).close()
    store.open(cache, urls[1]).close()
    with pytest.raises(CacheBudgetError, match="keep=True"):
        store.open(cache, urls[2])
    assert cache.contains(urls[0]) and cache.contains(urls[1])
    assert ShardCache(tmp_path, keep=True).open_with(urls[2], store.download(urls[2]))
    assert len(cache.entries()) == 3


def test_clean_and_evict_to(tmp_path):
    store = Store()
    urls = [store.put(f"s3://b/{i}.tar", blob(1000, i)) for i in range(4)]
    cache = ShardCache(tmp_path)
    for u in urls:
        store.open(cache, u).close()
    assert cache.total_bytes() == 4000
    assert len(cache.evict_to(2000)) == 2 and cache.total_bytes() == 2000
    assert cache.clean(older_than=3600) == []
    held = store.open(cache, urls[3])
    removed = cache.clean()
    assert len(removed) == 2 and not cache.contains(urls[3])  # open ones go too (unlinked)
    assert held.evicted and held.read_range(0, 1000) == store.objects[urls[3]]
    held.close()
    assert cache.remove(urls[3]) and not cache.contains(urls[3])
    assert cache.remove("s3://b/never.tar")
    assert cache.total_bytes() == 0 and listing(cache, "locks") == []


# -- killed downloads ---------------------------------------------------------------------------


def _slow_download(cache_dir: str, url: str, started) -> None:
    def download(dest):
        with open(dest, "wb") as f:
            f.write(b"half of it")
            f.flush()
            started.set()
            time.sleep(60)

    ShardCache(cache_dir).open_with(url, download)


def test_killed_download_is_redone(tmp_path):
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    url = "s3://b/killed.tar"
    p = ctx.Process(target=_slow_download, args=(str(tmp_path), url, started))
    p.start()
    assert started.wait(60)
    cache = ShardCache(tmp_path, lock_timeout=0.2)
    assert not cache.contains(url)
    with pytest.raises(LockTimeoutError):  # the download is still running
        cache.open_with(url, lambda dest: None)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert len(listing(cache, "tmp")) == 1  # the partial download, now abandoned
    assert not cache.contains(url)
    store = Store()
    store.put(url, blob(3000))
    with store.open(cache, url) as shard:
        assert shard.read_range(0, 3000) == store.objects[url]
    assert listing(cache, "tmp") == []


def test_clean_removes_abandoned_temp_files(tmp_path):
    cache = ShardCache(tmp_path)
    cache._prepare()
    stale = os.path.join(cache.cache_dir, "tmp", f".{url_name('s3://b/x.tar')}.0123456789ab.tmp")
    with open(stale, "wb") as f:
        f.write(b"junk")
    orphan = cache.files.data(url_name("s3://b/y.tar"))  # data without a record: not ours
    with open(orphan, "wb") as f:
        f.write(b"junk")
    assert cache.clean() == []
    assert listing(cache, "tmp") == [] and listing(cache, "data") == [url_name("s3://b/y.tar")]


# -- offline, local, sources --------------------------------------------------------------------


def test_offline_serves_only_the_cache(tmp_path):
    store = Store()
    url = store.put("s3://b/x.tar", blob(100))
    ShardCache(tmp_path).open_with(url, store.download(url)).close()
    offline = ShardCache(tmp_path, offline=True)
    with offline.open_with(url, store.download(url)) as shard:
        assert shard.read_range(0, 100) == store.objects[url]
    with pytest.raises(OfflineError, match="s3://b/missing.tar") as info:
        offline.open_with("s3://b/missing.tar", store.download(url))
    assert isinstance(info.value, OSError)
    assert store.calls[url] == 1


def test_open_source_memory_fs(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    data = blob(20_000, 3)
    fs.pipe_file("/wids-cache-test/a/shard.tar", data)
    url = "memory://wids-cache-test/a/shard.tar"
    cache = ShardCache(tmp_path / "c", max_bytes=100_000)
    with cache.open(Source(url)) as shard:
        assert shard.read_range(0, len(data)) == data
    assert cache.contains(url)
    offline = ShardCache(tmp_path / "c", offline=True)
    with offline.open(Source(url)) as shard:
        assert shard.read_range(10, 20) == data[10:20]
    with pytest.raises(CacheBudgetError):
        ShardCache(tmp_path / "d", max_bytes=10).open(Source(url))
    fs.rm("/wids-cache-test", recursive=True)


def test_local_files_are_opened_in_place(tmp_path):
    local = tmp_path / "local.tar"
    local.write_bytes(blob(500))
    cache = ShardCache(tmp_path / "c", max_bytes=10, offline=True)
    with cache.open(Source(str(local))) as shard:
        assert shard.path == str(local) and shard.read_range(0, 500) == local.read_bytes()
    assert not (tmp_path / "c").exists()
    assert local.exists()
    with pytest.raises(ShardNotFoundError):
        cache.open(Source(str(tmp_path / "nope.tar")))


def test_prefetch_in_background(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    data = blob(8000, 4)
    fs.pipe_file("/wids-prefetch/s.tar", data)
    src = Source("memory://wids-prefetch/s.tar")
    cache = ShardCache(tmp_path)
    f1 = cache.prefetch(src, size=len(data))
    f2 = cache.prefetch(src, size=len(data))
    assert f2 is f1 or f1.done()
    assert f1.result(30) is None
    assert cache.contains(src.url)
    bad = cache.prefetch(Source("memory://wids-prefetch/missing.tar"))
    with pytest.raises(FileNotFoundError):
        bad.result(30)
    cache.close()
    fs.rm("/wids-prefetch", recursive=True)


def test_shards_fetched_ahead_stop_counting_when_failed_or_gone(tmp_path):
    """Shards counted as fetched ahead but never opened here (their fetch failed, another
    process read and evicted them) give their room back (main kept them counted: after a
    few announcements no shard could ever be fetched ahead again)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    size = 10_000
    for k in range(3):
        fs.pipe_file(f"/wids-ahead/s{k}.tar", blob(size, k))
    cache = ShardCache(tmp_path / "c", max_bytes=5 * size)  # a share of 3 shards ahead
    missing = [
        cache.prefetch(Source(f"memory://wids-ahead/no{k}.tar"), size=size) for k in range(3)
    ]
    for f in missing:
        with pytest.raises(FileNotFoundError):
            f.result(30)
    src = [Source(f"memory://wids-ahead/s{k}.tar") for k in range(3)]
    for f in [cache.prefetch(s, size=size) for s in src]:
        assert f.result(30) is None
    assert all(cache.contains(s.url) for s in src)
    assert not cache.may_fetch_ahead("memory://wids-ahead/next.tar", size)  # 3 held: full
    other = ShardCache(tmp_path / "c", max_bytes=5 * size)
    other.evict_to(0)  # another process's reads took the room: the copies are gone
    assert not any(cache.contains(s.url) for s in src)
    assert cache.may_fetch_ahead("memory://wids-ahead/next.tar", size)
    cache.close()
    other.close()
    fs.rm("/wids-ahead", recursive=True)


def test_files_eviction_cannot_remove_do_not_count_against_the_budget(tmp_path):
    """A data file whose record is damaged (or a user's pair of files) is neither counted nor
    removed (main counted it forever and evicted every real entry to make room for it)."""
    d = tmp_path / "c"
    cache = ShardCache(d, max_bytes=3000)

    def fill(n: int, byte: bytes):
        return lambda dest: open(dest, "wb").write(byte * n)

    for i in range(2):
        cache.open_with(f"http://h/s{i}.tar", fill(1000, b"x"), size=1000).close()
    (d / "data" / "mine.bin").write_bytes(b"u" * 2500)
    (d / "meta" / "mine.bin.json").write_text("{not json")
    assert cache.total_bytes() == 2000
    assert cache.evict_to(3000) == []
    cache.open_with("http://h/s9.tar", fill(1000, b"y"), size=1000).close()
    assert len(cache.entries()) == 3 and cache.total_bytes() == 3000
    assert (d / "data" / "mine.bin").read_bytes() == b"u" * 2500
    cache.close()


def test_a_download_without_etag_is_not_recorded_with_the_index_etag(tmp_path):
    """An answer without an ETag (a proxy dropping it, a server ignoring If-Match) is served
    only when its Last-Modified (or MD5) says it is the indexed version (main recorded the
    index's etag for it and served a same-size replacement)."""
    cache = ShardCache(tmp_path / "c", max_bytes=10**6)
    calls = []

    def answer(etag, mtime):
        def download(dest):
            calls.append(dest)
            open(dest, "wb").write(b"NEW!" * 250)
            return FileStat(1000, etag, mtime)

        return download

    url = "http://h/s0.tar"
    with pytest.raises(IndexMismatchError, match="no etag, date or MD5"):
        cache.open_with(url, answer(None, 1.7e9), expected=Fingerprint(1000, '"v1"'))
    with pytest.raises(IndexMismatchError, match="modified"):
        cache.open_with(url, answer(None, 1.8e9), expected=Fingerprint(1000, '"v1"', 1.7e9))
    assert not cache.contains(url) and len(calls) == 2
    expected = Fingerprint(1000, '"v1"', 1.7e9)
    for _ in range(2):  # the same date: the indexed version, downloaded once
        with cache.open_with(url, answer(None, 1.7e9), expected=expected) as sh:
            assert sh.read_range(0, 4) == b"NEW!"
    assert len(calls) == 3
    assert [e.etag for e in cache.entries()] == [None]
    cache.close()


def test_the_budget_opens_only_lock_files_announcing_a_download(tmp_path):
    """Counting downloads in flight stats each lock file and opens only announced (non-empty)
    ones: its cost no longer grows by an open per entry, and a FIFO someone left in locks/
    cannot hang a download (main opened every lock file, and blocked on the FIFO)."""
    cache = ShardCache(tmp_path / "c", max_bytes=10**6)
    cache.open_with("http://h/a.tar", lambda p: open(p, "wb").write(b"x" * 10), size=10).close()
    os.mkfifo(tmp_path / "c" / "locks" / "someone.lock")
    done = []

    def download() -> None:
        fill = lambda p: open(p, "wb").write(b"y" * 10)  # noqa: E731
        cache.open_with("http://h/b.tar", fill, size=10).close()
        done.append(True)

    t = threading.Thread(target=download, daemon=True)
    t.start()
    t.join(20)
    assert done == [True]
    assert cache.total_bytes() == 20


def test_pickling(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=10, keep=True, lock_timeout=5, offline=True)
    clone = pickle.loads(pickle.dumps(cache))
    assert (clone.cache_dir, clone.max_bytes, clone.keep, clone.lock_timeout, clone.offline) == (
        cache.cache_dir,
        10,
        True,
        5.0,
        True,
    )
    store = Store()
    url = store.put("s3://b/x.tar", blob(10))
    with ShardCache(tmp_path).open_with(url, store.download(url)) as shard:
        with pytest.raises(TypeError):
            pickle.dumps(shard)


def test_invalid_arguments(tmp_path):
    with pytest.raises(ValueError):
        ShardCache(tmp_path, max_bytes=-1)
    with pytest.raises(ValueError):
        ShardCache(tmp_path, lock_timeout=-1)
    ShardCache(tmp_path / "not-created")
    assert not (tmp_path / "not-created").exists()


def test_entry_names_stay_in_the_data_directory(tmp_path):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    data_dir = os.path.realpath(tmp_path / "data")

    @settings(max_examples=300, deadline=None)
    @given(st.text(min_size=1, max_size=300))
    def check(url):
        key = url_name(url)
        assert key == url_name(url)
        assert os.path.dirname(os.path.realpath(os.path.join(data_dir, key))) == data_dir
        assert key.isascii() and len(key) <= 24 + 1 + 80

    check()


def test_threads_random_opens_within_budget(tmp_path):
    import random

    store = Store(delay=0.002)
    urls = [store.put(f"s3://b/{i}/t.tar", blob(3000, i)) for i in range(6)]
    cache = ShardCache(tmp_path, max_bytes=2 * 3000, lock_timeout=60)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(60):
                u = rng.choice(urls)
                with store.open(cache, u) as shard:
                    a = rng.randrange(3000)
                    if shard.read_range(a, 3000) != store.objects[u][a:]:
                        errors.append(("bad bytes", u))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert data_bytes(cache) <= 2 * 3000
    assert listing(cache, "tmp") == []
    assert len(listing(cache, "meta")) == len(listing(cache, "data"))


def test_waiting_fetcher_takes_a_copy_fetched_meanwhile(tmp_path):
    # Regression: an opener waiting to become the fetcher must notice that another process
    # fetched the entry meanwhile, even if that copy's readers keep it shared indefinitely
    # (idle DataLoader workers do); before, it waited for the exclusive lock until timeout.
    store = Store()
    url = store.put("s3://b/raced.tar", blob(2000))
    cache = ShardCache(tmp_path, lock_timeout=10)
    cache._prepare()
    key = url_name(url)
    reader_hold = FileLock(cache.files.lockfile(key), shared=True)
    reader_hold.acquire()  # someone reading (or checking) the entry, for as long as it likes
    result = {}

    def opener():
        t0 = time.monotonic()
        with cache.open_with(url, lambda dest: pytest.fail("fetched twice"), size=2000) as s:
            result["data"] = s.read_range(0, 2000)
        result["seconds"] = time.monotonic() - t0

    t = threading.Thread(target=opener)
    t.start()
    time.sleep(0.3)  # the opener found nothing cached and waits to become the fetcher
    cache._fetch(key, url, store.download(url), Fingerprint(2000))  # "another process"
    t.join(10)
    reader_hold.release()
    assert result["data"] == store.objects[url]
    assert result["seconds"] < 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_closing_a_shard_keeps_the_parents_descriptor(tmp_path):
    store = Store()
    url = store.put("s3://b/fork.tar", blob(500))
    cache = ShardCache(tmp_path)
    shard = store.open(cache, url)
    pid = os.fork()
    if pid == 0:  # child: reads through the inherited descriptor, then closes its copy
        code = 0
        try:
            code = 0 if shard.read_range(0, 500) == store.objects[url] else 1
            shard.close()
        except BaseException:
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not shard.closed and shard.read_range(0, 10) == store.objects[url][:10]
    shard.close()
    assert cache.files.remove_if_free(url_name(url))
