"""The README's first command runs tools/demo.py: keep it working (local files, tiny data)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

DEMO = os.path.join(os.path.dirname(__file__), "..", "tools", "demo.py")


@pytest.mark.slow
def test_demo_runs_end_to_end_on_local_files(tmp_path):
    grid = tmp_path / "grid.png"
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "wids-demo-*")))
    r = subprocess.run(
        [
            sys.executable,
            DEMO,
            "--server",
            "local",
            "--shards",
            "2",
            "--samples",
            "40",
            "--grid",
            str(grid),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"):
        assert step in out
    assert "80 samples (80 in the dataset)" in out
    assert "samples/s" in out and "per sample" in out and "read from storage" in out
    assert grid.stat().st_size > 1000
    from PIL import Image

    with Image.open(grid) as img:
        assert img.format == "PNG"
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "wids-demo-*")))
    assert after <= before, "the demo left its temporary directory behind"


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.skipif(
    not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")), reason="no nginx"
)
def test_demo_over_nginx_counts_requests_and_uses_the_cache(tmp_path):
    grid = tmp_path / "grid.png"
    r = subprocess.run(
        [
            sys.executable,
            DEMO,
            "--server",
            "http",
            "--shards",
            "2",
            "--samples",
            "40",
            "--grid",
            str(grid),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "served by nginx (HTTP) at http://127.0.0.1:" in r.stdout
    assert "nginx access log:" in r.stdout
    assert "http server (pid" in r.stdout and "stopped" in r.stdout
    assert grid.exists()
