#!/usr/bin/env python
"""Every wids benchmark in one command, on generated data, as one table with ratios to floors.

Sections (each figure is compared with a floor measured in the same run, on the same data):

- index: header-only ``os.pread`` scan (the floor), ``tarfile``, ``wids.tar.scan_local``,
  ``build_index`` to JSON and to SQLite from local files and over HTTP (nginx), and the
  synthetic SQLite index build / open-to-first-lookup (``tools/bench_sqlite.py``);
- read: random ``ds[i]`` on local shards vs ``os.pread`` of the same byte spans, and a
  ``DataLoader`` (2 workers, batches of 32) over the same order;
- remote: ``ds.__getitems__`` batches of 32 over nginx on 127.0.0.1 vs raw ``fs.cat_ranges``
  of the same spans, with requests per sample from nginx's access log; random ``ds[i]`` with
  the end-to-end header check (the default) vs without it;
- cache: one epoch in chunked order over nginx in each access mode (``range``, ``shard``,
  ``auto``; ``tools/bench_cache.py``) vs ``fs.cat_ranges`` of the same order;
- reference (``--reference VENV``): the reference wids (webdataset==0.2.111) in its own venv,
  in a subprocess, on the same data: index build, local and HTTP ``ds[i]``, DataLoader;
- latency (``--latency``): ``tools/bench_latency.py``'s contenders (webdataset 1.x, the
  reference, wids in each access mode and order; DataLoader of 4 workers) through a proxy
  adding 25 ms per request and capping each connection at 50 MB/s, against whole shards
  fetched over 4 connections.

Raw samples (``transformations=[]``) throughout, so the figures measure I/O and indexing, not
decoding. Progress goes to stderr; the table to stdout. Nothing leaves 127.0.0.1.

Usage::

    python tools/bench.py                           # the table of docs/benchmarks.md (~2-4 minutes)
    python tools/bench.py --quick                   # small data, seconds
    python tools/bench.py --reference /tmp/wids-refvenv
    python tools/bench.py --latency                 # also the rows under object-store latency
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_cache  # noqa: E402
import bench_index  # noqa: E402
import bench_latency  # noqa: E402
import bench_read  # noqa: E402
import bench_sqlite  # noqa: E402
from localservers import Nginx  # noqa: E402

from wids import build_index  # noqa: E402
from wids.sampler import ChunkedSampler  # noqa: E402
from wids.tar import scan_local  # noqa: E402


@dataclass
class Row:
    """One line of the table: a figure (higher is better unless ``unit`` is a time)."""

    section: str
    what: str
    value: float
    unit: str
    floor: str | None = None  # ``what`` of the floor row it is compared with
    note: str = ""


class Table:
    """Rows in the order measured; ratios are value / floor value (1.0 = as fast as the floor)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, *args: Any, **kw: Any) -> Row:
        row = Row(*args, **kw)
        self.rows.append(row)
        return row

    def get(self, what: str) -> Row | None:
        return next((r for r in self.rows if r.what == what), None)

    def render(self) -> str:
        out = []
        head = (
            f"{'section':9} {'measurement':50} {'figure':>18}  {'floor (same run)':40} "
            f"{'ratio':>6}  notes"
        )
        out += [head, "-" * len(head)]
        for r in self.rows:
            floor = self.get(r.floor) if r.floor else None
            ratio = f"{r.value / floor.value:6.2f}" if floor and floor.value else ""
            out.append(
                f"{r.section:9} {r.what:50} {_fmt(r.value, r.unit):>18}  "
                f"{(r.floor or ''):40} {ratio:>6}  {r.note}".rstrip()
            )
        return "\n".join(out)

    def markdown(self) -> str:
        out = [
            "| section | measurement | figure | floor (same run) | ratio | notes |",
            "| --- | --- | ---: | --- | ---: | --- |",
        ]
        for r in self.rows:
            floor = self.get(r.floor) if r.floor else None
            ratio = f"{r.value / floor.value:.2f}" if floor and floor.value else ""
            out.append(
                f"| {r.section} | {r.what} | {_fmt(r.value, r.unit)} | {r.floor or ''} | "
                f"{ratio} | {r.note} |"
            )
        return "\n".join(out)


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:,.1f} ms"
    if unit == "s":
        return f"{value:,.2f} s"
    return f"{value:,.0f} {unit}"


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


# -- sections ---------------------------------------------------------------------------------


def index_section(t: Table, paths: list[Path], work: Path, nginx: Nginx, args: Any) -> str:
    """Index build figures in members/s; returns the path of the index with HTTP URLs."""
    bench_index._warm(paths)
    sec, members = _best(lambda: sum(bench_index.floor_scan(p) for p in paths), args.repeat)
    floor = "header-only scan (pread, size only)"
    t.add("index", floor, members / sec, "members/s")
    sec, n = _best(lambda: bench_index._tarfile_count(paths), args.repeat)
    t.add("index", "tarfile: iterate members", n / sec, "members/s", floor)
    sec, n = _best(lambda: sum(len(scan_local(p)) for p in paths), args.repeat)
    t.add("index", "wids.tar.scan_local (parser)", n / sec, "members/s", floor)

    def build(urls: list[str], out: str, md5: bool = False) -> Any:
        return build_index(urls, out, incremental=False, name="bench", md5=md5)

    local = [str(p) for p in paths]
    # the scan itself (--no-md5), then the default, which also reads every byte for its md5
    for suffix, md5 in (("json", False), ("sqlite", False), ("json", True)):
        out = str(work / f"build.{suffix}")
        sec, _ = _best(lambda out=out, md5=md5: build(local, out, md5), args.repeat)
        t.add(
            "index",
            f"build_index -> {'JSON' if suffix == 'json' else 'SQLite'}, local files"
            + (" (md5, the default)" if md5 else " (--no-md5)"),
            members / sec,
            "members/s",
            floor,
            f"{len(paths)} shards in {sec:.2f} s",
        )
    urls = [f"{nginx.base}/{p.name}" for p in paths]
    http_index = str(work / "http.json")
    nginx.reset()
    sec, _ = _best(lambda: build(urls, http_index), 1)
    reqs = nginx.requests()
    t.add(
        "index",
        "build_index -> JSON, over HTTP (nginx)",
        members / sec,
        "members/s",
        floor,
        f"{reqs / len(paths):.1f} requests/shard",
    )
    r = bench_sqlite.bench_sqlite(args.sqlite_shards, 1000, directory=str(work))
    t.add(
        "index",
        f"SQLite index build, {r['samples'] / 1e6:g}M synthetic samples",
        r["members"] / r["build_s"],
        "members/s",
        note=f"{r['build_s']:.1f} s, {r['file_bytes'] / 1e6:.0f} MB",
    )
    t.add(
        "index",
        "SQLite index open -> first lookup",
        r["open_to_first_lookup_s"] * 1000,
        "ms",
        note=f"{r['samples']:,} samples",
    )
    return http_index


def read_section(t: Table, index: str, order: list[int], spans: tuple) -> None:
    ours, floor = bench_read.bench_local(index, order, spans)
    fname = "os.pread of the sample spans"
    t.add("read", fname, floor, "samples/s", note=f"{len(order):,} random samples")
    t.add("read", "ds[i], local shards", ours, "samples/s", fname)
    ours10, _ = bench_read.bench_local(index, order, spans, lru_size=10)
    t.add(
        "read",
        "ds[i], local, default lru_size=10",
        ours10,
        "samples/s",
        fname,
        f"{len(spans[0])} shards"
        + (": random access reopens shards" if len(spans[0]) > 10 else ""),
    )


def loader_section(t: Table, index: str, order: list[int], spans: tuple) -> None:
    # bench_read.bench_dataloader gained a floor of its own (a DataLoader over a dataset that
    # only preads the spans); older versions return our rate alone.
    if "spans" in inspect.signature(bench_read.bench_dataloader).parameters:
        dl, dl_floor = bench_read.bench_dataloader(index, order, spans)
        fname = "DataLoader over an os.pread-only dataset"
        t.add("read", fname, dl_floor, "samples/s", "os.pread of the sample spans")
    else:
        dl, fname = bench_read.bench_dataloader(index, order), "os.pread of the sample spans"
    t.add("read", "DataLoader(2 workers, batch 32), local", dl, "samples/s", fname)


def remote_section(t: Table, nginx: Nginx, order: list[int], spans: tuple, data: str) -> None:
    ours, floor, rps, floor_rps = bench_read.bench_http(nginx, order, spans, data)
    fname = "fs.cat_ranges(32 spans), HTTP"
    t.add("remote", fname, floor, "samples/s", note=f"{floor_rps:.3f} requests/sample")
    t.add(
        "remote",
        "ds.__getitems__(32), HTTP",
        ours,
        "samples/s",
        fname,
        f"{rps:.3f} requests/sample",
    )
    verified, plain, extra = bench_read.bench_verify(nginx, order[:1000])
    fname = "ds[i], HTTP, header check off"
    t.add("remote", fname, plain, "samples/s", note="median latency")
    t.add(
        "remote",
        "ds[i], HTTP, verified (default)",
        verified,
        "samples/s",
        fname,
        f"+{extra:.0f} bytes/sample",
    )


def _chunked_floor(nginx: Nginx, paths: list[Path], spans: tuple, args: Any) -> float:
    """fs.cat_ranges of the sample spans in bench_cache's epoch order, batches of 32."""
    import fsspec

    _, cum, starts, ends = spans
    total = args.samples * len(paths)  # chunks of one shard each, as bench_cache's epoch
    order = list(ChunkedSampler(range(total), chunksize=args.samples, seed=0, shufflefirst=True))
    urls = [f"{nginx.base}/{p.name}" for p in paths]
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    plans = []
    for k in range(0, len(order), 32):
        batch = [bench_read._locate(cum, i) for i in order[k : k + 32]]
        plans.append(
            (
                [urls[s] for s, _ in batch],
                [int(starts[s][j]) for s, j in batch],
                [int(ends[s][j]) for s, j in batch],
            )
        )
    fs.cat_ranges(*plans[0])
    t0 = time.perf_counter()
    for p in plans:
        fs.cat_ranges(*p)
    return len(order) / (time.perf_counter() - t0)


SHARD_EPOCHS = 3  # epochs of access="shard" in the cache section; the best is shown


def cache_section(
    t: Table, nginx: Nginx, http_index: str, paths: list[Path], spans: tuple, work: Path, args: Any
) -> None:
    total = sum(p.stat().st_size for p in paths)
    fname = "fs.cat_ranges(32), HTTP, chunked order"
    t.add("cache", fname, _chunked_floor(nginx, paths, spans, args), "samples/s")
    ns = argparse.Namespace(samples=args.samples, batch=32, share=0.05)
    for mode in ("range", "shard", "auto"):
        cache = None if mode == "range" else str(work / f"cache-{mode}")
        # shard: best of SHARD_EPOCHS (its epoch is mostly a download and an fsync per shard,
        # whose times vary by +-30 % from one epoch to the next on a shared machine)
        runs = []
        for _ in range(SHARD_EPOCHS if mode == "shard" else 1):
            try:
                runs.append(bench_cache.run_mode(mode, http_index, cache, ns, nginx))
            finally:
                if cache:
                    shutil.rmtree(cache, ignore_errors=True)
        res = min(runs, key=lambda r: r["epoch"])
        spread = ""
        if len(runs) > 1:
            rates = sorted(r["n"] / r["epoch"] for r in runs)
            spread = f"best of {len(runs)} epochs ({rates[0]:,.0f}-{rates[-1]:,.0f}/s), "
        t.add(
            "cache",
            f'epoch, access="{mode}", HTTP',
            res["n"] / res["epoch"],
            "samples/s",
            fname,
            f"{spread}first sample {res['first'] * 1e3:.0f} ms, "
            f"{res['requests'] / res['n']:.3f} req/sample, downloaded {res['bytes'] / total:.2f}x",
        )


def latency_section(t: Table, args: Any) -> None:
    """``tools/bench_latency.py``'s rows (its own data, nginx and proxy), as ratios to its floor."""
    largs = bench_latency.parse_args(["--quick"] if args.quick else [])
    if args.reference:
        largs.reference = args.reference
    res = bench_latency.run(largs)
    fname = "latency: whole shards, 4 connections"
    for name, f in res.items():
        if name == "first-sample":
            t.add(
                "latency",
                "latency: first ds[i] in a fresh process",
                f["first_ms"],
                "ms",
                note=f"{f['req_per_sample']:.0f} requests, index load included",
            )
            continue
        first = "" if f["first_ms"] is None else f"first batch {f['first_ms']:,.0f} ms, "
        t.add(
            "latency",
            fname if name == "floor" else f"latency: {name}",
            f["rate"],
            "samples/s",
            None if name == "floor" else fname,
            f"{first}{f['req_per_sample']:.3f} req/sample, downloaded {f['bytes_x']:.2f}x",
        )


# -- the reference wids, in its own venv ------------------------------------------------------

_REF_BUILD = textwrap.dedent(
    """
    import argparse, json, sys, time
    from wids.wids_index import main_create
    files, out = json.loads(sys.argv[1]), sys.argv[2]
    t = time.perf_counter()
    main_create(argparse.Namespace(files=files, output=out, name="bench", info=None, base=None))
    print(json.dumps({"seconds": time.perf_counter() - t}))
    """
)

_REF_LOADER = textwrap.dedent(
    """
    import json, sys, time
    from torch.utils.data import DataLoader
    from wids import ShardListDataset
    index, cache, seconds = sys.argv[1], sys.argv[2], float(sys.argv[4])
    with open(sys.argv[3]) as f:
        order = json.load(f)
    ds = ShardListDataset(index, cache_dir=cache, transformations=[])
    loader = DataLoader(ds, batch_size=32, num_workers=2, sampler=order, collate_fn=lambda b: b)
    n, t = 0, time.perf_counter()
    for batch in loader:
        n += len(batch)
        if time.perf_counter() - t > seconds:
            break
    print(json.dumps({"rate": n / (time.perf_counter() - t), "n": n}))
    """
)


def _ref_run(venv: str, script: str, argv: list[str], timeout: float) -> dict | None:
    """Run ``script`` with the reference venv's Python; its last stdout line is JSON."""
    work = tempfile.mkdtemp(prefix="wids-bench-ref-")
    return bench_read.run_reference(venv, script, argv, work, timeout)


def reference_section(
    t: Table,
    venv: str,
    paths: list[Path],
    work: Path,
    index: str,
    nginx: Nginx,
    order: list[int],
    args: Any,
    step: Callable[[str], None],
) -> None:
    floor_rows = {r.what: r for r in t.rows}
    scan_floor = "header-only scan (pread, size only)"
    members = sum(bench_index.floor_scan(p) for p in paths)
    step("reference: index build")
    out = str(work / "ref-index.json")
    got = _ref_run(venv, _REF_BUILD, [json.dumps([str(p) for p in paths]), out], timeout=1800)
    if got:
        ours = floor_rows.get("build_index -> JSON, local files (md5, the default)")
        rate = members / got["seconds"]
        t.add(
            "reference",
            "reference widsindex create, local files",
            rate,
            "members/s",
            scan_floor,
            f"ours / reference: {ours.value / rate:.2f}" if ours else "",
        )
    cache = str(work / "ref-cache")
    for what, idx, floor, ours_name in (
        (
            "reference ds[i], local shards",
            index,
            "os.pread of the sample spans",
            "ds[i], local shards",
        ),
        (
            "reference ds[i], HTTP",
            f"{nginx.base}/bench.json",
            "fs.cat_ranges(32 spans), HTTP",
            "ds.__getitems__(32), HTTP",
        ),
    ):
        step(f"reference: {what.split(', ')[1]}")
        rate = bench_read.bench_reference(venv, idx, order, args.ref_seconds)
        if rate is not None:
            ours = floor_rows.get(ours_name)
            t.add(
                "reference",
                what,
                rate,
                "samples/s",
                floor,
                (f"ours / reference: {ours.value / rate:.2f}" if ours else "")
                + ("; it downloads whole shards to its cache first" if "HTTP" in what else ""),
            )
    step("reference: DataLoader")
    os.makedirs(cache, exist_ok=True)
    order_file = str(work / "ref-order.json")
    with open(order_file, "w") as f:
        json.dump(order, f)
    got = _ref_run(
        venv,
        _REF_LOADER,
        [index, cache, order_file, str(args.ref_seconds)],
        timeout=args.ref_seconds * 20 + 300,
    )
    shutil.rmtree(cache, ignore_errors=True)
    if got:
        ours = floor_rows.get("DataLoader(2 workers, batch 32), local")
        t.add(
            "reference",
            "reference DataLoader(2 workers, batch 32), local",
            got["rate"],
            "samples/s",
            ours.floor if ours else None,
            f"ours / reference: {ours.value / got['rate']:.2f}" if ours else "",
        )


# -- main -------------------------------------------------------------------------------------


def _machine() -> str:
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    import torch

    gpu = "CUDA" if torch.cuda.is_available() else "CPU only"
    return (
        f"{os.cpu_count()} cores{mem}, {gpu}, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small data (4 x 500), for a smoke run")
    p.add_argument("--shards", type=int, help="shards (default 32; --quick 4)")
    p.add_argument("--samples", type=int, help="samples per shard (default 1000; --quick 500)")
    p.add_argument("--n", type=int, help="random reads per measurement (20000; --quick 2000)")
    p.add_argument("--repeat", type=int, help="best of this many runs for index figures (3)")
    p.add_argument("--data", help="dataset directory to create or reuse (default: a temp dir)")
    p.add_argument("--reference", metavar="VENV", help="venv with webdataset==0.2.111")
    p.add_argument(
        "--latency", action="store_true", help="also the rows under +25 ms, 50 MB/s per connection"
    )
    p.add_argument("--ref-seconds", type=float, default=20.0, help="time budget per reference read")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument(
        "--update-docs", action="store_true", help="write the table into docs/benchmarks.md"
    )
    args = p.parse_args(argv)
    quick = args.quick
    args.shards = args.shards or (4 if quick else 32)
    args.samples = args.samples or (500 if quick else 1000)
    args.n = args.n or (2000 if quick else 20000)
    args.repeat = args.repeat or (1 if quick else 3)
    args.sqlite_shards = 50 if quick else 1000
    if quick:
        args.ref_seconds = min(args.ref_seconds, 5.0)
    if args.reference and not os.path.exists(os.path.join(args.reference, "bin", "python")):
        print(f"bench: reference venv {args.reference} not found; skipping it", file=sys.stderr)
        args.reference = None

    from tqdm import tqdm

    steps = 6 + (4 if args.reference else 0) + (1 if args.latency else 0)
    bar = tqdm(total=steps, unit="step", desc="bench", file=sys.stderr, leave=False)
    started = [False]

    def step(name: str) -> None:
        """Mark the previous step done and show the next one."""
        if started[0]:
            bar.update(1)
        started[0] = True
        bar.set_description(name)

    work = Path(tempfile.mkdtemp(prefix="wids-bench-"))
    data = args.data or str(work / "data")
    nginx: Nginx | None = None
    table = Table()
    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    try:
        bar.set_description("writing the dataset")
        data, index = bench_read._prepare(
            argparse.Namespace(data=data, shards=args.shards, samples=args.samples)
        )
        paths = sorted(Path(data).glob("bench-*.tar"))[: args.shards]
        size = sum(q.stat().st_size for q in paths)
        spans = bench_read._spans(index)
        total = int(spans[1][-1])
        rng = random.Random(0)
        order = [rng.randrange(total) for _ in range(min(args.n, total))]
        nginx = Nginx(data)
        step("index build")
        http_index = index_section(table, paths, work, nginx, args)
        step("local reads")
        read_section(table, index, order, spans)
        step("DataLoader")
        loader_section(table, index, order, spans)
        step("HTTP reads")
        remote_section(table, nginx, order, spans, data)
        step("cache modes")
        cache_section(table, nginx, http_index, paths, spans, work, args)
        if args.reference:
            reference_section(table, args.reference, paths, work, index, nginx, order, args, step)
        if args.latency:
            step("latency proxy")
            latency_section(table, args)
        step("done")
    finally:
        bar.close()
        if nginx is not None:
            nginx.stop()
        shutil.rmtree(work, ignore_errors=True)

    command = f"python tools/bench.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    header = [
        f"{len(paths)} shards x {args.samples} samples (jpg ~20 KB + cls + json, random bytes), "
        f"{size / 1e6:.0f} MB; {len(order):,} random reads per read figure; warm page cache; "
        "servers on 127.0.0.1",
        f"machine: {_machine()}; load average at start {load:.1f}",
        f"command: {command.strip()} ({time.perf_counter() - t_start:.0f} s)",
    ]
    legend = "ratio = figure / floor figure (1.00 = as fast as the floor; higher is faster)"
    print("\n".join(header))
    print(table.render())
    print(legend)
    if args.markdown:
        print()
        print(table.markdown())
    if args.update_docs:
        _update_docs(header, table.markdown(), legend)
    return 0


def _update_docs(header: list[str], markdown: str, legend: str) -> None:
    """Put this run's table between the bench-table markers of docs/benchmarks.md."""
    readme = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    start, end = "<!-- bench-table:start -->", "<!-- bench-table:end -->"
    text = readme.read_text()
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    lines = "\n".join(f"- {h}" for h in header)
    readme.write_text(f"{head}{start}\n{lines}\n\n{markdown}\n\n{legend}.\n{end}{tail}")
    print(f"updated {readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
