"""`wids show --offline`: after one online run fills the cache, no network is needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wids import ShardListDataset, build_index
from wids.synth import write_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from localservers import Nginx  # noqa: E402

pytestmark = [pytest.mark.servers]


def wids(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wids", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_show_offline_serves_from_the_cache_after_the_server_is_gone(tmp_path):
    data = tmp_path / "data"
    paths = write_dataset(
        str(data), shards=2, samples_per_shard=10, real_images=False, jpg_bytes=300
    )
    cache, empty = str(tmp_path / "cache"), str(tmp_path / "empty")
    server = Nginx(data)
    try:
        index = str(tmp_path / "remote.json")
        build_index([server.url(p) for p in paths], index)
        ds = ShardListDataset(index, transformations=[], cache_dir=cache, access="shard")
        want = [ds[i]["__key__"] for i in range(len(ds))]
        ds.close()
    finally:
        server.stop()

    r = wids("show", index, "-n", "20", "--offline", "--cache-dir", cache)
    assert r.returncode == 0, r.stderr
    assert all(key in r.stdout for key in want)

    r = wids("show", index, "-n", "3", "--offline", "--cache-dir", empty)
    assert r.returncode == 2
    assert r.stderr.startswith("wids: error:") and "Traceback" not in r.stderr
    assert "synth-000000.tar" in r.stderr  # names what is missing
