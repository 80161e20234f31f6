"""Offline index snapshots in the cache directory (``wids.cache.snapshots``)."""

from __future__ import annotations

import os

import fsspec
import pytest

from wids import build_index, open_index
from wids.cache import open_snapshot, save_snapshot, snapshot_path
from wids.errors import OfflineError
from wids.synth import write_dataset


def test_snapshot_roundtrip_and_refresh(tmp_path):
    paths = write_dataset(str(tmp_path / "src"), shards=3, samples_per_shard=5, real_images=False)
    fs = fsspec.filesystem("memory")
    urls = []
    for p in paths:
        url = f"memory://wids-snap/{os.path.basename(p)}"
        with open(p, "rb") as f:
            fs.pipe_file(url, f.read())
        urls.append(url)
    local_index = str(tmp_path / "i.json")
    build_index(urls, local_index, name="snap")
    with open(local_index, "rb") as f:
        fs.pipe_file("memory://wids-snap/i.json", f.read())
    index_url = "memory://wids-snap/i.json"
    cache_dir = tmp_path / "cache"
    with pytest.raises(OfflineError, match="wids-snap/i.json"):
        open_snapshot(index_url, cache_dir)
    reader = open_index(index_url)
    path = save_snapshot(reader, index_url, cache_dir)
    assert path == snapshot_path(cache_dir, index_url)
    mtime = os.stat(path).st_mtime_ns
    assert save_snapshot(reader, index_url, cache_dir) == path
    assert os.stat(path).st_mtime_ns == mtime  # unchanged remote: not rewritten
    snap = open_snapshot(index_url, cache_dir)
    assert [s.url for s in snap.shards] == urls
    assert [s.nsamples for s in snap.shards] == [5, 5, 5]
    assert [s.size for s in snap.shards] == [os.path.getsize(p) for p in paths]
    assert snap.name == "snap" and snap.members(0) is None
    fs.rm("/wids-snap", recursive=True)


def test_a_snapshot_is_published_atomically_without_a_flush_to_disk(tmp_path, monkeypatch):
    # it is written while a dataset loads, before the first batch: no fsync there
    paths = write_dataset(str(tmp_path / "src"), shards=2, samples_per_shard=3, real_images=False)
    fs = fsspec.filesystem("memory")
    urls = []
    for p in paths:
        urls.append(f"memory://wids-snap-fsync/{os.path.basename(p)}")
        fs.pipe_file(urls[-1], open(p, "rb").read())
    build_index(urls, str(tmp_path / "i.json"), name="one")
    index_url = "memory://wids-snap-fsync/i.json"
    fs.pipe_file(index_url, open(tmp_path / "i.json", "rb").read())
    cache_dir = tmp_path / "cache"
    save_snapshot(open_index(index_url), index_url, cache_dir)  # marks the cache (flushed)
    fs.pipe_file(index_url, open(tmp_path / "i.json", "rb").read().replace(b'"one"', b'"two"'))
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    path = save_snapshot(open_index(index_url), index_url, cache_dir)  # changed: rewritten
    assert synced == []
    assert open_snapshot(index_url, cache_dir).name == "two" and path is not None
    assert not [n for n in os.listdir(cache_dir / "indexes") if "tmp" in n]  # no temp left
    fs.rm("/wids-snap-fsync", recursive=True)
