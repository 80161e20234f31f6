"""The contenders of ``tools/bench_latency.py``: each a script run with ``python -c`` in its own
process (and venv), ``MEASURE`` first; the parent hands it a JSON config as ``sys.argv[1]``.

Each script makes its dataset and loader after the clock starts and ends with ``measure``,
which prints one JSON line: samples read, seconds, the first batch's latency and the CPU
seconds of the process and its children (the DataLoader's workers, webdataset's ``curl``) from
the clock's start (``t0 = start()``): imports before it (torch: ~2 CPU s; each peer's own
modules; for wids, its HTTP client too) are not counted. ``FIRST`` (a fresh process's first
``ds[i]``) imports only ``wids``: the client's import is in its figure.
"""

from __future__ import annotations

import textwrap

__all__ = ["FIRST", "FLOOR", "MEASURE", "REFERENCE", "WEBDATASET", "WIDS"]

# Every contender script ends by calling this on its loader: the JSON line the parent reads.
MEASURE = textwrap.dedent(
    """
    import json, resource, sys, time
    def cpu_now():
        cpu = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            cpu += r.ru_utime + r.ru_stime
        return cpu
    CPU0 = 0.0
    def start():
        global CPU0
        CPU0 = cpu_now()
        return time.perf_counter()
    def measure(t0, batches, first=None):
        n = 0
        for batch in batches:
            if first is None:
                first = time.perf_counter() - t0
            n += len(batch)
        seconds = time.perf_counter() - t0
        cpu = cpu_now() - CPU0
        print(json.dumps({"n": n, "seconds": seconds, "first": first, "cpu": cpu}))
    cfg = json.loads(sys.argv[1])
    """
)

FLOOR = textwrap.dedent(
    """
    import http.client, queue, threading, urllib.parse
    def fetch_all(jobs):
        while True:
            try:
                url = jobs.get_nowait()
            except queue.Empty:
                return
            u = urllib.parse.urlsplit(url)
            conn = conns.setdefault(threading.get_ident(), http.client.HTTPConnection(u.netloc))
            conn.request("GET", u.path)
            body = conn.getresponse().read()
            done.append((time.perf_counter(), cfg["per_shard"]))
    jobs, conns, done = queue.Queue(), {}, []
    for url in cfg["urls"]:
        jobs.put(url)
    t0 = start()
    threads = [threading.Thread(target=fetch_all, args=(jobs,)) for _ in range(cfg["workers"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    measure(t0, [range(k) for _, k in done], first=min(t for t, _ in done) - t0)
    """
)

WEBDATASET = textwrap.dedent(
    """
    import webdataset as wds
    from torch.utils.data import DataLoader
    t0 = start()
    ds = wds.WebDataset(cfg["urls"], shardshuffle=False)
    loader = DataLoader(ds, batch_size=cfg["batch"], num_workers=cfg["workers"],
                        collate_fn=lambda b: b)
    measure(t0, loader)
    """
)

REFERENCE = textwrap.dedent(
    """
    from torch.utils.data import DataLoader
    from wids import ChunkedSampler, ShardListDataset
    t0 = start()
    ds = ShardListDataset(cfg["index"], cache_dir=cfg["cache"], transformations=[])
    sampler = ChunkedSampler(ds, chunksize=cfg["per_shard"], seed=0, shufflefirst=True)
    loader = DataLoader(ds, batch_size=cfg["batch"], num_workers=cfg["workers"],
                        sampler=sampler, collate_fn=lambda b: b)
    measure(t0, loader)
    """
)

FIRST = textwrap.dedent(
    """
    from wids import ShardListDataset
    t0 = start()
    ds = ShardListDataset(cfg["index"], access="range", transformations=[])
    ds[0]
    measure(t0, [[0]], first=time.perf_counter() - t0)
    """
)

WIDS = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, RandomSampler
    from wids import ShardListDataset
    from wids.sampler import ChunkedSampler
    # imported up front, as the peers' modules are (webdataset, reference): the HTTP
    # client's import (aiohttp, ~0.3 s) is a process's, not the epoch's; FIRST keeps it in
    import fsspec.implementations.http
    import wids.cache.shards
    t0 = start()
    kw = {"cache_dir": cfg["cache"], "cache_size": cfg["budget"]} if cfg["cache"] else {}
    ds = ShardListDataset(cfg["index"], access=cfg["access"], transformations=[], **kw)
    if cfg["order"] == "chunked":
        sampler = ChunkedSampler(ds, chunksize=cfg["per_shard"], seed=0, shufflefirst=True,
                                 num_workers=cfg["workers"], batch_size=cfg["batch"])
    else:
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(ds, batch_size=cfg["batch"], num_workers=cfg["workers"],
                        sampler=sampler, collate_fn=lambda b: b)
    measure(t0, loader)
    ds.close()
    """
)
