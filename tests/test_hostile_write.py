"""Writing under a hostile or careless world: a full disk, no permission, planted lock links.

A full disk is a real one: a small ``tmpfs`` mounted for the test (root only; skipped
otherwise). Permission denied is real too: the child process runs without root's
capabilities (``setpriv``), so the kernel refuses it as it refuses any user.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from tarfixtures import make_samples, write_shard

from wids import ShardWriter, WriteError, build_index
from wids.errors import OutputExistsError


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a real full disk) needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 256 KiB file system, unmounted afterwards."""
    where = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    _mount_tmpfs(where, "256k")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path, leave: int = 0) -> None:
    """Fill ``disk`` up to ``leave`` bytes of room."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    if leave:
        os.truncate(disk / "filler", os.path.getsize(disk / "filler") - leave)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("shards")
    out = [
        str(write_shard(d / f"s{i}.tar", make_samples(300, start=1000 * i, jpg_size=10)))
        for i in range(3)
    ]
    build_index(out, str(d / "i.json"))  # a dataset to subset
    return out


def _left(disk: Path) -> list[str]:
    """What a failed writer left on the disk (the filler excepted)."""
    return sorted(p.name for p in disk.rglob("*") if p.name != "filler" and p.is_file())


@pytest.mark.parametrize("suffix", [".json", ".sqlite", ".widx"])
@pytest.mark.parametrize("room", [0, 12 * 1024])
def test_index_create_on_a_full_disk_names_the_output_and_leaves_no_lock(
    small_disk: Path, shards, suffix: str, room: int
) -> None:
    _fill(small_disk, leave=room)
    out = small_disk / f"i{suffix}"
    with pytest.raises(WriteError) as e:
        build_index(shards, str(out))
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    assert str(out) in str(e.value) and "no space left" in str(e.value)
    assert str(small_disk) in str(e.value)
    left = _left(small_disk)
    assert not [n for n in left if n.endswith((".lock", ".tmp"))] and not out.exists(), left


def test_the_cli_says_which_output_has_no_room(small_disk: Path, shards) -> None:
    _fill(small_disk)
    out = small_disk / "i.json"
    argv = [sys.executable, "-m", "wids", "index", "create", *shards, "-o", str(out), "-q"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no space left on the device" in r.stderr, r.stderr
    assert str(out) in r.stderr and "Errno" not in r.stderr
    assert _left(small_disk) == []


def test_shardwriter_on_a_full_disk_is_a_write_error_naming_the_shard(small_disk: Path) -> None:
    pattern = str(small_disk / "train-%06d.tar")
    with pytest.raises(WriteError) as e, ShardWriter(pattern, maxcount=1000) as sink:
        for i in range(10_000):
            sink.write({"__key__": f"{i:06d}", "bin": os.urandom(1000)})
    assert e.value.errno == errno.ENOSPC
    assert "train-000000.tar" in str(e.value) and str(small_disk) in str(e.value)
    assert [n for n in _left(small_disk) if n.endswith((".tmp", ".lock", ".tar"))] == []


_AS_USER = """
import os, sys
from wids import ShardWriter, build_index
from wids.subset import make_subset
target, shard = sys.argv[1], sys.argv[2]
try:
    if target.endswith("/sub"):
        make_subset(os.path.join(os.path.dirname(shard), "i.json"), target, shards=slice(0, 1))
    elif target.endswith(".json"):
        build_index([shard], target)
    else:
        with ShardWriter(target, maxcount=10, index=None) as sink:
            sink.write({"__key__": "a", "txt": "x"})
except Exception as e:
    print(type(e).__name__, isinstance(e, PermissionError), getattr(e, "errno", None), e)
"""


@pytest.mark.parametrize("target", ["train-%06d.tar", "i.json", "sub"])
def test_permission_denied_is_a_typed_permission_error(tmp_path: Path, shards, target) -> None:
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to run a child without privileges")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    argv = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", _AS_USER]
    argv += [str(ro / target), shards[0]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    name, is_perm, code, message = r.stdout.strip().split(" ", 3)
    assert (name, is_perm, code) == ("WritePermissionError", "True", str(errno.EACCES))
    assert "permission denied" in message and str(ro) in message
    assert list(ro.iterdir()) == []


def test_a_planted_lock_symlink_is_not_followed(tmp_path: Path, shards) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    missing = tmp_path / "created-by-nobody"
    for target in (victim, missing):
        lock = tmp_path / "i.json.lock"
        lock.unlink(missing_ok=True)
        lock.symlink_to(target)
        with pytest.raises(OutputExistsError, match="symbolic link"):
            build_index(shards, str(tmp_path / "i.json"))
        assert lock.is_symlink() and not (tmp_path / "i.json").exists()
    assert victim.read_text() == "the user's file" and not missing.exists()


def test_a_cache_on_a_full_disk_names_shard_and_cache_and_clean_leaves_no_lock(
    small_disk: Path, http_server
) -> None:
    from wids import ShardCache, ShardListDataset

    root = http_server.root / f"full-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    shard = write_shard(root / "big.tar", make_samples(40, jpg_size=10_000))  # ~400 KB > disk
    build_index([str(shard)], str(root / "i.json"))
    url = f"{http_server.base}/{root.name}/i.json"
    ds = ShardListDataset(url, cache_dir=str(small_disk / "cache"), access="shard")
    with pytest.raises(WriteError) as e:
        ds[0]
    assert e.value.errno == errno.ENOSPC and "big.tar" in str(e.value)
    assert str(small_disk / "cache") in str(e.value) and "no space left" in str(e.value)
    ds.close()
    ShardCache(str(small_disk / "cache")).clean()
    left = [p.name for p in (small_disk / "cache").rglob("*") if p.is_file()]
    assert not [n for n in left if n.endswith((".lock", ".tmp")) or ".big.tar." in n], left
