#!/usr/bin/env python
"""obstore against what wids uses now, per ranged read: CPU per request and reads/s, one run.

Servers on 127.0.0.1: nginx (HTTP) and moto (S3). Each contender reads the same ~23 KB ranges
of one generated file, in batches of 32 concurrent requests (obstore: ``get_ranges`` /
``get_range_async`` gathered; wids: ``read_ranges``; the bare clients: aiohttp and s3fs's
``cat_ranges``), and one at a time (``get_range`` / ``Source.read_range``). Prints CPU
microseconds per request (process time, all threads) and wall reads/s, and the ratios to the
bare client in the same run. moto materialises the whole object per GET: its figures are
ratios only.

Usage::

    python tools/bench_obstore.py [--requests 512]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localservers import Moto, Nginx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPAN, STRIDE, BATCH = 23_552, 24_064, 32


def _timed(run: Callable[[], object], n: int) -> tuple[float, float]:
    run()  # connections made, clients built
    c, w = time.process_time(), time.perf_counter()
    run()
    return (time.process_time() - c) / n * 1e6, n / (time.perf_counter() - w)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=512)
    args = p.parse_args(argv)
    import obstore
    from obstore.store import HTTPStore, S3Store

    from wids.storage import Store, read_ranges

    n = args.requests
    size = STRIDE * n
    spans = [(k * STRIDE, k * STRIDE + SPAN) for k in range(n)]
    data = os.urandom(size)
    rows: list[tuple[str, str, float, float]] = []
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "data.bin"), "wb") as f:
            f.write(data)
        nginx, moto = Nginx(root), Moto("bench")
        try:
            url = nginx.base + "/data.bin"
            s3url = moto.put(os.path.join(root, "data.bin"), "data.bin")
            http_store = HTTPStore.from_url(nginx.base, client_options={"allow_http": True})
            s3_store = S3Store(
                "bench",
                endpoint=moto.endpoint,
                access_key_id="testing",
                secret_access_key="testing",
                region="us-east-1",
                client_options={"allow_http": True},
            )

            def ob_batches(store: object, path: str) -> None:
                for i in range(0, n, BATCH):
                    part = spans[i : i + BATCH]
                    got = obstore.get_ranges(
                        store, path, starts=[s for s, _ in part], ends=[e for _, e in part]
                    )
                    assert all(len(g) == SPAN for g in got)

            def ob_single(store: object, path: str) -> None:
                for s, e in spans[: n // 4]:
                    assert len(obstore.get_range(store, path, start=s, end=e)) == SPAN

            def wids_batches(src: object) -> None:
                for i in range(0, n, BATCH):
                    read_ranges([(src, s, e) for s, e in spans[i : i + BATCH]])

            def wids_single(src: object) -> None:
                for s, e in spans[: n // 4]:
                    src.read_range(s, e)  # type: ignore[attr-defined]

            def aiohttp_batches() -> None:
                import aiohttp

                async def go() -> None:
                    async with aiohttp.ClientSession() as session:

                        async def one(s: int, e: int) -> bytes:
                            h = {"Range": f"bytes={s}-{e - 1}"}
                            async with session.get(url, headers=h) as r:
                                return await r.read()

                        for i in range(0, n, BATCH):
                            await asyncio.gather(*(one(*sp) for sp in spans[i : i + BATCH]))

                asyncio.run(go())

            s3fs_fs = moto.fs

            def s3fs_batches() -> None:
                for i in range(0, n, BATCH):
                    part = spans[i : i + BATCH]
                    path = s3url.removeprefix("s3://")
                    s3fs_fs.cat_ranges(
                        [path] * len(part), [s for s, _ in part], [e for _, e in part]
                    )

            wids_http = Store().source(url, size=size)
            wids_s3 = Store(moto.storage_options).source(s3url, size=size)
            cases: list[tuple[str, str, Callable[[], object], int]] = [
                ("nginx", "aiohttp (batches)", aiohttp_batches, n),
                ("nginx", "obstore (batches)", lambda: ob_batches(http_store, "data.bin"), n),
                ("nginx", "wids read_ranges", lambda: wids_batches(wids_http), n),
                ("nginx", "obstore get_range", lambda: ob_single(http_store, "data.bin"), n // 4),
                ("nginx", "wids read_range", lambda: wids_single(wids_http), n // 4),
                ("moto", "s3fs cat_ranges", s3fs_batches, n),
                ("moto", "obstore (batches)", lambda: ob_batches(s3_store, "data.bin"), n),
                ("moto", "wids read_ranges", lambda: wids_batches(wids_s3), n),
            ]
            for server, name, run, count in cases:
                cpu, rate = _timed(run, count)
                rows.append((server, name, cpu, rate))
        finally:
            nginx.stop()
            moto.stop()
    print(f"{n} ranged reads of {SPAN} B; load {os.getloadavg()[0]:.2f}")
    base: dict[str, tuple[float, float]] = {}
    for server, name, cpu, rate in rows:
        base.setdefault(server, (cpu, rate))
        b = base[server]
        print(
            f"{server:6} {name:20} {cpu:8.1f} us CPU/request ({cpu / b[0]:4.2f}x)  "
            f"{rate:8.0f} reads/s ({rate / b[1]:4.2f}x)"
        )


if __name__ == "__main__":
    main()
