"""tools/bench_scale.py runs end to end at a tiny scale, with workers (two formats: each one
costs a fresh process that imports torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(__file__), "..", "tools", "bench_scale.py")


@pytest.mark.slow
def test_bench_scale_runs_tiny(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..")}
    r = subprocess.run(
        [sys.executable, BENCH, "--shards", "30", "--samples", "7", "--workers", "1"]
        + ["--formats", "description,widx", "--dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(figures["open"]) == {"description", "widx"}
    # every format read the same sample (the tool checks that too) from the one real shard
    assert len({f["key"] for f in figures["open"].values()}) == 1
    assert all(f["samples"] == 30 * 7 for f in figures["open"].values())
    assert all(len(f["worker_uss"]) == 1 for f in figures["open"].values())
    assert "goals (widx)" in r.stdout
    # index info and a 2-shard subset ran on every format, over every shard of the index
    assert all(t["info"]["shards"] == 30 for t in figures["tools"].values())
    assert all(t["subset"]["shards"] == 2 for t in figures["tools"].values())
    assert "widx vs description: info" in r.stdout
    assert (tmp_path / "index.widx").read_bytes()[:8] == b"WIDSTBL\x00"
