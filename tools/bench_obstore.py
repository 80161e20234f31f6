#!/usr/bin/env python
"""obstore against what wids uses now, per ranged read: CPU per request and reads/s, one run.

Servers on 127.0.0.1: nginx (HTTP) and moto (S3). Each contender reads the same ~23 KB ranges
of one generated file, in batches of 32 concurrent requests (obstore: ``get_ranges`` /
``get_range_async`` gathered; wids: ``read_ranges``; the bare clients: aiohttp and s3fs's
``cat_ranges``), and one at a time (``get_range`` / ``Source.read_range``). Prints CPU
microseconds per request (process time, all threads) and wall reads/s, and the ratios to the
bare client in the same run. moto materialises the whole object per GET: its figures are
ratios only. ``wids (obstore)`` rows are wids's own reads (``read_ranges`` / ``read_range``,
every check included) through the obstore transport (storage option ``transport="obstore"``,
:mod:`wids.storage.viaobstore`); ``wids`` rows through fsspec (nginx: plain ``http://``
reads go through wids's own HTTP/1.1 client).

The second form reads samples from a dataset (4 shards x 250 samples of ~20 KB, an index with
its member tables; ``access="range"``) on nginx and moto, through fsspec and through obstore:
``ds[i]`` one at a time in a random order, and ``ds.__getitems__`` batches of 32 (one request
per sample); samples/s and CPU per sample (process time), ratios to fsspec in the same run.

Usage::

    python tools/bench_obstore.py [--requests 512]
    python tools/bench_obstore.py ds [--samples 1000]
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

            fs = {"transport": "fsspec"}  # (S3's default, "auto", is obstore's)
            wids_http = Store(fs).source(url, size=size)
            wids_s3 = Store({**moto.storage_options, **fs}).source(s3url, size=size)
            ob = {"transport": "obstore"}
            ob_http = Store(ob).source(url, size=size)
            ob_s3 = Store({**moto.storage_options, **ob}).source(s3url, size=size)
            cases: list[tuple[str, str, Callable[[], object], int]] = [
                ("nginx", "aiohttp (batches)", aiohttp_batches, n),
                ("nginx", "obstore (batches)", lambda: ob_batches(http_store, "data.bin"), n),
                ("nginx", "wids read_ranges", lambda: wids_batches(wids_http), n),
                ("nginx", "wids (obstore) ranges", lambda: wids_batches(ob_http), n),
                ("nginx", "obstore get_range", lambda: ob_single(http_store, "data.bin"), n // 4),
                ("nginx", "wids read_range", lambda: wids_single(wids_http), n // 4),
                ("nginx", "wids (obstore) range", lambda: wids_single(ob_http), n // 4),
                ("moto", "s3fs cat_ranges", s3fs_batches, n),
                ("moto", "obstore (batches)", lambda: ob_batches(s3_store, "data.bin"), n),
                ("moto", "wids read_ranges", lambda: wids_batches(wids_s3), n),
                ("moto", "wids (obstore) ranges", lambda: wids_batches(ob_s3), n),
                ("moto", "wids read_range", lambda: wids_single(wids_s3), n // 4),
                ("moto", "wids (obstore) range", lambda: wids_single(ob_s3), n // 4),
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
            f"{server:6} {name:22} {cpu:8.1f} us CPU/request ({cpu / b[0]:4.2f}x)  "
            f"{rate:8.0f} reads/s ({rate / b[1]:4.2f}x)"
        )


def _dataset(root: str, nshards: int, per: int) -> list[str]:
    """``nshards`` tars of ``per`` samples (``.bin`` of ~20 KB, ``.cls``) under ``root``."""
    import io
    import tarfile

    paths = []
    for k in range(nshards):
        path = os.path.join(root, f"shard-{k}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per):
                for ext, data in ((".bin", os.urandom(20_000 + i)), (".cls", b"%d" % i)):
                    info = tarfile.TarInfo(f"s{k}-{i:05d}{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def ds_main(argv: list[str]) -> None:
    """Samples/s of a dataset through fsspec and obstore (see the module), one run."""
    import random

    p = argparse.ArgumentParser(description="samples/s through fsspec and obstore")
    p.add_argument("--samples", type=int, default=1000)
    args = p.parse_args(argv)
    from wids import ShardListDataset, build_index

    n = args.samples
    rows: list[tuple[str, str, float, float]] = []
    with tempfile.TemporaryDirectory() as root:
        paths = _dataset(root, 4, 250)
        nginx, moto = Nginx(root), Moto("bench")
        try:
            places = {
                "nginx": ([f"{nginx.base}/{os.path.basename(q)}" for q in paths], {}),
                "moto": (
                    [moto.put(q, os.path.basename(q)) for q in paths],
                    dict(moto.storage_options),
                ),
            }
            for server, (urls, options) in places.items():
                index = os.path.join(root, f"{server}.json")
                build_index(urls, index, storage_options=options)
                order = [random.randrange(1000) for _ in range(n)]
                for transport in ("fsspec", "obstore"):
                    opts = {**options, "transport": transport}
                    ds = ShardListDataset(
                        index, access="range", transformations=[], storage_options=opts
                    )
                    for i in range(0, 1000, 50):  # every shard opened, pinned, connected
                        ds[i]

                    def single(ds: ShardListDataset = ds, order: list[int] = order) -> None:
                        for i in order:
                            ds[i]

                    def batches(ds: ShardListDataset = ds, order: list[int] = order) -> None:
                        for k in range(0, n, BATCH):
                            ds.__getitems__(order[k : k + BATCH])

                    for name, run in (("ds[i]", single), ("batches of 32", batches)):
                        c, w = time.process_time(), time.perf_counter()
                        run()
                        cpu = (time.process_time() - c) / n * 1e6
                        rate = n / (time.perf_counter() - w)
                        rows.append((server, f"{name} {transport}", cpu, rate))
                    ds.close()
        finally:
            nginx.stop()
            moto.stop()
    print(f"{n} samples of ~20 KB, access='range'; load {os.getloadavg()[0]:.2f}")
    base: dict[tuple[str, str], tuple[float, float]] = {}
    for server, name, cpu, rate in rows:
        kind = name.rsplit(" ", 1)[0]
        b = base.setdefault((server, kind), (cpu, rate))
        print(
            f"{server:6} {name:22} {cpu:8.1f} us CPU/sample ({cpu / b[0]:4.2f}x)  "
            f"{rate:8.0f} samples/s ({rate / b[1]:4.2f}x)"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["ds"]:
        ds_main(sys.argv[2:])
    else:
        main()
