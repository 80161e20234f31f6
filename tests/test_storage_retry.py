"""wids.storage.retry: the policy, failures sorted into kinds, retries of a flaky filesystem."""

from __future__ import annotations

import errno
import time
import traceback
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from recordingserver import RecordingServer
from tarfixtures import make_samples, write_shard

from wids import IOStats, RetryPolicy, ShardListDataset, build_index
from wids.errors import (
    PermanentRemoteError,
    RetriesExhaustedError,
    ShortReadError,
)
from wids.storage import Store
from wids.storage.retry import classify

DATA = bytes((i * 7 + i // 251) % 256 for i in range(300_000))
FAST = RetryPolicy(attempts=4, max_time=10.0, backoff=0.01, max_backoff=0.05, timeout=5.0)


@pytest.mark.parametrize(
    "kwargs", [{"attempts": 0}, {"max_time": 0}, {"timeout": -1}, {"backoff": -0.1}]
)
def test_retry_policy_validates(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def _http_error(status: int) -> Exception:
    import aiohttp

    info = aiohttp.RequestInfo(url=None, method="GET", headers=None, real_url=None)  # type: ignore[arg-type]
    return aiohttp.ClientResponseError(info, (), status=status)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (FileNotFoundError("x"), "not found"),
        (PermissionError("x"), "permanent"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "transient"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "transient"),
        (TimeoutError(), "transient"),
        (OSError(errno.EIO, "s3 unknown error"), "transient"),
        (OSError(errno.EBUSY, "SlowDown"), "transient"),
        (OSError(errno.EINVAL, "InvalidRange"), "permanent"),
        (OSError("Forbidden: gcs"), "permanent"),
        (ValueError("a bug"), "unknown"),
        (ShortReadError("short"), "transient"),
    ],
)
def test_classify_builtin(exc: BaseException, kind: str) -> None:
    assert classify(exc) == kind


@pytest.mark.parametrize(
    ("status", "kind"),
    [(404, "not found"), (403, "permanent"), (416, "permanent"), (401, "permanent")]
    + [(s, "transient") for s in (429, 500, 502, 503, 504, 408)],
)
def test_classify_http_status(status: int, kind: str) -> None:
    assert classify(_http_error(status)) == kind
    # fsspec's HTTP info() wraps every failure in FileNotFoundError: the cause decides
    wrapped = FileNotFoundError("url")
    wrapped.__cause__ = _http_error(status)
    assert classify(wrapped) == kind


# ---------------------------------------------------------------------------------------------
# A flaky sync filesystem (a stand-in for a misbehaving backend, not for the code under test)


class FlakyMemoryFileSystem(MemoryFileSystem):
    """memory:// whose reads fail with ``failure`` the first ``fail_first`` times."""

    protocol = "flakymem"
    fail_first = 0
    failure: BaseException = ConnectionResetError(errno.ECONNRESET, "reset by test")
    calls = 0

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("flakymem://"))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any):
        type(self).calls += 1
        if type(self).calls <= type(self).fail_first:
            raise type(self).failure
        return super().cat_file(path, start=start, end=end, **kw)


@pytest.fixture
def flaky() -> type[FlakyMemoryFileSystem]:
    fsspec.register_implementation("flakymem", FlakyMemoryFileSystem, clobber=True)
    FlakyMemoryFileSystem.calls = 0
    FlakyMemoryFileSystem.fail_first = 0
    fs = fsspec.filesystem("flakymem")
    fs.pipe_file("/flaky/x.bin", DATA)
    yield FlakyMemoryFileSystem
    fs.rm_file("/flaky/x.bin")


def test_transient_failures_are_retried(flaky: type[FlakyMemoryFileSystem]) -> None:
    flaky.fail_first = 3
    stats = IOStats()
    data = Store(retry=FAST).source("flakymem://flaky/x.bin").read_range(10, 1000, stats)
    assert data == DATA[10:1000]
    assert stats == IOStats(requests=4, bytes_read=990, retries=3, errors=0)


def test_retries_exhausted_after_attempts(flaky: type[FlakyMemoryFileSystem]) -> None:
    flaky.fail_first = 100
    stats = IOStats()
    with pytest.raises(RetriesExhaustedError) as info:
        Store(retry=FAST).source("flakymem://flaky/x.bin").read_range(10, 1000, stats)
    assert info.value.attempts == FAST.attempts  # type: ignore[attr-defined]
    assert stats.requests == FAST.attempts and stats.retries == FAST.attempts - 1
    assert stats.errors == 1
    assert "flakymem://flaky/x.bin" in str(info.value) and "ConnectionResetError" in str(info.value)


def test_retries_bounded_by_max_time(flaky: type[FlakyMemoryFileSystem]) -> None:
    flaky.fail_first = 10_000
    policy = RetryPolicy(attempts=10_000, max_time=0.5, backoff=0.02, max_backoff=0.05)
    t0 = time.monotonic()
    with pytest.raises(RetriesExhaustedError):
        Store(retry=policy).source("flakymem://flaky/x.bin").read_range(0, 10)
    assert time.monotonic() - t0 < policy.max_time + 0.5


def test_permanent_failure_is_not_retried(flaky: type[FlakyMemoryFileSystem]) -> None:
    flaky.fail_first = 100
    flaky.failure = PermissionError("denied")
    stats = IOStats()
    try:
        with pytest.raises(PermanentRemoteError):
            Store(retry=FAST).source("flakymem://flaky/x.bin").read_range(0, 10, stats)
    finally:
        flaky.failure = ConnectionResetError(errno.ECONNRESET, "reset by test")
    assert stats.requests == 1 and stats.retries == 0 and stats.errors == 1


def test_unknown_exceptions_propagate_unchanged(flaky: type[FlakyMemoryFileSystem]) -> None:
    flaky.fail_first = 100
    flaky.failure = KeyError("bug")
    try:
        with pytest.raises(KeyError):
            Store(retry=FAST).source("flakymem://flaky/x.bin").read_range(0, 10)
    finally:
        flaky.failure = ConnectionResetError(errno.ECONNRESET, "reset by test")
    assert flaky.calls == 1


@pytest.mark.parametrize("access", ["range", "shard"])
def test_a_redirect_loop_is_a_permanent_error_naming_the_shard_without_its_signature(
    tmp_path: Path, access: str
) -> None:
    """A server redirecting to itself: a typed error, not aiohttp's, and no signature shown.

    Before, ``ds[i]`` raised aiohttp's ``TooManyRedirects`` (no WidsError, no shard named) whose
    text held the presigned URL's ``X-Amz-Signature``.
    """
    root = tmp_path / "www"
    root.mkdir()
    write_shard(root / "a.tar", make_samples(3, prefix="a", fields=(".txt",)))
    honest = RecordingServer(root)
    looping = RecordingServer(root, lie=lambda path, status, headers: (302, _to(path)))
    try:
        built = tmp_path / "honest.json"
        build_index([f"{honest.base}/a.tar"], str(built))
        secret = "X-Amz-Signature=0123456789abcdef0123SECRET"
        url = f"{looping.base}/a.tar?X-Amz-Credential=AKIA%2Fx&{secret}"
        index = tmp_path / "i.json"
        index.write_text(built.read_text().replace(f"{honest.base}/a.tar", url))
        ds = ShardListDataset(
            str(index), transformations=[], access=access, cache_dir=str(tmp_path / "c")
        )
        with pytest.raises(PermanentRemoteError, match="TooManyRedirects") as e:
            ds[0]
        assert e.value.shard is not None and e.value.shard.startswith(f"{looping.base}/a.tar")
        assert "SECRET" not in "".join(traceback.format_exception(e.value))
        assert len(looping.seen) <= 2 * 11  # one attempt (aiohttp's 10 hops), maybe a stat
        ds.close()
    finally:
        honest.stop()
        looping.stop()


def _to(path: str) -> dict[str, str]:
    return {"Location": path, "Content-Length": "0"}
