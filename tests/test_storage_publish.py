"""wids.storage.publish: destinations checked before work, files published whole, sidecars first."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from wids.errors import DestinationError, LockTimeoutError
from wids.storage import (
    Store,
    check_writable,
    destination,
    put_file,
    read_head,
    same_place,
)

SIDECAR = re.compile(r"^[0-9a-f]{4}-.*\.json$")


def _sidecars(path: str) -> str:
    return path.removesuffix(".json") + ".members"


@pytest.fixture
def mem() -> Iterator[fsspec.AbstractFileSystem]:
    fs = fsspec.filesystem("memory")
    if fs.exists("/wids-publish"):
        fs.rm("/wids-publish", recursive=True)
    yield fs
    if fs.exists("/wids-publish"):
        fs.rm("/wids-publish", recursive=True)


@pytest.mark.parametrize("url", ["http://h/x.json", "https://h/x.json", "zip::s3://b/a.zip"])
def test_check_writable_refuses_read_only_and_chained(url: str) -> None:
    with pytest.raises(DestinationError):
        check_writable(url)


def test_check_writable_accepts_local_and_writable_stores(tmp_path: Path) -> None:
    check_writable(str(tmp_path / "x.json"))
    check_writable("memory://wids-publish/x.json")


def test_same_place_resolves_local_paths(tmp_path: Path) -> None:
    (tmp_path / "a.tar").write_bytes(b"x")
    os.symlink(tmp_path / "a.tar", tmp_path / "link.tar")
    assert same_place(str(tmp_path / "link.tar"), "file://" + str(tmp_path / "a.tar"))
    assert same_place("s3://b/x/", "s3://b/x")
    assert not same_place("s3://b/x", str(tmp_path / "x"))


def test_read_head(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"0123456789")
    assert read_head(str(tmp_path / "f"), size=4) == b"0123"
    assert read_head(str(tmp_path / "f")) == b"0123456789"
    assert read_head(str(tmp_path / "missing")) is None


def test_put_file_replaces_whole_and_leaves_no_temporary(tmp_path: Path, mem) -> None:
    local = tmp_path / "x.bin"
    local.write_bytes(b"new" * 1000)
    mem.pipe("/wids-publish/x.bin", b"old")
    put_file(str(local), "memory://wids-publish/x.bin", Store())
    assert mem.cat("/wids-publish/x.bin") == b"new" * 1000
    assert mem.ls("/wids-publish", detail=False) == ["/wids-publish/x.bin"]


def test_destination_local_is_written_in_place_under_a_lock(tmp_path: Path) -> None:
    out = str(tmp_path / "train.json")
    with destination(out) as path:
        assert path == out
        with pytest.raises(LockTimeoutError), destination(out):
            pass  # a second writer of the same output is refused at once
    with destination("file://" + out) as path:
        assert path == out


def test_destination_remote_publishes_sidecars_first_then_removes_stale(
    tmp_path: Path, mem
) -> None:
    mem.pipe("/wids-publish/train.members/0000-old.json", b"stale")
    mem.pipe("/wids-publish/train.members/notes.txt", b"the user's")
    order: list[str] = []
    put = type(mem).put_file

    def recording_put(self: object, lpath: str, rpath: str, **kw: object) -> None:
        order.append(rpath.rsplit("/", 1)[-1])
        put(self, lpath, rpath, **kw)

    # on the class: wids opens its own filesystem per process, not fsspec's cached instance
    type(mem).put_file = recording_put  # type: ignore[method-assign]
    try:
        url = "memory://wids-publish/train.json"
        with destination(url, Store(), sidecar_dir=_sidecars, sidecar_name=SIDECAR) as path:
            assert path != url and path.endswith("/train.json")
            os.makedirs(_sidecars(path))
            Path(_sidecars(path), "abcd-a.tar.json").write_bytes(b"{}")
            Path(path).write_bytes(b'{"shardlist": []}')
    finally:
        type(mem).put_file = put  # type: ignore[method-assign]
    # the sidecar first; the description last (memory:// is no object store: a temporary, moved)
    assert order[0] == "abcd-a.tar.json" and order[-1].startswith(".train.json.")
    assert mem.cat("/wids-publish/train.json") == b'{"shardlist": []}'
    left = sorted(p.rsplit("/", 1)[-1] for p in mem.ls("/wids-publish/train.members", False))
    assert left == ["abcd-a.tar.json", "notes.txt"]  # the stale sidecar went, nothing else


def test_destination_remote_publishes_nothing_on_error(mem) -> None:
    url = "memory://wids-publish/train.json"
    with pytest.raises(RuntimeError), destination(url) as path:
        Path(path).write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert not mem.exists("/wids-publish/train.json")
