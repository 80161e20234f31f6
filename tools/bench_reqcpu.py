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
    python tools/bench_reqcpu.py ds [--samples 2000] [--repeat 3] [--profile out.prof]

The second form reads samples one at a time (``ds[i]`` in a loop, ``access="range"``, random
order over 4 shards of 1,000 samples) against a keep-alive ``http.client`` Range GET of the
same bytes per sample (the floor), in one run, and prints samples/s and the ratio. If a Python
with Daft installed is given (``--daft-python``, by default ``/tmp/venv-daft/bin/python`` when it
exists: ``python -m venv /tmp/venv-daft && /tmp/venv-daft/bin/pip install daft``; a peer, never
a dependency), a Daft row reads the same samples in the same order in a subprocess: the
shards listed once by ``daft.read_webdataset`` (untimed, as wids's index is built before), then
per sample its label (decoded by the listing) and ``File.open().read()`` of its payload (Rust
I/O, one range request per sample; the nginx access log's count of them is printed).
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


# ---------------------------------------------------------------------------------------------
# ds[i] one sample at a time against a keep-alive http.client Range GET per sample (the floor)


def _shards(root: str, nshards: int, per: int, payload: int) -> list[tuple[str, int, int]]:
    """Write ``nshards`` tars of ``per`` samples; each sample's (name, start, end) span."""
    import io
    import tarfile

    spans: list[tuple[str, int, int]] = []
    for s in range(nshards):
        name = f"shard-{s:04d}.tar"
        with tarfile.open(os.path.join(root, name), "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per):
                for ext, data in ((".cls", b"%d\n" % (i % 10)), (".bin", os.urandom(payload))):
                    info = tarfile.TarInfo(f"s{s:04d}{i:06d}{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        with tarfile.open(os.path.join(root, name)) as tf:
            members = tf.getmembers()
        for i in range(per):
            first, last = members[2 * i], members[2 * i + 1]
            spans.append((name, first.offset, last.offset_data + last.size))
    return spans


def _floor_round(base: str, spans: list[tuple[str, int, int]], order: list[int]) -> float:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port)
    t = time.perf_counter()
    for k in order:
        name, start, end = spans[k]
        conn.request("GET", f"/{name}", headers={"Range": f"bytes={start}-{end - 1}"})
        resp = conn.getresponse()
        if len(resp.read()) != end - start or resp.status != 206:
            raise RuntimeError("a wrong read")
    conn.close()
    return time.perf_counter() - t


_DAFT = r"""
import json, sys, time
import daft

urls, keys, order, repeat = json.load(sys.stdin)
rows = []
for url in urls:  # one listing per shard: a list of URLs hung in daft 0.7.26 (2 cores)
    rows += daft.read_webdataset(url).select("__url__", "__key__", "cls", "bin").to_pylist()
by_key = {(r["__url__"], r["__key__"]): r for r in rows}
samples = [by_key[tuple(k)] for k in keys]
for k in order[:200]:  # warm: connections made
    with samples[k]["bin"].open() as f:
        f.read()
best = float("inf")
for _ in range(repeat):
    t = time.perf_counter()
    for k in order:
        row = samples[k]
        with row["bin"].open() as f:
            data = f.read()
        if len(data) != 2000 or row["cls"] is None:
            raise RuntimeError("a wrong read")
    best = min(best, time.perf_counter() - t)
print(best)
"""


def _daft_rounds(
    python: str, nginx: Nginx, spans: list[tuple[str, int, int]], order: list[int], repeat: int
) -> tuple[float, int]:
    """Daft's best round (seconds) in a subprocess of ``python``, and nginx's requests then."""
    import json
    import subprocess

    urls = sorted({f"{nginx.base}/{name}" for name, _, _ in spans})
    keys = [
        (f"{nginx.base}/{name}", f"s{name[6:10]}{k % 1000:06d}")
        for k, (name, _, _) in enumerate(spans)
    ]
    job = json.dumps([urls, keys, order, repeat])
    nginx.reset()
    out = subprocess.run(
        [python, "-c", _DAFT], input=job, capture_output=True, text=True, check=True, timeout=600
    )
    nginx.counts()  # the log settled
    with open(nginx.access_log) as log:  # the sample reads: answers of a payload's size
        reads = sum(line.rsplit(" ", 1)[-1].strip() == "2000" for line in log)
    return float(out.stdout.split()[-1]), reads


def _wids_ds_round(ds: object, order: list[int]) -> float:
    t = time.perf_counter()
    for k in order:
        ds[k]  # type: ignore[index]
    return time.perf_counter() - t


def ds_loop(argv: list[str] | None = None) -> dict[str, float]:
    """``ds[i]`` (``access="range"``) against the floor: samples per second, same run."""
    p = argparse.ArgumentParser(description="ds[i] over nginx against http.client")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", default=None, help="write a cProfile of one wids round here")
    p.add_argument(
        "--daft-python",
        default="/tmp/venv-daft/bin/python",
        help="a python with daft installed (its row is left out if there is none)",
    )
    args = p.parse_args(argv)
    import random

    from wids import ShardListDataset, build_index

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as root:
        spans = _shards(root, 4, 1000, 2000)
        nginx = Nginx(root)
        try:
            urls = [f"{nginx.base}/shard-{s:04d}.tar" for s in range(4)]
            index = os.path.join(root, "index", "train.json")
            os.makedirs(os.path.dirname(index))
            build_index(urls, index)
            ds = ShardListDataset(index, access="range", transformations=[])
            order = [rng.randrange(len(spans)) for _ in range(args.samples)]
            for k in order[:200]:
                ds[k]  # opened, checked, connections made
            _floor_round(nginx.base, spans, order[:50])
            best = {"http.client": float("inf"), "wids ds[i]": float("inf")}
            for _ in range(args.repeat):
                best["http.client"] = min(
                    best["http.client"], _floor_round(nginx.base, spans, order)
                )
                best["wids ds[i]"] = min(best["wids ds[i]"], _wids_ds_round(ds, order))
            note = ""
            if os.path.exists(args.daft_python):
                best["daft File.read"], requests = _daft_rounds(
                    args.daft_python, nginx, spans, order, args.repeat
                )
                rounds = args.repeat + 1  # and the warm-up's 200 samples
                note = f"daft: {requests} payload GETs for {rounds} x {args.samples} + 200 samples"
            else:
                note = f"no daft row: {args.daft_python} does not exist"
            if args.profile:
                import cProfile

                cProfile.runctx("_wids_ds_round(ds, order)", globals(), locals(), args.profile)
        finally:
            nginx.stop()
    load = os.getloadavg()[0]
    print(f"{args.samples} samples one at a time (2 KB + label, random); load {load:.2f}")
    for name, sec in best.items():
        rate = args.samples / sec
        floor = args.samples / best["http.client"]
        print(f"{name:14} {rate:9.0f} samples/s  {rate / floor:5.2f}x the floor")
    print(note)
    return best


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "ds":
    ds_loop(sys.argv[2:])
    sys.exit(0)
elif __name__ == "__main__":
    main()
