"""ShardListDataset against real servers on 127.0.0.1 (moto S3, nginx HTTP, GCS emulator).

Every sample read through ``ds[i]`` and ``__getitems__`` must equal what ``tarfile`` reads from
the same shard; requests are counted at the server (nginx's access log).
"""

from __future__ import annotations

import io
import json
import os
import random
import tarfile
import uuid

import pytest
from tar_oracle import dataset_samples, strip_meta

from wids import IndexMismatchError, ShardListDataset, build_index
from wids.synth import write_dataset

NS, NSAMPLES = 4, 20


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote-src")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, extra_fields=True)
    build_index(paths, str(d / "train.json"), name="train")  # shards stored relative
    return d, paths, dataset_samples(paths)


def _upload(server, local_dir):
    """Upload shards, index and member sidecars under a fresh prefix; return the index URL."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    for root, _, files in os.walk(local_dir):
        for f in files:
            path = os.path.join(root, f)
            rel = os.path.relpath(path, local_dir)
            server.put(path, f"{prefix}/{rel}")
    return prefix, server.url(f"{prefix}/train.json")


def _check(ds, oracle):
    assert len(ds) == len(oracle)
    for i in range(len(ds)):
        assert strip_meta(ds[i]) == oracle[i], i
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    for k in range(0, len(order), 13):
        batch = order[k : k + 13]
        assert [strip_meta(s) for s in ds.__getitems__(batch)] == [oracle[i] for i in batch]


def test_remote_index_every_sample(remote_server, local):
    d, _, oracle = local
    prefix, index = _upload(remote_server, d)
    ds = ShardListDataset(index, transformations=[], storage_options=remote_server.storage_options)
    _check(ds, oracle)
    assert ds[0]["__shard__"] == remote_server.url(f"{prefix}/synth-000000.tar")
    assert ds.stats.errors == 0


@pytest.mark.parametrize("where", ["local", "memory"])
def test_local_and_memory_every_sample(where, local, tmp_path):
    d, paths, oracle = local
    if where == "local":
        index = str(d / "train.json")
    else:
        import fsspec

        fs = fsspec.filesystem("memory")
        urls = []
        for p in paths:
            url = f"memory://wids-remote-test/{os.path.basename(p)}"
            with open(p, "rb") as f:
                fs.pipe_file(url, f.read())
            urls.append(url)
        index = str(tmp_path / "mem.json")
        build_index(urls, index, name="train")
    ds = ShardListDataset(index, transformations=[])
    _check(ds, oracle)


def test_remote_list_of_dicts_scanned(remote_server, local, tmp_path):
    d, _, oracle = local
    prefix, _ = _upload(remote_server, d)
    shards = [
        {"url": remote_server.url(f"{prefix}/synth-{s:06d}.tar"), "nsamples": NSAMPLES}
        for s in range(NS)
    ]
    ds = ShardListDataset(
        shards,
        transformations=[],
        storage_options=remote_server.storage_options,
        cache_dir=str(tmp_path),
    )
    _check(ds, oracle)


def test_decoded_remote(remote_server, local):
    d, _, _ = local
    _, index = _upload(remote_server, d)
    s = ShardListDataset(index, storage_options=remote_server.storage_options)[5]
    assert s[".jpg"].size == (64, 64) and s[".json"]["key"] == s["__key__"]


def _methods(server, name):
    want = "/" + name
    out = []
    for line in server.access_log.read_text().splitlines():
        parts = line.split(" ")
        if parts and parts[0] == want:
            out.append((parts[2], parts[1]))
    return out


def test_http_one_request_per_sample(http_server, local):
    d, _, oracle = local
    prefix, index = _upload(http_server, d)
    ds = ShardListDataset(index, transformations=[], verify=False)
    len(ds)
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    for i in order[: NS * 3]:
        ds[i]  # member tables loaded
    http_server.reset_counts()
    for i in order:
        assert strip_meta(ds[i]) == oracle[i]
    names = [f"{prefix}/synth-{s:06d}.tar" for s in range(NS)]
    per_shard = [http_server.request_count(n) for n in names]
    assert sum(per_shard) == len(order) == http_server.request_count()
    assert per_shard == [NSAMPLES] * NS
    for n in names:
        assert all(m == ("GET", "206") for m in _methods(http_server, n))


def test_http_verify_needs_no_head_and_checks_reads(http_server, local):
    d, _, oracle = local
    prefix, index = _upload(http_server, d)
    ds = ShardListDataset(index, transformations=[])
    http_server.reset_counts()
    for i in range(len(ds)):
        assert strip_meta(ds[i]) == oracle[i]
    for s in range(NS):
        methods = _methods(http_server, f"{prefix}/synth-{s:06d}.tar")
        # one GET per sample and nothing else: the first answer's Content-Range total and
        # ETag are the fingerprint check, and each GET carries the sample's member header
        assert methods == [("GET", "206")] * NSAMPLES, methods


def test_http_getitems_chunked_batch(http_server, local):
    d, _, oracle = local
    prefix, index = _upload(http_server, d)
    ds = ShardListDataset(index, transformations=[], verify=False, merge_gap=0)
    len(ds)
    for s in range(NS):
        ds[s * NSAMPLES]  # member tables loaded
    batch = [s * NSAMPLES + 5 + j for s in range(4) for j in range(8)]
    random.Random(2).shuffle(batch)
    http_server.reset_counts()
    got = ds.__getitems__(batch)
    assert [strip_meta(x) for x in got] == [oracle[i] for i in batch]
    assert http_server.request_count() == 4  # one per contiguous group
    batch = [s * NSAMPLES + j for s in range(4) for j in (0, 1, 10, 11, 12)]
    http_server.reset_counts()
    got = ds.__getitems__(batch)
    assert [strip_meta(x) for x in got] == [oracle[i] for i in batch]
    assert http_server.request_count() == 8


def test_http_changed_shard_detected(http_server, local, tmp_path):
    d, _, _ = local
    prefix, index = _upload(http_server, d)
    ds = ShardListDataset(index, transformations=[])
    ds[0]
    http_server.put_bytes(b"x" * 10240, f"{prefix}/synth-000001.tar")
    with pytest.raises(IndexMismatchError, match="synth-000001.tar"):
        ds[NSAMPLES]


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_dataloader_after_parent_read(remote_server, local, ctx):
    torch = pytest.importorskip("torch")
    d, _, oracle = local
    _, index = _upload(remote_server, d)
    ds = ShardListDataset(index, transformations=[], storage_options=remote_server.storage_options)
    ds[0]
    ds.__getitems__([1, 30, 70])  # the parent has open filesystems and sessions
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        multiprocessing_context=ctx,
        collate_fn=_as_list,
        sampler=random.Random(3).sample(range(len(ds)), len(ds)),
    )
    got = {s["__index__"]: strip_meta(s) for b in loader for s in b}
    assert got == dict(enumerate(oracle))
    assert strip_meta(ds[-1]) == oracle[-1]  # and the parent still reads


def _as_list(batch):
    return batch


def test_s3_etag_checked(s3_server, local, tmp_path):
    d, paths, oracle = local
    prefix = f"e{uuid.uuid4().hex[:8]}"
    urls = [s3_server.put(p, f"{prefix}/{os.path.basename(p)}") for p in paths]
    index = str(tmp_path / "s3.json")
    build_index(urls, index, storage_options=s3_server.storage_options)
    ds = ShardListDataset(index, transformations=[], storage_options=s3_server.storage_options)
    assert ds._catalog.load().infos[0].etag  # the index recorded the etag
    assert strip_meta(ds[0]) == oracle[0]
    # same size, other bytes: only the etag tells
    with open(paths[1], "rb") as f:
        data = bytearray(f.read())
    data[-1] ^= 0xFF
    s3_server.put_bytes(bytes(data), f"{prefix}/{os.path.basename(paths[1])}")
    with pytest.raises(IndexMismatchError, match="etag"):
        ds[NSAMPLES]


def _label_tar(labels) -> bytes:
    """A small shard: samples ``k{i:04d}`` with a ``.cls`` label and a fixed-size ``.bin``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i, label in enumerate(labels):
            for name, data in ((f"k{i:04d}.cls", b"%d\n" % label), (f"k{i:04d}.bin", b"x" * 900)):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1700000000
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_http_without_etag_same_size_rewrite_is_an_error(http_server, tmp_path):
    name = f"n{uuid.uuid4().hex[:8]}/a.tar"
    http_server.put_bytes(_label_tar([0, 1, 2]), name)
    url = http_server.url(f"noetag/{name}")
    info = http_server.fs.info(url)
    assert "ETag" not in info and "Last-Modified" in info  # the server gives no etag
    index = str(tmp_path / "i.json")
    build_index([url], index)
    assert ShardListDataset(index, transformations=[])[1][".cls"] == b"1\n"
    path = http_server.path(name)
    st = os.stat(path)
    http_server.put_bytes(_label_tar([0, 7, 2]), name)  # rewritten later, at the same size
    os.utime(path, (st.st_atime + 5, st.st_mtime + 5))  # (HTTP dates have whole seconds)
    assert os.stat(path).st_size == st.st_size
    ds = ShardListDataset(index, transformations=[])
    with pytest.raises(IndexMismatchError, match="modified at") as e:
        ds[1]  # was served as b"7\n"
    assert e.value.shard == url


def test_url_map_reads_an_nginx_index_from_s3(http_server, s3_server, local, tmp_path):
    _, paths, oracle = local
    prefix = f"m{uuid.uuid4().hex[:8]}"
    urls = [http_server.put(p, f"{prefix}/{os.path.basename(p)}") for p in paths]
    index = str(tmp_path / "i.json")
    build_index(urls, index)  # absolute nginx URLs, nginx's etags
    for p in paths:
        s3_server.put(p, f"{prefix}/{os.path.basename(p)}")
    url_map = {http_server.url(prefix) + "/": s3_server.url(prefix) + "/"}
    ds = ShardListDataset(
        index,
        transformations=[],
        url_map=url_map,
        storage_options=s3_server.storage_options,
    )
    http_server.reset_counts()
    _check(ds, oracle)
    assert http_server.request_count() == 0
    assert ds[0]["__shard__"] == s3_server.url(f"{prefix}/synth-000000.tar")
    # the same through the command line
    from wids.cli import main

    ((old, new),) = url_map.items()
    argv = ["index", "verify", index, "--url-map", f"{old}={new}"]
    for key, value in s3_server.storage_options.items():
        argv += ["-s", f"{key}={json.dumps(value)}"]
    assert main(argv) == 0


# -- first touch costs no request of its own (issue 12, fewer round trips) -------------------


@pytest.fixture(params=["http", "s3"])
def proxied(request, fault_proxy, local, tmp_path):
    """(proxy, storage options, shard URLs, local index over them) for shards behind a proxy."""
    server = request.getfixturevalue(f"{request.param}_server")
    proxy = fault_proxy(server.base if server.protocol == "http" else server.endpoint)
    _, paths, _ = local
    prefix = f"p{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}/{os.path.basename(p)}" for p in paths]
    for p, name in zip(paths, names, strict=True):
        server.put(p, name)
    if server.protocol == "http":
        options: dict = {}
        urls = [proxy.url(n) for n in names]
    else:
        options = {
            **server.storage_options,
            "client_kwargs": {"endpoint_url": proxy.base, "region_name": "us-east-1"},
        }
        urls = [server.url(n) for n in names]
    index = str(tmp_path / "proxied.json")  # a local index: every proxied request is a shard's
    build_index(urls, index, storage_options=options)
    return server, proxy, options, names, index


def test_first_read_of_a_remote_shard_is_one_request(proxied, local):
    server, proxy, options, names, index = proxied
    oracle = local[2]
    ds = ShardListDataset(index, transformations=[], storage_options=options)
    len(ds)
    proxy.reset_counts()
    assert strip_meta(ds[NSAMPLES + 3]) == oracle[NSAMPLES + 3]
    assert proxy.requests == 1, proxy.paths  # no HEAD / stat before the first range read
    assert strip_meta(ds[NSAMPLES + 7]) == oracle[NSAMPLES + 7]
    assert proxy.requests == 2
    batch = [2 * NSAMPLES + 1, 3 * NSAMPLES + 2]  # first touches inside a batch too
    assert [strip_meta(x) for x in ds.__getitems__(batch)] == [oracle[i] for i in batch]
    assert proxy.requests == 4, proxy.paths


@pytest.mark.parametrize("change", ["same size", "shorter", "longer"])
def test_first_read_of_a_replaced_shard_is_refused(proxied, local, change):
    server, proxy, options, names, index = proxied
    paths = local[1]
    with open(paths[1], "rb") as f:
        data = bytearray(f.read())
    if change == "same size":
        data[-1024] ^= 0xFF  # in the end-of-archive padding: the samples' bytes are the same
    elif change == "shorter":
        data = data[: len(data) // 3]
    else:
        data += bytes(10240)
    server.put_bytes(bytes(data), names[1])
    if server.protocol == "http":  # nginx's etag is mtime (whole seconds) and size
        st = os.stat(server.path(names[1]))
        os.utime(server.path(names[1]), (st.st_atime + 5, st.st_mtime + 5))
    ds = ShardListDataset(index, transformations=[], storage_options=options)
    len(ds)
    proxy.reset_counts()
    for i in (NSAMPLES + NSAMPLES // 2, NSAMPLES + NSAMPLES - 1):
        with pytest.raises(IndexMismatchError, match="not the shard the index describes") as e:
            ds[i]
        assert "synth-000001.tar" in str(e.value)
    batch = [0, NSAMPLES + 1]
    with pytest.raises(IndexMismatchError, match="not the shard the index describes"):
        ds.__getitems__(batch)
    # no retries of a mismatch: one read per attempt (and a stat where S3 refuses the range)
    assert proxy.requests <= 2 * 3 + 1, proxy.paths
    server.put(paths[1], names[1])  # restored


_PRELOAD = """
import json, sys
from wids import ShardListDataset
ds = ShardListDataset(sys.argv[1], transformations=[], storage_options=json.loads(sys.argv[2]))
seen = ["aiohttp" in sys.modules]
len(ds)  # what a DataLoader's main process does before forking its workers
seen.append("aiohttp" in sys.modules)
ds[3], ds.__getitems__([1, 2, 30, 31])  # what its workers do
seen.append("aiohttp" in sys.modules)
print(*seen)
"""


@pytest.mark.parametrize(
    ("options", "imported"),
    [
        ({}, ["False", "False", "False"]),  # the plain client's: no aiohttp anywhere
        ({"headers": {"X-Client": "wids"}}, ["False", "True", "True"]),  # before workers fork
    ],
)
def test_loading_a_remote_dataset_imports_only_the_client_it_reads_with(proxied, options, imported):
    """aiohttp is imported when the main process loads the dataset if its reads need it
    (forked workers inherit it), and nowhere if they go on the plain client (storage/http1)."""
    import json
    import subprocess
    import sys

    server, proxy, _, names, index = proxied
    if server.protocol != "http":
        pytest.skip("s3fs imports botocore at import already")
    out = subprocess.run(
        [sys.executable, "-c", _PRELOAD, index, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == imported


def test_loading_a_remote_dataset_connects_nowhere(proxied):
    server, proxy, options, names, index = proxied
    proxy.reset_counts()
    ds = ShardListDataset(index, transformations=[], storage_options=options)
    len(ds)
    assert proxy.requests == 0  # a local index: nothing connected before the first read


def test_one_connection_per_process_for_many_reads(proxied, local):
    server, proxy, options, names, index = proxied
    oracle = local[2]
    ds = ShardListDataset(index, transformations=[], storage_options=options, lru_size=1)
    len(ds)
    proxy.reset_counts()
    for i in range(0, len(ds), 3):  # every shard, readers reopened (lru_size=1)
        assert strip_meta(ds[i]) == oracle[i]
    assert proxy.requests == len(range(0, len(ds), 3))
    # the process's client keeps its connections alive (those build_index opened, or one)
    assert proxy.connections <= 1, proxy.connections
    ds2 = ShardListDataset(index, transformations=[], storage_options=options)
    assert strip_meta(ds2[5]) == oracle[5]
    ds.__getitems__([1, 2, 60, 61])  # two requests at once
    # each dataset's store keeps its own plain keep-alive connections (storage/http1.py), a
    # shard's first answer included: the second dataset's one, and one more for the two at once
    assert proxy.connections <= 3


@pytest.mark.parametrize("at", ["batch", "load"])
def test_a_batch_fetches_its_shards_member_tables_at_once(
    http_server, local, fault_proxy, monkeypatch, at
):
    """A batch's first touches of several shards fetch their tables at once; a small remote
    index (up to PICKLED_TABLES shards) fetches them all at once when it loads."""
    from faultproxy import FaultPlan

    import wids.dataset.catalog as catalog_module

    if at == "batch":  # a larger index: nothing fetched with it
        monkeypatch.setattr(catalog_module, "PICKLED_TABLES", NS - 1)
    d, _, oracle = local
    prefix, _ = _upload(http_server, d)
    # every member-table sidecar request waits 0.3 s: fetched one after another, they never
    # overlap; fetched at once, they do
    plan = FaultPlan({"delay": 1.0}, rate=1.0, only=".members/", delay=0.3)
    proxy = fault_proxy(http_server.base, plan)
    ds = ShardListDataset(proxy.url(f"{prefix}/train.json"), transformations=[])
    len(ds)
    loaded = [p for p in proxy.paths if ".members/" in p]
    if at == "load":
        assert len(loaded) == NS
        assert proxy.peak_delayed >= 2, proxy.peak_delayed  # sidecar requests overlapped
    proxy.reset_counts()
    batch = [s * NSAMPLES + 3 for s in range(NS)]
    assert [strip_meta(x) for x in ds.__getitems__(batch)] == [oracle[i] for i in batch]
    sidecars = [p for p in proxy.paths if ".members/" in p]
    if at == "load":
        assert not sidecars  # the batch had them already
        return
    assert not loaded and len(sidecars) == NS
    assert proxy.peak_delayed >= 2, proxy.peak_delayed  # sidecar requests overlapped


def _established_to(port: int) -> set[str]:
    """The socket inodes of this process's established TCP connections to 127.0.0.1:``port``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    # remote address 127.0.0.1:port in /proc's hex, state 01 (ESTABLISHED)
    remote = f"0100007F:{port:04X}"
    return {r[9] for r in rows if r[2] == remote and r[3] == "01" and r[9] in inodes}


def _inode(sock) -> str:
    return os.readlink(f"/proc/self/fd/{sock.fileno()}")[8:-1]


def test_close_closes_the_idle_plain_http_connections(http_server, local):
    """``ds.close()`` closes the kept-alive connections of the plain HTTP client (a batch's
    concurrent range reads open several); they stayed open until the server dropped them.
    Connections of the process's blocking per-thread client (single ``ds[i]`` reads, shared
    by every dataset of the process, so left to the server's keep-alive timeout) and of aiohttp
    are not this call's business."""
    import time
    from urllib.parse import urlsplit

    d, _, oracle = local
    _, index = _upload(http_server, d)
    port = int(urlsplit(index).port or 80)
    ds = ShardListDataset(index, transformations=[], verify=False, access="range")
    batch = list(range(len(ds)))
    assert [strip_meta(s) for s in ds.__getitems__(batch)] == [oracle[i] for i in batch]
    opened = _established_to(port)
    plain = ds._pool.catalog.store._plain._pools.values()
    idle = {_inode(c.transport.get_extra_info("socket")) for p in plain for c in p._idle}
    assert idle and idle <= opened  # the plain client's kept-alive connections
    from wids.storage.http1 import blocking_connections

    blocking = {_inode(c.sock) for c in blocking_connections("127.0.0.1", port).conns if c.sock}
    others = opened - idle - blocking  # aiohttp's (first answers)
    ds.close()
    deadline = time.monotonic() + 5
    while _established_to(port) & idle and time.monotonic() < deadline:
        time.sleep(0.01)
    left = _established_to(port)
    assert not left & idle  # every idle plain connection closed
    assert others <= left  # aiohttp's are left
    assert strip_meta(ds[3]) == oracle[3]  # and the dataset reads on


def test_a_subclass_getitem_is_given_the_batch_read_at_once(http_server, local):
    """A subclass that shapes its samples in ``__getitem__`` (reference code does) gets them
    from the DataLoader's batched read: adjacent samples in one request, not one each."""
    from torch.utils.data import DataLoader

    class Keys(ShardListDataset):
        def __getitem__(self, i):
            return super().__getitem__(i)["__key__"]

    d, _, oracle = local
    _, index = _upload(http_server, d)
    ds = Keys(index, transformations=[], access="range")
    ds.__getitems__([0])  # the shard's member table, opened and checked
    http_server.reset_counts()
    keys = next(iter(DataLoader(ds, batch_size=NSAMPLES, collate_fn=list)))
    assert keys == [s["__key__"] for s in oracle[:NSAMPLES]]
    assert http_server.request_count() == 1  # one shard's adjacent samples: one request
    assert ds[3] == oracle[3]["__key__"]  # alone, after the batch: read by itself
