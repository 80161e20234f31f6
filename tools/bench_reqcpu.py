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

    python tools/bench_reqcpu.py [--requests 1024] [--repeat 5] [--tls]
    python tools/bench_reqcpu.py ds [--samples 2000] [--repeat 3] [--profile out.prof] [--tls]

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
    p.add_argument("--tls", action="store_true", help="nginx over https (see ds --tls)")
    args = p.parse_args(argv)
    size = STRIDE * args.requests
    spans = [(k * STRIDE, k * STRIDE + SPAN) for k in range(args.requests)]
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "data.bin"), "wb") as f:
            f.write(os.urandom(size))
        nginx = Nginx(root, tls=args.tls)
        try:
            if nginx.cafile is not None:  # before aiohttp's import makes its default context
                os.environ["SSL_CERT_FILE"] = nginx.cafile
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
    scheme = "https" if args.tls else "http"
    print(f"{args.requests} ranged GETs of {SPAN} B, batches of {BATCH}, {scheme}; load {load:.2f}")
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
    import ssl
    from urllib.parse import urlsplit

    parts = urlsplit(base)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":  # trusted through SSL_CERT_FILE, as aiohttp's and wids's
        context = ssl.create_default_context()
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, context=context)
    else:
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

urls, keys, order = json.loads(sys.stdin.readline())
rows = []
for url in urls:  # one listing per shard: a list of URLs hung in daft 0.7.26 (2 cores)
    rows += daft.read_webdataset(url).select("__url__", "__key__", "cls", "bin").to_pylist()
by_key = {(r["__url__"], r["__key__"]): r for r in rows}
samples = [by_key[tuple(k)] for k in keys]
for k in order[:200]:  # warm: connections made
    with samples[k]["bin"].open() as f:
        f.read()
print("ready", flush=True)
for _ in sys.stdin:  # one round per line
    t = time.perf_counter()
    for k in order:
        row = samples[k]
        with row["bin"].open() as f:
            data = f.read()
        if len(data) != 2000 or row["cls"] is None:
            raise RuntimeError("a wrong read")
    print(time.perf_counter() - t, flush=True)
"""


class _Daft:
    """Daft in a subprocess of ``python``, reading the samples of ``order`` a round at a time."""

    def __init__(
        self, python: str, nginx: Nginx, spans: list[tuple[str, int, int]], order: list[int]
    ) -> None:
        import json
        import subprocess

        urls = sorted({f"{nginx.base}/{name}" for name, _, _ in spans})
        keys = [
            (f"{nginx.base}/{name}", f"s{name[6:10]}{k % 1000:06d}")
            for k, (name, _, _) in enumerate(spans)
        ]
        self.proc = subprocess.Popen(
            [python, "-c", _DAFT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # noqa: S101
        self.proc.stdin.write(json.dumps([urls, keys, order]) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError(self.proc.communicate()[1].strip().splitlines()[-1])

    def round(self) -> float:
        """One round's seconds."""
        assert self.proc.stdin is not None and self.proc.stdout is not None  # noqa: S101
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        """End the subprocess."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _payload_gets(nginx: Nginx) -> int:
    """Answers of a sample payload's size in nginx's log (since its last reset)."""
    nginx.counts()  # the log settled
    with open(nginx.access_log) as log:
        return sum(line.rsplit(" ", 1)[-1].strip() == "2000" for line in log)


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
    p.add_argument(
        "--tls",
        action="store_true",
        help="nginx over https (a self-signed certificate, trusted through SSL_CERT_FILE)",
    )
    args = p.parse_args(argv)
    import random

    from wids import ShardListDataset, build_index

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as root:
        spans = _shards(root, 4, 1000, 2000)
        nginx = Nginx(root, tls=args.tls)
        try:
            if nginx.cafile is not None:  # before aiohttp's import makes its default context
                os.environ["SSL_CERT_FILE"] = nginx.cafile
            urls = [f"{nginx.base}/shard-{s:04d}.tar" for s in range(4)]
            index = os.path.join(root, "index", "train.json")
            os.makedirs(os.path.dirname(index))
            build_index(urls, index)
            ds = ShardListDataset(index, access="range", transformations=[])
            # a request header keeps wids on aiohttp (what its own client saves)
            via = ShardListDataset(
                index,
                access="range",
                transformations=[],
                storage_options={"headers": {"X-Bench": "1"}},
            )
            order = [rng.randrange(len(spans)) for _ in range(args.samples)]
            for k in order[:200]:
                ds[k]  # opened, checked, connections made
                via[k]
            _floor_round(nginx.base, spans, order[:50])
            rows = {
                "http.client": lambda: _floor_round(nginx.base, spans, order),
                "wids ds[i]": lambda: _wids_ds_round(ds, order),
                "wids aiohttp": lambda: _wids_ds_round(via, order),
            }
            note, daft = "", None
            if os.path.exists(args.daft_python):
                try:
                    daft = _Daft(args.daft_python, nginx, spans, order)
                    rows["daft File.read"] = daft.round
                except RuntimeError as e:
                    note = f"no daft row: it failed ({e})"
            else:
                note = f"no daft row: {args.daft_python} does not exist"
            best = {name: float("inf") for name in rows}
            try:
                for _ in range(args.repeat):  # interleaved: the machine's load varies
                    for name, run in rows.items():
                        if name.startswith("daft"):
                            nginx.reset()
                        best[name] = min(best[name], run())
                        if name.startswith("daft"):
                            note = f"daft: {_payload_gets(nginx)} payload GETs per round"
            finally:
                if daft is not None:
                    daft.close()
            if args.profile:
                import cProfile

                cProfile.runctx("_wids_ds_round(ds, order)", globals(), locals(), args.profile)
        finally:
            nginx.stop()
    load = os.getloadavg()[0]
    scheme = "https" if args.tls else "http"
    print(f"{args.samples} samples one at a time (2 KB + label, random, {scheme}); load {load:.2f}")
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
