"""wids.storage.source: Store; one Source contract run on local files, memory://, S3, HTTP, GCS."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from wids import IOStats, RetryPolicy
from wids.errors import (
    IndexMismatchError,
    PermanentRemoteError,
    RemoteError,
    RetriesExhaustedError,
    ShardNotFoundError,
    ShortReadError,
    WidsError,
)
from wids.storage import FileStat, Source, Store, read_ranges, redact_url

DATA = bytes((i * 7 + i // 251) % 256 for i in range(300_000))
FAST = RetryPolicy(attempts=4, max_time=10.0, backoff=0.01, max_backoff=0.05, timeout=5.0)


def test_source_local_path() -> None:
    src = Source("file:///tmp/x.tar")
    assert src.is_local and src.local_path == "/tmp/x.tar"
    assert Source("rel.tar").local_path == os.path.abspath("rel.tar")
    assert Source("s3://b/k").local_path is None
    with pytest.raises(ValueError):
        Source("")


def test_store_carries_options_retry_and_counters(tmp_path: Any) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(DATA)
    store = Store({"anon": True, "secret": "TOPSECRET1"}, FAST)
    src = store.source(str(path), size=len(DATA), etag="e1")
    assert src.store is store and src.retry == FAST and src.storage_options == store.storage_options
    assert (src.size, src.etag) == (len(DATA), "e1")
    assert src.read_range(0, 100) == DATA[:100]  # no stats given: the store's counters
    assert src.info().size == len(DATA)
    assert (store.stats.requests, store.stats.bytes_read) == (2, 100)
    own = IOStats()
    src.read_range(0, 10, own)  # a caller's own counters instead
    assert (own.requests, store.stats.requests) == (1, 2)
    assert store.secrets() == ["TOPSECRET1"]
    assert "TOPSECRET1" not in repr(store)
    with pytest.raises(TypeError):
        store.storage_options["anon"] = False  # type: ignore[index]
    assert Source(str(path)).store.storage_options == {}
    with pytest.raises(TypeError):
        Source(str(path), {"anon": True})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Store(retry=3)  # type: ignore[arg-type]


def test_store_pickles_without_its_counters() -> None:
    store = Store({"anon": True}, FAST)
    store.stats.requests = 7
    clone = pickle.loads(pickle.dumps(store))
    assert clone.storage_options == {"anon": True} and clone.retry == FAST
    assert clone.stats == IOStats()  # counters are per process
    src = pickle.loads(pickle.dumps(store.source("s3://b/k")))
    assert src.store.retry == FAST and src.store.stats.requests == 0


def test_store_of() -> None:
    store = Store({"anon": True})
    assert Store.of(store) is store
    assert Store.of(None).storage_options == {} and Store.of({"a": 1}).storage_options == {"a": 1}
    again = Store.of(store, FAST)
    assert again.retry == FAST and again.stats is store.stats
    assert again.storage_options == store.storage_options
    other = store.with_stats()
    assert other.storage_options == store.storage_options and other.stats is not store.stats


# ---------------------------------------------------------------------------------------------
# The contract, one subclass per backend


class RemoteContract:
    """Behaviour every backend must show. Subclasses provide ``make(name, data) -> url``."""

    options: dict[str, Any] = {}
    fresh_process = True  # whether a spawned process sees the same object (not for memory://)

    @pytest.fixture
    def make(self) -> Any:
        raise NotImplementedError

    @pytest.fixture
    def src(self, make: Any, request: pytest.FixtureRequest) -> Source:
        return Store(self.options, FAST).source(make(f"{request.node.name[:40]}.bin", DATA))

    @pytest.fixture
    def missing(self, make: Any) -> Source:
        url = make("exists.bin", b"x")
        return Store(self.options, FAST).source(url.replace("exists.bin", "no-such-object.bin"))

    def test_info(self, src: Source) -> None:
        st = src.info()
        assert isinstance(st, FileStat) and st.size == len(DATA)
        assert st.etag is None or (isinstance(st.etag, str) and '"' not in st.etag)
        assert st.mtime is None or abs(st.mtime - time.time()) < 3600

    def test_read_range(self, src: Source) -> None:
        stats = IOStats()
        for start, end in [(0, 1), (0, 512), (1234, 56789), (len(DATA) - 10, len(DATA))]:
            assert src.read_range(start, end, stats) == DATA[start:end]
        assert src.read_range(5, 5) == b""
        assert stats.requests == 4 and stats.retries == 0 and stats.errors == 0
        assert stats.bytes_read == 1 + 512 + (56789 - 1234) + 10

    def test_bad_ranges(self, src: Source) -> None:
        with pytest.raises(ValueError):
            src.read_range(10, 5)
        with pytest.raises(ValueError):
            src.read_range(-1, 5)
        with pytest.raises(TypeError):
            src.read_range(0.0, 5)  # type: ignore[arg-type]

    def test_read_past_end_never_returns_short_data(self, src: Source) -> None:
        with pytest.raises(RemoteError) as info:
            src.read_range(len(DATA) - 10, len(DATA) + 10)
        assert isinstance(info.value, (ShortReadError, PermanentRemoteError))
        with pytest.raises(RemoteError):
            src.read_range(len(DATA) + 10, len(DATA) + 20)

    def test_read_ranges(self, src: Source, make: Any) -> None:
        other = Store(self.options, FAST).source(make("other.bin", DATA[::-1]))
        spans = [(i * 997 % 290_000, i * 997 % 290_000 + 1 + i * 13) for i in range(150)]
        reqs = [(src if i % 3 else other, s, e) for i, (s, e) in enumerate(spans)]
        reqs.append((src, 7, 7))
        stats = IOStats()
        out = read_ranges(reqs, stats, max_concurrency=8)
        for (s_, start, end), data in zip(reqs, out, strict=True):
            want = (DATA if s_ is src else DATA[::-1])[start:end]
            assert data == want
        assert stats.bytes_read == sum(e - s for _, s, e in reqs)
        assert stats.retries == 0 and stats.errors == 0
        assert read_ranges([]) == []

    def test_read_ranges_error(self, src: Source, missing: Source) -> None:
        with pytest.raises(ShardNotFoundError):
            read_ranges([(src, 0, 10), (missing, 0, 10)])

    def test_open_stream(self, src: Source) -> None:
        stats = IOStats()
        with src.open_stream(stats) as f:
            assert f.stat.size == len(DATA)  # type: ignore[attr-defined]
            assert f.read(512) == DATA[:512]
            assert f.read(100_000) == DATA[512:100_512]
            assert f.read() == DATA[100_512:]
            assert f.read(10) == b""
        assert stats.bytes_read == len(DATA)
        with src.open_stream() as f:
            f.seek(1000)
            assert f.read(10) == DATA[1000:1010]

    def test_download(self, src: Source, tmp_path: Any) -> None:
        dest = tmp_path / "copy.bin"
        st = src.download(str(dest), expected_size=len(DATA))
        assert dest.read_bytes() == DATA and st.size == len(DATA)

    def test_download_size_mismatch(self, src: Source, tmp_path: Any) -> None:
        dest = tmp_path / "copy.bin"
        with pytest.raises(IndexMismatchError):
            src.download(str(dest), expected_size=len(DATA) + 1)
        assert not dest.exists()

    def test_missing(self, missing: Source, tmp_path: Any) -> None:
        stats = IOStats()
        for op in (
            lambda: missing.info(stats),
            lambda: missing.read_range(0, 10, stats),
            lambda: missing.open_stream(stats),
            lambda: missing.download(str(tmp_path / "d"), stats),
        ):
            t0 = time.monotonic()
            with pytest.raises(ShardNotFoundError) as info:
                op()
            assert time.monotonic() - t0 < 2.0  # not retried
            assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, WidsError)
            expected = missing.local_path if missing.is_local else redact_url(missing.url)
            assert info.value.shard == expected
        assert not (tmp_path / "d").exists()
        assert stats.retries == 0 and stats.errors == 4

    def test_pickle_does_not_mutate(self, src: Source) -> None:
        src.read_range(0, 10)
        before = dict(vars(src))
        clone = pickle.loads(pickle.dumps(src))
        assert vars(src) == before
        assert clone.url == src.url and clone.storage_options == src.storage_options
        assert clone.retry == src.retry
        assert clone._fs is None and (clone._local is None or clone._local.fd is None)
        assert clone.store.stats == IOStats()  # the counters stay in this process
        assert clone.read_range(100, 200) == DATA[100:200]

    def test_pickled_after_use_reads_in_fresh_process(self, src: Source) -> None:
        if not self.fresh_process:
            pytest.skip("memory:// is private to one process")
        src.read_range(0, 10)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            got = pool.submit(_read_in_child, pickle.dumps(src), 1000, 3000).result(120)
        assert got == DATA[1000:3000]

    def test_read_after_fork(self, src: Source) -> None:
        src.read_range(0, 10)  # opens the filesystem (and its event loop) in the parent
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            got = pool.submit(_read_ranges_in_child, src, [(5, 50), (2000, 2500)]).result(120)
        assert got == [DATA[5:50], DATA[2000:2500]]
        assert src.read_range(10, 20) == DATA[10:20]


def _read_in_child(blob: bytes, start: int, end: int) -> bytes:
    return pickle.loads(blob).read_range(start, end)


def _read_ranges_in_child(src: Source, spans: list[tuple[int, int]]) -> list[bytes]:
    return read_ranges([(src, s, e) for s, e in spans])


class TestLocal(RemoteContract):
    @pytest.fixture
    def make(self, tmp_path: Any) -> Any:
        def make(name: str, data: bytes) -> str:
            (tmp_path / name).write_bytes(data)
            return str(tmp_path / name)

        return make

    def test_file_url(self, make: Any) -> None:
        url = "file://" + make("f.bin", DATA)
        assert Source(url).read_range(3, 9) == DATA[3:9]

    def test_local_short_read_is_not_retried(self, make: Any) -> None:
        src = Store(retry=FAST).source(make("short.bin", DATA[:100]))
        stats = IOStats()
        with pytest.raises(ShortReadError):
            src.read_range(50, 150, stats)
        assert stats.requests == 1 and stats.errors == 1

    def test_descriptor_reused_and_closed(self, make: Any) -> None:
        src = Source(make("fd.bin", DATA))
        src.read_range(0, 1)
        assert src._local is not None
        fd = src._local.fd
        src.read_range(1, 2)
        assert src._local.fd == fd is not None
        src.close()
        assert src._local.fd is None
        assert src.read_range(2, 3) == DATA[2:3]


class TestMemory(RemoteContract):
    fresh_process = False

    @pytest.fixture
    def make(self, request: pytest.FixtureRequest) -> Any:
        fs = fsspec.filesystem("memory")
        prefix = f"/wids-test-remote/{request.node.name}"

        def make(name: str, data: bytes) -> str:
            fs.pipe_file(f"{prefix}/{name}", data)
            return f"memory://{prefix}/{name}"

        yield make
        fs.rm(prefix, recursive=True)


class _ServerContract(RemoteContract):
    server_fixture = ""

    @pytest.fixture
    def server(self, request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue(self.server_fixture)

    @pytest.fixture
    def make(self, server: Any, request: pytest.FixtureRequest) -> Any:
        self.options = server.storage_options
        prefix = f"contract/{type(self).__name__}/{request.node.name[:60]}"

        def make(name: str, data: bytes) -> str:
            return server.put_bytes(data, f"{prefix}/{name}")

        return make


@pytest.mark.servers
class TestS3(_ServerContract):
    server_fixture = "s3_server"

    def test_no_bucket_is_permanent(self, server: Any) -> None:
        src = Store(server.storage_options, FAST).source("s3://no-such-bucket-wids/x.tar")
        stats = IOStats()
        with pytest.raises(PermanentRemoteError):
            src.read_range(0, 10, stats)
        with pytest.raises(PermanentRemoteError):
            src.info(stats)
        assert stats.retries == 0

    def test_credentials_never_in_messages(self, server: Any) -> None:
        secret = "s3cr3t-VALUE-for-test"
        opts = {**server.storage_options, "key": "AKIDTESTKEY", "secret": secret}
        src = Store(opts, FAST).source("s3://no-such-bucket-wids/x.tar")
        with pytest.raises(WidsError) as info:
            src.read_range(0, 10)
        text = "".join(traceback.format_exception(info.value))
        assert secret not in text and "AKIDTESTKEY" not in text
        assert secret not in repr(src) and secret not in str(pickle.loads(pickle.dumps(info.value)))


@pytest.mark.servers
class TestHTTP(_ServerContract):
    server_fixture = "http_server"

    def test_forbidden_is_permanent(self, server: Any) -> None:
        src = Store({}, FAST).source(server.url("forbidden/x.tar"))
        stats = IOStats()
        with pytest.raises(PermanentRemoteError) as info:
            src.read_range(0, 10, stats)
        assert info.value.status == 403  # type: ignore[attr-defined]
        assert stats.requests == 1 and stats.retries == 0

    def test_signed_url_redacted_in_errors(self, server: Any) -> None:
        src = Store({}, FAST).source(server.url("nothing.tar") + "?X-Amz-Signature=TOPSECRET&v=2")
        with pytest.raises(ShardNotFoundError) as info:
            src.read_range(0, 10)
        text = "".join(traceback.format_exception(info.value))
        assert "TOPSECRET" not in text and "v=2" in text
        assert "TOPSECRET" not in repr(src)

    def test_one_request_per_range(self, server: Any, src: Source) -> None:
        name = src.url.split("/", 3)[3]
        src.read_range(0, 10)
        server.reset_counts()
        read_ranges([(src, i * 1000, i * 1000 + 10) for i in range(20)])
        assert server.request_count(name) == 20
        server.reset_counts()
        with src.open_stream() as f:
            f.read()
        assert server.request_count(name) == 2  # one stat, one GET

    def test_stream_is_one_get(self, server: Any) -> None:
        name = "contract/stream/big.bin"
        data = os.urandom(5 << 20)
        src = Store({}, FAST).source(server.put_bytes(data, name))
        server.reset_counts()
        stats = IOStats()
        with src.open_stream(stats) as f:
            assert f.read(100) == data[:100]
            assert f.read() == data[100:]
        assert server.request_count(name) == 2  # HEAD, then one streaming GET
        assert stats.requests == 2 and stats.bytes_read == len(data)

    def test_stream_refuses_a_replaced_file(self, server: Any) -> None:
        name = "contract/stream/replaced.bin"
        data = os.urandom(3 << 20)
        src = Store({}, FAST).source(server.put_bytes(data, name))
        with src.open_stream() as f:
            assert f.read(1000) == data[:1000]
            server.put_bytes(os.urandom(len(data) + 1), name)
            f.seek(2 << 20)  # past what was fetched: the stream reopens, If-Match fails
            with pytest.raises(IndexMismatchError, match="changed while it was read"):
                f.read(10)

    def test_refused_connection_is_retried_then_exhausted(self) -> None:
        from serverfixtures import free_port

        src = Store({}, FAST).source(f"http://127.0.0.1:{free_port()}/x.tar")
        stats = IOStats()
        with pytest.raises(RetriesExhaustedError):
            src.read_range(0, 10, stats)
        assert stats.requests == FAST.attempts


@pytest.mark.servers
class TestGCS(_ServerContract):
    server_fixture = "gcs_server"


class ChangingMemoryFileSystem(MemoryFileSystem):
    """memory:// where somebody overwrites the object right after its first block is read."""

    protocol = "changingmem"
    replacement = b""

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("changingmem://"))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any):
        data = super().cat_file(path, start=start, end=end, **kw)
        if start == 0 and type(self).replacement:
            self.pipe_file(path, type(self).replacement)
            type(self).replacement = b""
        return data


def test_download_refuses_a_file_changed_midway(tmp_path: Any) -> None:
    fsspec.register_implementation("changingmem", ChangingMemoryFileSystem, clobber=True)
    fs = fsspec.filesystem("changingmem")
    big = os.urandom((16 << 20) + 100)
    fs.pipe_file("/changing/x.bin", big)
    src = Store(retry=FAST).source("changingmem://changing/x.bin")
    assert src.download(str(tmp_path / "a"), expected_size=len(big)).size == len(big)
    ChangingMemoryFileSystem.replacement = os.urandom(len(big) + 1)
    try:
        with pytest.raises(IndexMismatchError, match="changed while"):
            src.download(str(tmp_path / "b"), expected_size=len(big))
        assert not (tmp_path / "b").exists()
    finally:
        ChangingMemoryFileSystem.replacement = b""
        fs.rm_file("/changing/x.bin")
