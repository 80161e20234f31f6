"""Remote reads through a fault-injecting proxy, the dataset on every real server, integrity.

Run with ``-s`` to see, per test, how many faults were injected and survived.
"""

from __future__ import annotations

import hashlib
import os
import random
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from faultproxy import FaultPlan, FaultProxy
from tar_oracle import dataset_samples, strip_meta

from wids import IOStats, RetryPolicy, ShardListDataset, build_index
from wids.errors import (
    CorruptReadError,
    IndexMismatchError,
    PermanentRemoteError,
    RetriesExhaustedError,
    ShardNotFoundError,
    ShortReadError,
)
from wids.storage import Source, Store, read_ranges
from wids.synth import write_dataset

pytestmark = pytest.mark.servers

DATA = bytes(random.Random(6).randbytes(400_000))
POLICY = RetryPolicy(attempts=6, max_time=30.0, backoff=0.01, max_backoff=0.1, timeout=1.0)
TRANSIENT = ("drop", "delay", "500", "503", "429", "truncate", "short", "stall")
# Kinds where each injected fault costs exactly one of our attempts. For drop/truncate the
# backends sometimes retry inside one attempt (aiohttp on a reused connection, s3fs on
# connection errors), so our count can be lower than the injected one.
ONE_TO_ONE = ("500", "503", "429", "short", "stall")


class Through:
    """An upstream server seen through a fault proxy: URLs and storage options for wids."""

    def __init__(self, server: Any, proxy: FaultProxy) -> None:
        self.server = server
        self.proxy = proxy
        if server.protocol == "s3":
            self.storage_options = {
                **server.storage_options,
                "client_kwargs": {"endpoint_url": proxy.base, "region_name": "us-east-1"},
            }
        else:
            self.storage_options = dict(server.storage_options)

    def url(self, name: str) -> str:
        return self.proxy.url(name) if self.server.protocol == "http" else self.server.url(name)

    def source(self, name: str, retry: RetryPolicy = POLICY) -> Source:
        return Store(self.storage_options, retry).source(self.url(name))


@pytest.fixture(params=["http", "s3"])
def upstream(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def through(upstream: Any, fault_proxy: Any) -> Through:
    base = upstream.base if upstream.protocol == "http" else upstream.endpoint
    return Through(upstream, fault_proxy(base))


def _summary(label: str, proxy: FaultProxy, stats: IOStats | Any) -> str:
    injected = sum(proxy.injected.values())
    text = (
        f"{label}: requests={proxy.requests} injected={injected} {dict(proxy.injected)} "
        f"retries={stats.retries} errors={stats.errors}"
    )
    print(text)
    return text


# ---------------------------------------------------------------------------------------------
# Every fault kind, one operation at a time


@pytest.mark.parametrize("kind", TRANSIENT)
def test_transient_fault_survived(through: Through, kind: str) -> None:
    name = f"faults/transient-{kind}.bin"
    through.server.put_bytes(DATA, name)
    src = through.source(name)
    proxy = through.proxy
    stats = IOStats()
    spans = [(i * 31_337 % 390_000, i * 31_337 % 390_000 + 777 + i) for i in range(12)]
    ops = {
        "info": lambda: src.info(stats).size == len(DATA),
        "read_range": lambda: src.read_range(1000, 250_000, stats) == DATA[1000:250_000],
        "read_ranges": lambda: (
            read_ranges([(src, s, e) for s, e in spans], stats) == [DATA[s:e] for s, e in spans]
        ),
        "open_stream": lambda: _read_stream(src, stats) == DATA,
    }
    t0 = time.monotonic()
    for op, run in ops.items():
        proxy.set_plan(FaultPlan({kind: 1}, rate=1.0, max_faults=2, only=name, delay=0.1))
        before = stats.retries
        requests_before = stats.requests
        assert run(), f"{kind}: wrong bytes from {op}"
        if kind in ONE_TO_ONE and op in ("read_range", "read_ranges"):
            # (not stat: fsspec's HTTP info() tries HEAD, then GET, within one attempt)
            assert stats.retries - before == 2, f"{kind} {op}: {stats}"
        if kind in ONE_TO_ONE and op == "read_ranges":  # only the failed ranges were repeated
            assert stats.requests - requests_before == len(spans) + 2, f"{kind} {op}: {stats}"
    elapsed = time.monotonic() - t0
    msg = _summary(f"{through.server.protocol} {kind}", proxy, stats)
    injected = proxy.injected[kind]
    assert injected >= 6, msg  # body faults are not injected into HEAD requests
    assert stats.errors == 0, msg
    assert stats.retries <= injected, msg
    if kind in ONE_TO_ONE:
        assert stats.retries >= 4, msg
    assert elapsed < 8 * POLICY.timeout + 5, msg


def _read_stream(src: Source, stats: IOStats) -> bytes:
    with src.open_stream(stats) as f:
        return f.read()


@pytest.mark.parametrize(
    ("status", "error"), [(403, PermanentRemoteError), (404, ShardNotFoundError)]
)
def test_permanent_fault_raises_at_once(through: Through, status: int, error: type) -> None:
    name = f"faults/permanent-{status}.bin"
    through.server.put_bytes(DATA, name)
    src = through.source(name)
    src.info()  # start the client outside the timed part (botocore loads its models: CPU time)
    through.proxy.set_plan(FaultPlan(permanent={name: status}))
    stats = IOStats()
    for op in (lambda: src.info(stats), lambda: src.read_range(0, 100, stats)):
        t0 = time.monotonic()
        with pytest.raises(error) as info:
            op()
        assert time.monotonic() - t0 < 2.0  # no retries: one round trip
        assert info.value.shard == src.url
    msg = _summary(f"{through.server.protocol} permanent {status}", through.proxy, stats)
    assert stats.retries == 0 and stats.errors == 2, msg
    assert through.proxy.injected[str(status)] >= 2, msg


@pytest.mark.parametrize("kind", [k for k in TRANSIENT if k != "delay"])
def test_persistent_fault_exhausts_retries(through: Through, kind: str) -> None:
    name = f"faults/persistent-{kind}.bin"
    through.server.put_bytes(DATA, name)
    policy = RetryPolicy(attempts=3, max_time=10.0, backoff=0.01, max_backoff=0.05, timeout=0.5)
    src = through.source(name, policy)
    src.info()  # start the client outside the timed part
    through.proxy.set_plan(FaultPlan({kind: 1}, rate=1.0, only=name))
    through.proxy.reset_counts()
    stats = IOStats()
    t0 = time.monotonic()
    expected = ShortReadError if kind == "short" else RetriesExhaustedError
    with pytest.raises(expected) as info:
        src.read_range(0, 100_000, stats)
    elapsed = time.monotonic() - t0
    msg = _summary(f"{through.server.protocol} persistent {kind}", through.proxy, stats)
    assert elapsed < policy.attempts * (policy.timeout + policy.max_backoff) + 1.5, msg
    assert info.value.attempts == policy.attempts, msg  # type: ignore[attr-defined]
    assert stats.requests == 3 and stats.retries == 2 and stats.errors == 1, msg
    assert through.proxy.forwarded == 0, msg
    if kind == "stall":
        assert "timeout" in str(info.value).lower() or "no answer" in str(info.value), msg


def test_max_time_bounds_retries(through: Through) -> None:
    name = "faults/max-time.bin"
    through.server.put_bytes(DATA, name)
    policy = RetryPolicy(attempts=10_000, max_time=1.5, backoff=0.05, max_backoff=0.2, timeout=0.4)
    src = through.source(name, policy)
    src.info()  # start the client outside the timed part
    through.proxy.set_plan(FaultPlan({"503": 1, "stall": 1}, rate=1.0, only=name, seed=3))
    stats = IOStats()
    t0 = time.monotonic()
    with pytest.raises(RetriesExhaustedError):
        src.read_range(0, 10, stats)
    elapsed = time.monotonic() - t0
    msg = _summary(f"{through.server.protocol} max_time", through.proxy, stats)
    assert elapsed < policy.max_time + 0.5, msg


# ---------------------------------------------------------------------------------------------
# The dataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = tmp_path_factory.mktemp("faultds")
    return write_dataset(
        str(d), shards=3, samples_per_shard=25, real_images=False, jpg_bytes=4000, extra_fields=True
    )


@pytest.fixture(scope="module")
def oracle(shards: list[str]) -> list[dict[str, Any]]:
    return dataset_samples(shards)


def _upload(server: Any, shards: list[str], prefix: str) -> list[str]:
    return [server.put(p, f"{prefix}/{os.path.basename(p)}") for p in shards]


def _check_dataset(ds: ShardListDataset, oracle: list[dict[str, Any]]) -> None:
    assert len(ds) == len(oracle)
    for i in range(len(ds)):
        assert strip_meta(ds[i]) == oracle[i], f"sample {i}"
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    for k in range(0, len(order), 16):
        batch = order[k : k + 16]
        got = ds.__getitems__(batch)
        assert [strip_meta(s) for s in got] == [oracle[i] for i in batch]


def _cache_files(cache_dir: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (cache_dir / "data").rglob("*")
        if p.is_file()
    }


def _hashes(paths: list[str]) -> set[str]:
    return {hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


@pytest.mark.parametrize("access", ["range", "shard"])
def test_dataset_correct_on_every_server(
    remote_server: Any, shards: list[str], oracle: list[dict[str, Any]], access: str, tmp_path: Path
) -> None:
    urls = _upload(remote_server, shards, f"clean-{access}")
    index = str(tmp_path / "index.json")
    build_index(urls, index, storage_options=remote_server.storage_options, name="clean")
    ds = ShardListDataset(
        index,
        transformations=[],
        access=access,
        cache_dir=str(tmp_path / "cache") if access == "shard" else None,
        storage_options=remote_server.storage_options,
    )
    _check_dataset(ds, oracle)
    if access == "shard":
        assert set(_cache_files(tmp_path / "cache").values()) == _hashes(shards)
    ds.close()


@pytest.mark.parametrize("access", ["range", "shard", "auto"])
def test_dataset_through_faults(
    through: Through,
    shards: list[str],
    oracle: list[dict[str, Any]],
    access: str,
    tmp_path: Path,
) -> None:
    prefix = f"faulty-{access}"
    _upload(through.server, shards, prefix)
    urls = [through.url(f"{prefix}/{os.path.basename(p)}") for p in shards]
    kinds = {k: 1.0 for k in TRANSIENT}
    kinds["stall"] = 0.2
    policy = RetryPolicy(attempts=8, max_time=30.0, backoff=0.01, max_backoff=0.1, timeout=0.5)
    through.proxy.set_plan(FaultPlan(kinds, rate=0.25, only=prefix, delay=0.05, seed=11))
    index = str(tmp_path / "index.json")
    # The build runs under the same policy (a Store passes through ``storage_options``): with
    # the default one, each stall injected into the scan would cost its 30 s timeout.
    store = Store(through.storage_options, policy)
    build_index(urls, index, storage_options=store, name="faulty", jobs=2)
    ds = ShardListDataset(
        index,
        transformations=[],
        access=access,
        cache_dir=str(tmp_path / "cache") if access != "range" else None,
        storage_options=through.storage_options,
        retry=policy,
    )
    _check_dataset(ds, oracle)
    msg = _summary(f"{through.server.protocol} dataset {access}", through.proxy, ds.stats)
    assert sum(through.proxy.injected.values()) >= 5, msg
    assert ds.stats.errors == 0, msg
    if access != "range":  # nothing corrupt ever entered the cache
        assert set(_cache_files(tmp_path / "cache").values()) <= _hashes(shards), msg
    if access == "shard":
        assert set(_cache_files(tmp_path / "cache").values()) == _hashes(shards), msg
    ds.close()


# ---------------------------------------------------------------------------------------------
# Integrity: a shard replaced on the server after indexing


@pytest.mark.parametrize("access", ["range", "shard"])
@pytest.mark.parametrize("same_size", [False, True])
def test_replaced_shard_detected(
    remote_server: Any, shards: list[str], access: str, same_size: bool, tmp_path: Path
) -> None:
    prefix = f"replaced-{access}-{same_size}"
    urls = _upload(remote_server, shards, prefix)
    index = str(tmp_path / "index.json")
    build_index(urls, index, storage_options=remote_server.storage_options)
    original = Path(shards[1]).read_bytes()
    if same_size:  # same length, different bytes: only the etag can tell
        replaced = original[:512] + bytes(reversed(original[512:1536])) + original[1536:]
    else:
        replaced = original + bytes(10240)
    assert replaced != original
    name = f"{prefix}/{os.path.basename(shards[1])}"
    remote_server.put_bytes(replaced, name)
    if remote_server.protocol == "http":  # nginx's etag is mtime-size: move the mtime on
        path = remote_server.path(name)
        st = os.stat(path)
        os.utime(path, (st.st_atime, st.st_mtime + 7))
    cache_dir = tmp_path / "cache"
    ds = ShardListDataset(
        index,
        transformations=[],
        access=access,
        cache_dir=str(cache_dir) if access == "shard" else None,
        storage_options=remote_server.storage_options,
    )
    ds[0]
    with pytest.raises(IndexMismatchError) as info:
        ds[25]
    assert os.path.basename(shards[1]) in str(info.value)
    ds.close()
    if access == "shard":
        bad = hashlib.sha256(replaced).hexdigest()
        assert bad not in set(_cache_files(cache_dir).values())


# ---------------------------------------------------------------------------------------------
# Wrong bytes of the right length: 206, the Content-Range asked for, bytes from elsewhere

WRONG_POLICY = RetryPolicy(attempts=3, max_time=20.0, backoff=0.01, max_backoff=0.05, timeout=5.0)
ONE_ATTEMPT = RetryPolicy(attempts=1, max_time=20.0, backoff=0.01, max_backoff=0.05, timeout=5.0)


def _record_length(shard: str) -> int:
    """Bytes from one sample's first header to the next's (every sample here has the same)."""
    with tarfile.open(shard) as tf:
        starts: dict[str, int] = {}
        for m in tf:
            starts.setdefault(m.name.split(".", 1)[0], m.offset)
    first, second = sorted(starts.values())[:2]
    return second - first


def _indexed(through: Through, shards: list[str], prefix: str, tmp_path: Path) -> str:
    _upload(through.server, shards, prefix)
    urls = [through.url(f"{prefix}/{os.path.basename(p)}") for p in shards]
    index = str(tmp_path / f"{prefix}.json")
    build_index(urls, index, storage_options=through.storage_options)  # through a clean proxy
    return index


@pytest.mark.parametrize("shift", ["random", "one-sample"])
def test_wrong_offset_range_reads_raise_for_every_sample(
    through: Through, shards: list[str], shift: str, tmp_path: Path
) -> None:
    """Item 5: every sample read through a proxy that serves bytes from another offset raises.

    ``one-sample`` shifts by exactly one sample's record, so the bytes at the header's place
    are a valid header, of the neighbouring sample: only the name check catches that.
    """
    prefix = f"wrong-range-{shift}"
    index = _indexed(through, shards, prefix, tmp_path)
    wrong_shift = _record_length(shards[0]) if shift == "one-sample" else None
    plan = FaultPlan({"wrong": 1}, rate=1.0, only=prefix, wrong_shift=wrong_shift, seed=5)
    through.proxy.set_plan(plan)
    ds = ShardListDataset(
        index,
        transformations=[],
        access="range",
        storage_options=through.storage_options,
        retry=WRONG_POLICY,
    )
    for i in range(len(ds)):
        with pytest.raises(CorruptReadError) as info:
            ds[i]
        err = info.value
        assert os.path.basename(shards[i // 25]) in str(err), str(err)
        assert "gave up after 3 attempts" in str(err), str(err)  # retried first
    for batch in ([0, 1, 2, 30, 31], [74, 3, 50], [60]):  # merged blocks and single reads
        with pytest.raises(CorruptReadError):
            ds.__getitems__(batch)
    msg = _summary(f"{through.server.protocol} wrong {shift}", through.proxy, ds.stats)
    assert ds.stats.retries >= 2 * len(ds), msg
    assert ds.stats.samples == 0, msg  # not one wrong sample came back
    ds.close()


def test_verified_reads_survive_a_few_wrong_answers(
    through: Through, shards: list[str], oracle: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A wrong answer is retried like a transient failure: the samples come out right."""
    prefix = "wrong-some"
    index = _indexed(through, shards, prefix, tmp_path)
    through.proxy.set_plan(FaultPlan({"wrong": 1}, rate=0.3, only=prefix, seed=9))
    policy = RetryPolicy(attempts=8, max_time=30.0, backoff=0.0, max_backoff=0.0, timeout=5.0)
    ds = ShardListDataset(
        index,
        transformations=[],
        access="range",
        storage_options=through.storage_options,
        retry=policy,
    )
    _check_dataset(ds, oracle)
    msg = _summary(f"{through.server.protocol} wrong some", through.proxy, ds.stats)
    assert through.proxy.injected["wrong"] >= 10, msg
    assert ds.stats.retries >= through.proxy.injected["wrong"] - 2, msg  # (a few merged)
    assert ds.stats.errors == 0, msg
    ds.close()


def test_wrong_download_is_never_cached(
    through: Through, shards: list[str], oracle: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Item 5: a whole-shard download with wrong bytes (right size and etag) is not published.

    ``access="shard"`` raises and keeps nothing, also on a second run; ``access="auto"``
    keeps serving right samples by (verified) range reads while its promotions fail; once the
    proxy is clean, the shards are cached correctly.
    """
    prefix = "wrong-download"
    index = _indexed(through, shards, prefix, tmp_path)
    cache_dir = tmp_path / "cache"
    shard_size = os.path.getsize(shards[0])
    plan = FaultPlan({"wrong": 1}, rate=1.0, only=prefix, wrong_min=shard_size // 2, seed=2)
    through.proxy.set_plan(plan)

    def dataset(access: str) -> ShardListDataset:
        return ShardListDataset(
            index,
            transformations=[],
            access=access,
            cache_dir=str(cache_dir),
            storage_options=through.storage_options,
            retry=WRONG_POLICY,
            promote_share=0.0,
        )

    for _ in range(2):  # a second run does not find a corrupt copy either
        ds = dataset("shard")
        with pytest.raises(CorruptReadError, match="not what the index records") as info:
            ds[0]
        assert os.path.basename(shards[0]) in str(info.value)
        ds.close()
        assert _cache_files(cache_dir) == {}
    ds = dataset("auto")
    for i in range(len(ds)):  # range reads (of one sample each) stay right; promotions fail
        assert strip_meta(ds[i]) == oracle[i], f"sample {i}"
    ds.close()
    msg = _summary(f"{through.server.protocol} wrong download", through.proxy, ds.stats)
    assert through.proxy.injected["wrong"] >= 4, msg
    assert _cache_files(cache_dir) == {}, msg
    through.proxy.set_plan(FaultPlan())
    ds = dataset("shard")
    _check_dataset(ds, oracle)
    ds.close()
    assert set(_cache_files(cache_dir).values()) == _hashes(shards)


@pytest.fixture(scope="module")
def big_shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("bigshard")
    (path,) = write_dataset(
        str(d), shards=1, samples_per_shard=60, real_images=False, jpg_bytes=50_000, seed=4
    )
    assert os.path.getsize(path) > 5 << 19  # the first MiB arrives before the cut
    return path


def test_resumed_download_with_wrong_bytes_is_not_cached(
    http_server: Any, fault_proxy: Any, big_shard: str, tmp_path: Path
) -> None:
    """Item 5 as reported: the download is cut, resumed from a server that sends wrong bytes."""
    through = Through(http_server, fault_proxy(http_server.base))
    index = _indexed(through, [big_shard], "wrong-resumed", tmp_path)
    plan = FaultPlan(script=("truncate", "wrong"), only="wrong-resumed", methods=("GET",))
    through.proxy.set_plan(plan)
    samples = dataset_samples([big_shard])
    cache_dir = tmp_path / "cache"
    ds = ShardListDataset(
        index,
        transformations=[],
        access="shard",
        cache_dir=str(cache_dir),
        storage_options=through.storage_options,
        retry=WRONG_POLICY,
    )
    # the copy that failed its check is fetched again within the retry policy, not raised
    assert strip_meta(ds[0]) == samples[0]
    ds.close()
    assert dict(through.proxy.injected) == {"truncate": 1, "wrong": 1}
    assert set(_cache_files(cache_dir).values()) == _hashes([big_shard])  # never the wrong bytes
    # with no attempt left, the wrong copy is an error and nothing is cached
    through.proxy.set_plan(FaultPlan(script=("truncate", "wrong"), only="wrong-resumed"))
    cache_dir = tmp_path / "cache2"
    ds = ShardListDataset(
        index,
        transformations=[],
        access="shard",
        cache_dir=str(cache_dir),
        storage_options=through.storage_options,
        retry=ONE_ATTEMPT,
    )
    with pytest.raises(CorruptReadError, match="not what the index records"):
        ds[0]
    ds.close()
    assert _cache_files(cache_dir) == {}


# ---------------------------------------------------------------------------------------------
# Item 6: a shard replaced after a process's first read


def _relabelled(original: bytes, shard: str, sample: int) -> bytes:
    """The shard with 8 bytes of one sample's data changed: same size, same headers."""
    with tarfile.open(shard) as tf:
        keys: list[str] = []
        for m in tf:
            key = m.name.split(".", 1)[0]
            if not keys or keys[-1] != key:
                keys.append(key)
            if len(keys) == sample + 1 and m.size >= 8:
                a = m.offset_data
                break
    out = bytearray(original)
    out[a : a + 8] = bytes(255 - b for b in out[a : a + 8])
    return bytes(out)


@pytest.mark.parametrize("reopen", [False, True])
def test_shard_replaced_after_first_read(
    remote_server: Any,
    shards: list[str],
    oracle: list[dict[str, Any]],
    reopen: bool,
    tmp_path: Path,
) -> None:
    """Item 6: reads after a same-size rewrite raise IndexMismatchError, never new bytes.

    HTTP and S3 reads are conditional (If-Match the etag): caught on the open reader. GCS reads
    are not; its reader is stat'ed again when reopened (``reopen``: evicted from the LRU).
    """
    protocol = remote_server.protocol
    if protocol == "gs" and not reopen:
        pytest.skip("GCS reads are not conditional: a change is caught when a reader reopens")
    prefix = f"replaced-later-{reopen}"
    urls = _upload(remote_server, shards, prefix)
    index = str(tmp_path / "index.json")
    build_index(urls, index, storage_options=remote_server.storage_options)
    ds = ShardListDataset(
        index,
        transformations=[],
        access="range",
        storage_options=remote_server.storage_options,
        lru_size=1,
    )
    assert strip_meta(ds[25]) == oracle[25]  # shard 1 is open and verified
    assert strip_meta(ds[26]) == oracle[26]
    original = Path(shards[1]).read_bytes()
    replaced = _relabelled(original, shards[1], 2)
    assert len(replaced) == len(original) and replaced != original
    name = f"{prefix}/{os.path.basename(shards[1])}"
    remote_server.put_bytes(replaced, name)
    if protocol == "http":  # nginx's etag is mtime-size: move the mtime on
        path = remote_server.path(name)
        st = os.stat(path)
        os.utime(path, (st.st_atime, st.st_mtime + 7))
    if reopen:
        ds[0]  # shard 0 evicts shard 1's reader
    with pytest.raises(IndexMismatchError) as info:
        ds[27]
    assert os.path.basename(shards[1]) in str(info.value)
    with pytest.raises(IndexMismatchError):
        ds.__getitems__([25, 27, 49])
    assert strip_meta(ds[0]) == oracle[0]  # shard 0 is untouched
    ds.close()
