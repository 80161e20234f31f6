"""The descriptor pool of local files: bounded, safe across threads, fork and pickling."""

from __future__ import annotations

import gc
import os
import pickle
import random
import sys
import threading

import pytest
from forked import in_fork

from wids.storage import DescriptorPool
from wids.storage.descriptors import default_capacity


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(24):
        p = tmp_path / f"f{i:02d}"
        p.write_bytes(bytes([i]) * 4096)
        paths.append(str(p))
    return paths


def _open_paths() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def _interleaved(work, threads: int = 8) -> None:
    """``work(seed)`` in ``threads`` threads switching between any two steps of a read."""
    running = [threading.Thread(target=work, args=(s,)) for s in range(threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in running:
            t.start()
        for t in running:
            t.join()
    finally:
        sys.setswitchinterval(interval)


def test_reads_and_bound(files):
    pool = DescriptorPool(5)
    for _ in range(3):
        for i, p in enumerate(files):
            assert pool.pread(p, 10, 100) == bytes([i]) * 10
            assert len(pool) <= 5
    assert sum(p in files for p in _open_paths()) == 5
    assert pool.pread(files[0], 10, 4090) == bytes([0]) * 6  # short at the end, like pread
    pool.discard(files[0])
    pool.close()
    assert not set(files) & set(_open_paths())
    assert pool.pread(files[3], 1, 0) == b"\x03"  # usable after close
    pool.close()


def test_a_pool_let_go_closes_its_files_at_once(files):
    """No reference cycle keeps a dropped pool (and a dataset's files) open until a GC pass."""
    pool = DescriptorPool(8)
    kept = pool.descriptor(files[0])  # a hot path's kept descriptor does not hold the pool
    for p in files[:8]:
        pool.pread(p, 1, 0)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del pool
        assert not set(files) & set(_open_paths())
    finally:
        if enabled:
            gc.enable()
    assert kept.pread(1, 0) == b""  # dropped with its pool


def test_bad_arguments_and_missing_files(files, tmp_path):
    with pytest.raises(ValueError):
        DescriptorPool(0)
    pool = DescriptorPool(2)
    with pytest.raises(FileNotFoundError):
        pool.pread(str(tmp_path / "nope"), 1, 0)
    assert len(pool) == 0
    assert 8 <= default_capacity() < 1 << 17


def test_threads_never_read_a_closed_or_reused_descriptor(files):
    """Capacity 2, eight threads over 24 files: every read returns its own file's bytes."""
    pool = DescriptorPool(2)
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(3000):
            i = rng.randrange(len(files))
            got = pool.pread(files[i], 64, rng.randrange(4000))
            if got != bytes([i]) * 64:
                errors.append(f"file {i}: {got[:4]!r}")

    _interleaved(work)
    assert errors == []
    assert len(pool) <= 2
    pool.close()
    assert not set(files) & set(_open_paths())


def test_fork_child_closes_the_inherited_copies(files):
    pool = DescriptorPool(30)
    for p in files:
        pool.pread(p, 1, 0)

    def child() -> str:  # its first use closes the parent's copies, then reads its own
        ok = pool.pread(files[5], 2, 0) == b"\x05\x05"
        n = sum(p in files for p in _open_paths())
        return f"{int(ok)} {n} {len(pool)}"

    assert in_fork(child) == "1 1 1"
    assert pool.pread(files[7], 1, 0) == b"\x07" and len(pool) == len(files)  # parent intact
    pool.close()


def test_check_process_then_pread_owned_in_a_fork_child(files):
    """The local fast path's read: the caller checks the process once, then no getpid."""
    pool = DescriptorPool(30)
    for p in files:
        pool.pread(p, 1, 0)
    pool.check_process()  # the process that made it: nothing closed
    assert len(pool) == len(files) and pool.pread_owned(files[3], 1, 0) == b"\x03"

    def child() -> str:
        pool.check_process()
        closed = sum(p in files for p in _open_paths())
        ok = pool.pread_owned(files[5], 2, 0) == b"\x05\x05"
        n = sum(p in files for p in _open_paths())
        return f"{closed} {int(ok)} {n} {len(pool)}"

    assert in_fork(child) == "0 1 1 1"
    assert pool.pread_owned(files[7], 1, 0) == b"\x07" and len(pool) == len(files)
    pool.close()


def test_pickled_pool_is_new_and_empty(files):
    pool = DescriptorPool(3)
    pool.pread(files[0], 1, 0)
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.capacity == 3 and len(copy) == 0
    assert copy.pread(files[1], 1, 0) == b"\x01"
    copy.close()
    pool.close()


_LOW_LIMIT = """
import os, resource, sys
from wids.storage import DescriptorPool
paths = sys.argv[1:]
resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
hog = []
try:
    while True:
        hog.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
for fd in hog[:6]:  # six descriptors left: the pool must live with what remains
    os.close(fd)
pool = DescriptorPool(40)
for _ in range(3):
    for i, p in enumerate(paths):
        assert pool.pread(p, 3, 0) == bytes([i]) * 3
print(len(pool))
"""


def test_out_of_descriptors_gives_back_idle_ones(files):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _LOW_LIMIT, *files],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert 1 <= int(out.stdout) <= 6


def test_a_kept_descriptor_reads_its_file_and_says_when_it_is_dropped(files):
    """A hot path keeps a ``Descriptor``; the pool still bounds them and keeps the recent ones."""
    pool = DescriptorPool(2)
    da, db = pool.descriptor(files[0]), pool.descriptor(files[1])
    assert pool.descriptor(files[0]) is da
    assert da.pread(4, 10) == b"\0" * 4
    pool.descriptor(files[2])  # room made: b was not read since it opened, a was
    assert db.dropped and db.pread(4, 10) == b""
    assert not da.dropped and da.pread(2, 4095) == b"\0"  # short at the end, like pread
    assert files[1] not in _open_paths() and files[0] in _open_paths()
    pool.close()
    assert da.dropped and da.pread(1, 0) == b""
    assert not set(files) & set(_open_paths())
    assert DescriptorPool.GONE.pread(1, 0) == b""


def test_threads_reading_kept_descriptors_never_read_another_file(files):
    """Capacity 2, eight threads keeping descriptors of 24 files and taking new ones."""
    pool = DescriptorPool(2)
    kept = [DescriptorPool.GONE] * len(files)
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(3000):
            i = rng.randrange(len(files))
            try:
                got = kept[i].pread(64, rng.randrange(4000))
            except OSError as e:  # a closed descriptor read
                errors.append(f"file {i}: {e}")
                continue
            if got == b"":  # dropped: take the pool's again (as a LocalShard does)
                kept[i] = pool.descriptor(files[i])
            elif got != bytes([i]) * 64:
                errors.append(f"file {i}: {got[:4]!r}")

    _interleaved(work)
    assert errors == []
    assert len(pool) <= 2
    pool.close()
    assert not set(files) & set(_open_paths())
