#!/usr/bin/env python
"""Client CPU per ranged read: wids's ``read_ranges`` against aiohttp doing the same GETs.

nginx on 127.0.0.1 serves one generated file; each contender reads the same ~23 KB ranges (a
sample with its tar header) in batches of 32 concurrent requests, in this process, and the
CPU seconds the process used (all threads, user + system) are divided by the requests:

- ``aiohttp``: a bare ``aiohttp.ClientSession`` ranged GET and ``read()`` per range (the floor
  wids had while it sent its range reads through aiohttp);
- ``wids``: ``wids.storage.read_ranges`` on a pinned source (size and etag known, as from an
  index), with every check it makes (``Content-Range``, ``If-Match``, length, retries);
- ``wids-aiohttp``: the same with a storage option that keeps wids on aiohttp (a header).

Best of ``--repeat`` rounds (the machine is shared). Prints us of CPU per request and the
ratios to ``aiohttp`` in the same run.

Usage::

    python tools/bench_reqcpu.py [--requests 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localservers import Nginx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPAN, STRIDE, BATCH = 23_552, 24_064, 32


def _aiohttp_round(url: str, spans: list[tuple[int, int]]) -> float:
    import aiohttp

    async def main() -> float:
        async with aiohttp.ClientSession() as session:

            async def one(s: int, e: int) -> bytes:
                async with session.get(url, headers={"Range": f"bytes={s}-{e - 1}"}) as r:
                    return await r.read()

            await asyncio.gather(*(one(*sp) for sp in spans[:BATCH]))  # connections made
            t = time.process_time()
            for i in range(0, len(spans), BATCH):
                await asyncio.gather(*(one(*sp) for sp in spans[i : i + BATCH]))
            return time.process_time() - t

    return asyncio.run(main())


def _wids_round(url: str, spans: list[tuple[int, int]], size: int, options: dict) -> float:
    from wids.storage import Store, read_ranges

    src = Store(options).source(url, size=size)
    src.read_range(0, 512)  # the first answer pins the etag (as an index's would)
    read_ranges([(src, s, e) for s, e in spans[:BATCH]])
    t = time.process_time()
    for i in range(0, len(spans), BATCH):
        out = read_ranges([(src, s, e) for s, e in spans[i : i + BATCH]])
        if any(len(d) != SPAN for d in out):
            raise RuntimeError("a wrong read")
    return time.process_time() - t


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    size = STRIDE * args.requests
    spans = [(k * STRIDE, k * STRIDE + SPAN) for k in range(args.requests)]
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "data.bin"), "wb") as f:
            f.write(os.urandom(size))
        nginx = Nginx(root)
        try:
            url = nginx.base + "/data.bin"
            rounds = {
                "aiohttp": lambda: _aiohttp_round(url, spans),
                "wids": lambda: _wids_round(url, spans, size, {}),
                "wids-aiohttp": lambda: _wids_round(
                    url, spans, size, {"headers": {"X-Bench": "1"}}
                ),
            }
            best = {name: float("inf") for name in rounds}
            for _ in range(args.repeat):
                for name, run in rounds.items():
                    best[name] = min(best[name], run() / args.requests)
        finally:
            nginx.stop()
    load = os.getloadavg()[0]
    print(f"{args.requests} ranged GETs of {SPAN} B, batches of {BATCH}; load {load:.2f}")
    for name, sec in best.items():
        ratio = sec / best["aiohttp"]
        print(f"{name:14} {sec * 1e6:7.1f} us CPU per request  {ratio:5.2f}x aiohttp")
    return best


if __name__ == "__main__":
    main()
