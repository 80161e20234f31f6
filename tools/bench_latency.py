#!/usr/bin/env python
"""Remote reading under object-store latency: wids against its peers, through a latency proxy.

nginx on 127.0.0.1 serves generated shards behind ``tools/latencyproxy.py`` (by default +25 ms
to every answer's first byte, 50 MB/s per connection), and each contender reads one epoch
with a ``DataLoader`` (4 workers, batches of 32, raw bytes) in its own process:

- ``floor``: every shard fetched whole, over as many connections as there are workers;
- ``webdataset``: webdataset 1.x's iterable ``WebDataset`` pipeline over ``http://`` URLs (it
  reads each shard through a ``curl`` pipe), in its own venv (``--wds-venv``);
- ``reference``: the reference wids (webdataset==0.2.111, ``--reference``; whole-shard
  downloads), its ``ChunkedSampler``, in its own venv, our package not on its path;
- ``auto-chunked``, ``range-chunked``: wids ``access="auto"`` (with a cache directory) and
  ``access="range"``, ``ChunkedSampler`` (chunk = shard, worker-aware);
- ``range-random``: ``access="range"`` with torch's ``RandomSampler``;
- ``auto-random``: ``access="auto"``, ``RandomSampler``, a cache budget of at most
  ``--budget-share`` (1/10) of the dataset;
- ``first-sample``: a fresh process's first ``ds[i]`` (``access="range"``), from making the
  dataset (after ``import wids``) to the sample: its time and requests.

Reported per contender: samples/s over the epoch (from just before the dataset object is made
to the last batch; index loading included), the first batch's latency, requests per sample and
bytes downloaded over the dataset's size (from the proxy's counters), requests in flight (peak
and mean while busy), and the CPU the contender's processes and the proxy used (cores busy =
CPU seconds / wall seconds: near 2 on this machine means the cores, not the latency, limit).
For range modes, the latency bound: the in-flight window / round-trip time, times the samples
a request carries, in samples/s. The round trip is the emulated one (the delay plus a mean
answer's transfer at the cap: no CPU of the client, the proxy or nginx). The window is what
wids lets itself have in flight: ``WINDOW`` (32) requests per DataLoader worker, a batch's
reads with ``RandomSampler`` (one batch per worker at a time: a batch of 32 samples, at most
32 requests) and the lookahead's window of requests with ``ChunkedSampler`` (32 per worker,
``Lookahead.max_requests``), or the peak the proxy counted if that is higher (a direct read
beside a full lookahead window): the bound never uses less than was really in flight. Then
the ratios the goals of issue 12 name.

Usage::

    python tools/bench_latency.py                    # 8 shards x 1000 samples (~180 MB)
    python tools/bench_latency.py --quick            # tiny, under a minute (a smoke run)
    python tools/bench_latency.py --repeat 3         # best of three epochs per contender
    python tools/bench_latency.py --only floor,range-chunked --delay-ms 50 --mbps 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_latency_scripts as scripts  # noqa: E402
from latencyproxy import ProxyProcess  # noqa: E402
from localservers import Nginx  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the wids beside this tool, as in the contenders' processes
WINDOW = 32  # requests in flight per worker that wids allows itself (see the docstring)
CONTENDERS = (
    "floor",
    "webdataset",
    "reference",
    "auto-chunked",
    "range-chunked",
    "range-random",
    "auto-random",
    "first-sample",
)


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _plan(name: str, args: argparse.Namespace, cfg: dict[str, Any], work: Path) -> tuple:
    """``(python, script, env, cwd)`` for contender ``name``; ``None`` if it is unavailable."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ours = {**clean, "PYTHONPATH": str(REPO)}
    if name == "floor":
        return sys.executable, scripts.FLOOR, clean, str(work)
    if name in ("webdataset", "reference"):
        venv = args.wds_venv if name == "webdataset" else args.reference
        python = os.path.join(venv or "", "bin", "python")
        if not venv or not os.path.exists(python):
            return None
        return (
            python,
            scripts.WEBDATASET if name == "webdataset" else scripts.REFERENCE,
            clean,
            str(work),
        )
    if name == "first-sample":
        return sys.executable, scripts.FIRST, ours, str(work)
    access, order = name.split("-")
    cfg.update(access=access, order=order)
    if access == "auto":
        cfg["cache"] = str(work / "cache")
        cfg["budget"] = int(cfg["size"] * args.budget_share) if order == "random" else None
    return sys.executable, scripts.WIDS, ours, str(work)


def run_contender(name: str, args: argparse.Namespace, base: dict, proxy: Any) -> dict | None:
    """One epoch of contender ``name`` in its own process; its figures, or ``None``."""
    work = Path(tempfile.mkdtemp(prefix=f"wids-lat-{name}-"))
    try:
        cfg = {**base, "cache": str(work / "cache"), "budget": None}
        plan = _plan(name, args, cfg, work)
        if plan is None:
            print(f"bench_latency: {name}: its venv is missing; skipped", file=sys.stderr)
            return None
        python, script, env, cwd = plan
        os.sync()  # earlier runs' dirty pages must not slow this one down
        proxy.reset_counts()
        proxy_cpu = _proc_cpu(proxy.proc.pid)
        started = time.perf_counter()
        proc = subprocess.run(
            [python, "-c", scripts.MEASURE + script, json.dumps(cfg)],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
        counts = proxy.settled()
        proxy_cpu = _proc_cpu(proxy.proc.pid) - proxy_cpu
        print(f"  {name}: {time.perf_counter() - started:.1f} s in all", file=sys.stderr)
    except subprocess.TimeoutExpired:
        print(f"bench_latency: {name}: timed out after {args.timeout} s", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        print(f"bench_latency: {name} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(counts=counts, proxy_cpu=proxy_cpu, name=name)
    return result


def _figures(r: dict, size: int, sample_bytes: int, args: argparse.Namespace) -> dict:
    c, n, sec = r["counts"], r["n"], r["seconds"]
    reqs = max(1, c["requests"])
    window = max(c["in_flight_peak"], WINDOW * args.workers)
    rtt = args.delay_ms / 1e3 + c["bytes_out"] / reqs / (args.mbps * 1e6 or float("inf"))
    return {
        "rate": n / sec,
        "first_ms": None if r["first"] is None else r["first"] * 1e3,
        "req_per_sample": c["requests"] / max(1, n),
        "bytes_x": c["bytes_out"] / size,
        "bytes_over_samples": c["bytes_out"] / sample_bytes,
        "in_flight_peak": c["in_flight_peak"],
        "in_flight_mean": c["in_flight_us"] / c["active_us"] if c["active_us"] else 0.0,
        "request_ms": c["request_us"] / reqs / 1e3,
        "cores": r["cpu"] / sec,
        "proxy_cores": r["proxy_cpu"] / sec,
        "window": window,
        # the window's requests, each taking a round trip, each carrying n/reqs samples
        "bound": window / rtt * n / reqs,
        "rtt_ms": rtt * 1e3,
    }


def _render(results: dict[str, dict], args: argparse.Namespace) -> str:
    floor = results.get("floor", {}).get("rate")
    head = (
        f"{'contender':14} {'samples/s':>9} {'/floor':>6} {'1st batch':>9} {'req/smp':>7} "
        f"{'bytes/ds':>8} {'inflight':>8} {'req ms':>6} {'cores':>5} {'proxy':>5}  latency bound"
    )
    out = [head, "-" * len(head)]
    for name, f in results.items():
        if name == "first-sample":
            continue
        first = "" if f["first_ms"] is None else f"{f['first_ms']:,.0f} ms"
        ratio = f"{f['rate'] / floor:6.2f}" if floor else ""
        bound = ""
        if name.startswith("range"):
            bound = f"{f['bound']:,.0f}/s ({f['rate'] / f['bound']:.2f}x, window {f['window']})"
        out.append(
            f"{name:14} {f['rate']:9,.0f} {ratio:>6} {first:>9} {f['req_per_sample']:7.3f} "
            f"{f['bytes_x']:7.2f}x {f['in_flight_peak']:4d}/{f['in_flight_mean']:<3.0f} "
            f"{f['request_ms']:6.1f} "
            f"{f['cores']:5.2f} {f['proxy_cores']:5.2f}  {bound}".rstrip()
        )
    out.append("")
    if "first-sample" in results:
        f = results["first-sample"]
        out.append(
            f"first ds[i] in a fresh process (range, index load included): "
            f"{f['first_ms']:,.0f} ms, {f['req_per_sample']:.0f} requests "
            f"(the delay per request: {args.delay_ms:g} ms)"
        )
        out.append("")
    out += _ratios(results)
    return "\n".join(out)


def _ratios(results: dict[str, dict]) -> list[str]:
    """The goals of issue 12 as ratios in this run (goal in brackets)."""

    def ratio(a: str, b: str, key: str = "rate") -> float | None:
        if a in results and b in results and results[a][key] and results[b][key]:
            return results[a][key] / results[b][key]
        return None

    lines = []
    checks = [
        ("auto-chunked / webdataset, samples/s", ratio("auto-chunked", "webdataset"), ">= 1.2"),
        (
            "auto-chunked / webdataset, first batch latency",
            ratio("auto-chunked", "webdataset", "first_ms"),
            "<= 1.0",
        ),
        ("auto-chunked / floor", ratio("auto-chunked", "floor"), ">= 0.85"),
        ("range-chunked / reference", ratio("range-chunked", "reference"), ">= 2"),
        ("range-random / reference", ratio("range-random", "reference"), ">= 2"),
        ("auto-random / range-random", ratio("auto-random", "range-random"), ">= 1.0"),
    ]
    for name in ("range-chunked", "range-random"):
        if name in results:
            f = results[name]
            checks.append((f"{name} / its latency bound", f["rate"] / f["bound"], ">= 0.8"))
    if "auto-random" in results:
        x = results["auto-random"]["bytes_over_samples"]
        checks.append(("auto-random bytes downloaded / samples' bytes", x, "<= 1.5"))
    for what, value, goal in checks:
        if value is not None:
            lines.append(f"{what:52} {value:6.2f}  (goal {goal})")
    return lines


def _prepare(args: argparse.Namespace) -> tuple[str, list[str], int]:
    """The dataset (written once per shape) and its index; ``(dir, shard names, size)``."""
    from wids import build_index
    from wids.synth import write_dataset

    data = args.data or os.path.join(
        tempfile.gettempdir(), f"wids-bench-lat-{args.shards}x{args.samples}x{args.jpg_bytes}"
    )
    index = os.path.join(data, "bench.json")
    names = [f"bench-{s:06d}.tar" for s in range(args.shards)]
    if not os.path.exists(index):
        print(f"writing {args.shards} x {args.samples} samples to {data} ...", file=sys.stderr)
        write_dataset(
            data,
            shards=args.shards,
            samples_per_shard=args.samples,
            real_images=False,
            jpg_bytes=args.jpg_bytes,
            prefix="bench",
        )
        # local files, relative URLs: served by nginx, the shards resolve through the proxy
        build_index([os.path.join(data, n) for n in names], index, name="bench")
    size = sum(os.path.getsize(os.path.join(data, n)) for n in names)
    return data, names, size


def _sample_bytes(index: str) -> int:
    from wids import open_index

    reader = open_index(index)
    total = 0
    for i in range(len(reader.shards)):
        members = reader.members(i)
        if members is not None:
            a, b = members.spans()
            total += int((b - a).sum())
    reader.close()
    return total


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (defaults filled in for ``--quick``)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="4 shards x 64 small samples")
    p.add_argument("--shards", type=int, help="shards (default 8; --quick 4)")
    p.add_argument("--samples", type=int, help="samples per shard (default 1000; --quick 64)")
    p.add_argument("--jpg-bytes", type=int, help="bytes of each sample's jpg (20000; --quick 4000)")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers (and floor conns)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--delay-ms", type=float, default=25.0, help="proxy: delay to first byte")
    p.add_argument("--mbps", type=float, default=50.0, help="proxy: 10^6 bytes/s per connection")
    p.add_argument("--budget-share", type=float, default=0.1, help="auto-random cache budget")
    p.add_argument(
        "--only", help="comma-separated contenders (default: all): " + ",".join(CONTENDERS)
    )
    p.add_argument("--wds-venv", default="/tmp/venv-wds", help="venv with webdataset==1.0.2")
    p.add_argument("--reference", default="/tmp/wids-refvenv", help="venv with webdataset==0.2.111")
    p.add_argument("--data", help="dataset directory to create or reuse")
    p.add_argument("--repeat", type=int, default=1, help="rounds; the best epoch of each kept")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per contender")
    p.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = p.parse_args(argv)
    args.shards = args.shards or (4 if args.quick else 8)
    args.samples = args.samples or (64 if args.quick else 1000)
    args.jpg_bytes = args.jpg_bytes or (4000 if args.quick else 20_000)
    names = args.only.split(",") if args.only else list(CONTENDERS)
    unknown = set(names) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)}")
    args.names = names
    return args


def run(args: argparse.Namespace) -> dict[str, dict]:
    """Every contender through one proxy; figures by contender (see ``_figures``).

    Also sets ``args.size`` (the dataset's bytes) and ``args.sample_bytes``.
    """
    names = args.names
    data, shard_names, size = _prepare(args)
    sample_bytes = _sample_bytes(os.path.join(data, "bench.json"))
    nginx = Nginx(data)
    results: dict[str, dict] = {}
    try:
        with ProxyProcess(nginx.base, delay=args.delay_ms / 1e3, mbps=args.mbps) as proxy:
            base = {
                "urls": [proxy.url(n) for n in shard_names],
                "index": proxy.url("bench.json"),
                "per_shard": args.samples,
                "size": size,
                "workers": args.workers,
                "batch": args.batch,
            }
            for rnd in range(args.repeat):  # rounds alternate the order; best of each kept
                for name in names if rnd % 2 == 0 else names[::-1]:
                    print(f"bench_latency: {name} ...", file=sys.stderr)
                    r = run_contender(name, args, base, proxy)
                    if r is None:
                        continue
                    f = _figures(r, size, sample_bytes, args)
                    if name not in results or f["rate"] > results[name]["rate"]:
                        results[name] = {**f, "n": r["n"]}
            results = {k: results[k] for k in names if k in results}
    finally:
        nginx.stop()
    args.size, args.sample_bytes = size, sample_bytes
    return results


def _proxy_loop() -> str:
    """The proxy's event loop (uvloop where installed: less of the 2 cores per request)."""
    import importlib.util

    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def main(argv: list[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    load = os.getloadavg()
    t_start = time.perf_counter()
    results = run(args)
    size, sample_bytes = args.size, args.sample_bytes
    print(
        f"{args.shards} shards x {args.samples} samples, {size / 1e6:.0f} MB "
        f"(samples' bytes {sample_bytes / 1e6:.0f} MB); proxy +{args.delay_ms:g} ms, "
        f"{args.mbps:g} MB/s per connection (on {_proxy_loop()}); DataLoader {args.workers} "
        f"workers, batch "
        f"{args.batch}; raw bytes"
    )
    print(
        f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
        f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; "
        f"{time.perf_counter() - t_start:.0f} s"
    )
    print(f"command: python tools/bench_latency.py {' '.join(argv or sys.argv[1:])}".rstrip())
    print(_render(results, args))
    print(
        "inflight = peak/mean requests open at the proxy (mean while busy); req ms = mean time "
        "from a request's arrival to its last byte; cores = CPU s of the contender's processes "
        "/ wall s; proxy = the same for the proxy; bytes/ds = bytes served / dataset size"
    )
    if args.json:
        print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
