"""Smoke runs of tools/bench_latency.py and tools/bench_local.py (tiny), so they cannot rot.

Only the instruments are checked, never speed: every sample read, and the proxy's counters
agree with what the floor must have done (one request per shard, each shard's bytes once).
"""

from __future__ import annotations

import os

import pytest


@pytest.mark.slow
@pytest.mark.servers
def test_bench_latency_quick(tmp_path, capsys):
    import bench_latency

    shards, samples = 2, 32
    results = bench_latency.main(
        [
            "--quick",
            "--shards",
            str(shards),
            "--samples",
            str(samples),
            "--workers",
            "2",
            "--only",
            "floor,range-random,auto-random,first-sample",
            "--data",
            str(tmp_path / "data"),
        ]
    )
    out = capsys.readouterr().out
    assert set(results) == {"floor", "range-random", "auto-random", "first-sample"}
    assert results["first-sample"]["n"] == 1 and results["first-sample"]["first_ms"] > 0
    for name, figures in results.items():
        assert figures["n"] == (1 if name == "first-sample" else shards * samples)
        assert figures["rate"] > 0
    floor = results["floor"]
    assert floor["req_per_sample"] == pytest.approx(shards / (shards * samples))
    assert floor["bytes_x"] == pytest.approx(1.0)  # every shard's bytes, once
    assert floor["in_flight_peak"] == 2  # one connection per worker
    rr = results["range-random"]
    assert rr["req_per_sample"] > floor["req_per_sample"]  # range requests, not shards
    assert rr["bound"] > 0
    # the bound's window: 32 requests per worker, or the peak the proxy saw if higher
    assert rr["window"] == max(rr["in_flight_peak"], 32 * 2)
    assert rr["bound"] == pytest.approx(rr["window"] / (rr["rtt_ms"] / 1e3) / rr["req_per_sample"])
    assert "auto-random / range-random" in out and "latency bound" in out
    assert "first ds[i] in a fresh process" in out


def test_bench_local_quick(tmp_path, capsys):
    import bench_local

    argv = ["--only", "random", "--n", "300", "--small", "4,50", "--many", "64,2"]
    figures = bench_local.main([*argv, "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert {"random_4", "random_4_pread", "random_64", "random_64_pread"} <= set(figures)
    assert all(v > 0 for v in figures.values())
    assert "64 shards" in out
    assert os.path.exists(tmp_path / "wids-bench-local-64x2x20000" / "bench.json")
