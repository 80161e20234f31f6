"""wids.atomic: files published whole (temporary file + os.replace), with the user's umask."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from wids.atomic import TempFile, atomic_write, atomic_write_bytes, remove_stale_temps


def test_atomic_write_replaces_whole_file(tmp_path):
    dest = tmp_path / "sub" / "f.json"
    with atomic_write(dest, "w") as f:
        f.write("one")
    assert dest.read_text() == "one"
    with pytest.raises(ZeroDivisionError), atomic_write(dest, "w") as f:
        f.write("partial")
        raise ZeroDivisionError
    assert dest.read_text() == "one"
    atomic_write_bytes(dest, b"two")
    assert dest.read_bytes() == b"two"
    assert sorted(os.listdir(dest.parent)) == ["f.json"]
    with pytest.raises(ValueError):
        with atomic_write(dest, "a"):
            pass


def test_tempfile_publish_and_drop(tmp_path):
    with TempFile(tmp_path, "x.tar") as tmp:
        with open(tmp.path, "wb") as f:
            f.write(b"abc")
        assert os.path.basename(tmp.path).startswith(".x.tar.")
        tmp.publish(tmp_path / "x.tar")
    assert (tmp_path / "x.tar").read_bytes() == b"abc"
    with TempFile(tmp_path, "y") as tmp:
        pass
    assert sorted(os.listdir(tmp_path)) == ["x.tar"]


def _write_forever(directory: str, ready) -> None:
    tmp = TempFile(directory, "big")
    ready.set()
    assert tmp.fd is not None
    while True:
        time.sleep(1)


def test_remove_stale_temps_only_removes_dead_writers(tmp_path):
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    live = TempFile(tmp_path, "live")
    p = ctx.Process(target=_write_forever, args=(str(tmp_path), ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert len(os.listdir(tmp_path)) == 2
    assert remove_stale_temps(tmp_path) == []  # too young
    removed = remove_stale_temps(tmp_path, min_age=0)
    assert len(removed) == 1 and "big" in removed[0]
    assert os.listdir(tmp_path) == [os.path.basename(live.path)]
    live.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_published_files_get_the_users_umask_not_0600(tmp_path, umask):
    """Index files, sidecars, subset copies and cache entries all go through TempFile."""
    old = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "a.json", b"{}")
        with TempFile(tmp_path, "b.tar") as tmp:
            tmp.publish(tmp_path / "b.tar")
    finally:
        os.umask(old)
    for name in ("a.json", "b.tar"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
