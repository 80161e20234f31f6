#!/usr/bin/env python
"""Whole-shard downloads over plain ``http://``: the plain client's threads against aiohttp.

``access="auto"`` promotes a shard by downloading it whole (``wids.storage.parts``: parts of
4-8 MB, 8 in flight per process, each checked). Over a plain ``http://`` URL the parts go on
the plain client's blocking connections in threads (``threads``) or, as before, on aiohttp's
event loop (``aiohttp``). Each variant runs in a fresh process (as a DataLoader worker under
forkserver or spawn would) that downloads the shards one after another, several at once
(``--parallel``), through ``tools/latencyproxy.py`` in front of nginx on 127.0.0.1.

Reported per variant (the best of ``--repeat`` rounds, variants alternating): the wall time of
the downloads, the process's CPU seconds for them (user + system, all its threads) and per MB,
what the process imported for them (aiohttp or not) and its CPU for the first download alone
(imports and clients made included).

Usage::

    python tools/bench_download.py                     # 8 shards of ~22 MB, +25 ms, 50 MB/s
    python tools/bench_download.py --mbps 0 --delay-ms 0 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latencyproxy import ProxyProcess  # noqa: E402
from localservers import Nginx  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, os, resource, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

cfg = json.loads(sys.argv[1])
import wids.storage.parts as parts
from wids.storage import Store

if cfg["variant"] == "aiohttp":  # the event loop's parts, as before the plain client had any
    parts._threaded = lambda transport: False


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


store = Store()
out = tempfile.mkdtemp()
urls, sizes = cfg["urls"], cfg["sizes"]


def fetch(k):
    src = store.source(urls[k])
    dest = os.path.join(out, f"{k}.tar")
    parts.download(src, dest, None, sizes[k])
    os.unlink(dest)


c0, t0 = cpu(), time.perf_counter()
fetch(0)
first_cpu = cpu() - c0
with ThreadPoolExecutor(cfg["parallel"]) as pool:
    list(pool.map(fetch, range(1, len(urls))))
print(json.dumps({
    "wall": time.perf_counter() - t0,
    "cpu": cpu() - c0,
    "first_cpu": first_cpu,
    "aiohttp": "aiohttp" in sys.modules,
}))
"""


def main() -> None:
    """Run the variants (see the module)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/tmp/wids-bench-lat-8x1000x20000", help="shard directory")
    p.add_argument("--delay-ms", type=float, default=25.0)
    p.add_argument("--mbps", type=float, default=50.0, help="per connection; 0: no cap")
    p.add_argument("--parallel", type=int, default=2, help="downloads at once after the first")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    names = sorted(n for n in os.listdir(args.data) if n.endswith(".tar"))
    if not names:
        p.error(f"no shards in {args.data} (python tools/bench_latency.py --quick writes some)")
    sizes = [os.path.getsize(os.path.join(args.data, n)) for n in names]
    mb = sum(sizes) / 1e6
    nginx = Nginx(args.data)
    best: dict[str, dict] = {}
    try:
        with ProxyProcess(nginx.base, delay=args.delay_ms / 1e3, mbps=args.mbps) as proxy:
            cfg = {"urls": [proxy.url(n) for n in names], "sizes": sizes}
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            for _ in range(args.repeat):
                for variant in ("aiohttp", "threads"):
                    run = subprocess.run(
                        [
                            sys.executable,
                            "-c",
                            SCRIPT,
                            json.dumps({**cfg, "variant": variant, "parallel": args.parallel}),
                        ],
                        capture_output=True,
                        text=True,
                        env=env,
                        cwd=tempfile.gettempdir(),
                        timeout=600,
                    )
                    if run.returncode:
                        sys.exit(run.stderr)
                    got = json.loads(run.stdout)
                    if variant not in best or got["wall"] < best[variant]["wall"]:
                        best[variant] = got
    finally:
        nginx.stop()
    print(f"{len(names)} shards, {mb:,.0f} MB, +{args.delay_ms:g} ms, {args.mbps:g} MB/s per conn")
    print(
        f"{'variant':8} {'wall s':>7} {'MB/s':>6} {'CPU s':>6} {'CPU ms/MB':>9} "
        f"{'first CPU s':>11} aiohttp"
    )
    for variant, got in best.items():
        print(
            f"{variant:8} {got['wall']:7.2f} {mb / got['wall']:6.0f} {got['cpu']:6.2f} "
            f"{got['cpu'] / mb * 1e3:9.2f} {got['first_cpu']:11.2f} {got['aiohttp']}"
        )
    a, t = best["aiohttp"], best["threads"]
    print(f"threads/aiohttp: wall {t['wall'] / a['wall']:.2f}, CPU {t['cpu'] / a['cpu']:.2f}")


if __name__ == "__main__":
    main()
