"""wids.lock: flock locks between processes and threads, and the writer lock of an output file."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading
import time

import pytest

from wids import LockTimeoutError, WidsError
from wids.lock import FileLock, writer_lock


def _hold(path: str, shared: bool, ready, done) -> None:
    with FileLock(path, shared=shared):
        ready.set()
        done.wait(30)


def _spawn_holder(path: str, shared: bool):
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(path, shared, ready, done))
    p.start()
    assert ready.wait(30)
    return p, done


def test_exclusive_excludes_other_process(tmp_path):
    path = str(tmp_path / "a.lock")
    p, done = _spawn_holder(path, shared=False)
    try:
        t0 = time.monotonic()
        with pytest.raises(LockTimeoutError) as info:
            FileLock(path, timeout=0.2).acquire()
        assert time.monotonic() - t0 >= 0.19
        assert isinstance(info.value, TimeoutError) and isinstance(info.value, WidsError)
        assert path in str(info.value)
        assert not FileLock(path, shared=True).acquire(blocking=False)
    finally:
        done.set()
        p.join(30)
    with FileLock(path, timeout=5) as lk:
        assert lk.locked


def test_shared_locks_coexist_and_block_exclusive(tmp_path):
    path = str(tmp_path / "a.lock")
    p, done = _spawn_holder(path, shared=True)
    try:
        with FileLock(path, shared=True, timeout=1) as lk:
            assert lk.locked and lk.is_shared
        assert not FileLock(path).acquire(blocking=False)
    finally:
        done.set()
        p.join(30)


def test_waiter_gets_lock_when_released(tmp_path):
    path = str(tmp_path / "a.lock")
    p, done = _spawn_holder(path, shared=False)
    threading.Timer(0.3, done.set).start()
    t0 = time.monotonic()
    with FileLock(path, timeout=20):
        assert time.monotonic() - t0 >= 0.25
    p.join(30)


def test_two_objects_in_one_process_contend(tmp_path):
    # Per-object ownership: a second object behaves like another process.
    path = str(tmp_path / "a.lock")
    a, b = FileLock(path), FileLock(path, shared=True)
    with a:
        assert not b.acquire(blocking=False)
    assert b.acquire(blocking=False)
    assert not FileLock(path).acquire(blocking=False)
    b.release()


def test_reentrant_same_object(tmp_path):
    lk = FileLock(tmp_path / "a.lock", timeout=0)
    with lk:
        with lk:
            assert lk.locked
        assert lk.locked
        assert not FileLock(tmp_path / "a.lock").acquire(blocking=False)
    assert not lk.locked
    with pytest.raises(RuntimeError):
        lk.release()


def test_shared_then_exclusive_same_object_is_refused(tmp_path):
    lk = FileLock(tmp_path / "a.lock", shared=True)
    with lk:
        lk.shared = False
        with pytest.raises(RuntimeError):
            lk.acquire()


def test_upgrade_and_downgrade(tmp_path):
    path = str(tmp_path / "a.lock")
    lk = FileLock(path, shared=True, timeout=1)
    lk.acquire()
    other = FileLock(path, shared=True)
    assert other.acquire(blocking=False)
    with pytest.raises(LockTimeoutError):
        lk.upgrade(timeout=0.1)
    assert not lk.locked  # a failed upgrade leaves nothing held
    other.release()
    lk.acquire()
    lk.upgrade()
    assert not lk.is_shared
    assert not FileLock(path, shared=True).acquire(blocking=False)
    lk.downgrade()
    assert lk.is_shared
    probe = FileLock(path, shared=True)
    assert probe.acquire(blocking=False)
    probe.release()
    lk.release()


def test_unlink_while_waiting_restarts_on_new_file(tmp_path):
    path = str(tmp_path / "a.lock")
    holder = FileLock(path)
    holder.acquire()
    got = []

    def waiter():
        with FileLock(path, timeout=10) as w:
            got.append(os.stat(path).st_ino == os.fstat(w._fd).st_ino)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    holder.unlink()
    holder.release()
    t.join(10)
    assert got == [True]
    with pytest.raises(RuntimeError):
        FileLock(path, shared=True).unlink()


def test_unlink_needs_exclusive(tmp_path):
    lk = FileLock(tmp_path / "a.lock", shared=True)
    with lk, pytest.raises(RuntimeError):
        lk.unlink()


def test_pickles_unlocked(tmp_path):
    lk = FileLock(tmp_path / "a.lock", shared=True, timeout=3)
    with lk:
        clone = pickle.loads(pickle.dumps(lk))
    assert not clone.locked and clone.shared and clone.timeout == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_release_parent_lock(tmp_path):
    path = str(tmp_path / "a.lock")
    lk = FileLock(path)
    lk.acquire()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            if lk.locked:
                code = 1
            try:
                lk.release()
                code = 2
            except RuntimeError:
                pass
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lk.locked
    assert not FileLock(path).acquire(blocking=False)
    lk.release()


def test_negative_timeout_rejected(tmp_path):
    with pytest.raises(ValueError):
        FileLock(tmp_path / "a.lock", timeout=-1)


def test_writer_lock_leaves_no_lock_file_and_excludes_a_second_writer(tmp_path):
    dest = tmp_path / "train.json"
    with writer_lock(dest) as lk:
        assert lk.locked and os.path.exists(str(dest) + ".lock")
        with pytest.raises(LockTimeoutError):
            FileLock(str(dest) + ".lock", timeout=0).acquire()
    assert os.listdir(tmp_path) == []
    with pytest.raises(ZeroDivisionError), writer_lock(dest):
        raise ZeroDivisionError
    assert os.listdir(tmp_path) == []


def test_writer_lock_removes_a_stale_lock_but_never_a_users_file(tmp_path):
    stale = tmp_path / "a.json.lock"
    stale.write_bytes(b"")  # what older versions (or a killed writer) left behind
    with writer_lock(tmp_path / "a.json"):
        pass
    assert not stale.exists()
    mine = tmp_path / "b.json.lock"
    mine.write_bytes(b"my notes")
    with writer_lock(tmp_path / "b.json"):
        pass
    assert mine.read_bytes() == b"my notes"
