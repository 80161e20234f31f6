"""Index builds, verification and subsets on a Dask cluster (a real LocalCluster, 2 processes)."""

from __future__ import annotations

import os
import shutil

import pytest

from wids import open_index
from wids.cli import main
from wids.errors import WidsError
from wids.index import build_index, verify_index
from wids.subset import make_subset
from wids.synth import write_dataset, write_shard

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

NSHARDS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # dask's scratch space (else ./dask-scratch-space or $TMPDIR's, left behind) under tmp_path
    scratch = str(tmp_path_factory.mktemp("dask-scratch"))
    with (
        dask.config.set({"temporary-directory": scratch}),
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",  # loopback, any free port (8787 may be taken)
            local_directory=scratch,
        ) as lc,
        distributed.Client(lc) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("dask-ds")
    return write_dataset(
        str(d), shards=NSHARDS, samples_per_shard=20, real_images=False, jpg_bytes=2000
    )


def tree(directory) -> dict[str, bytes]:
    """Every file under ``directory`` (relative name -> bytes)."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, directory)] = fh.read()
    return out


def test_dask_build_over_http_is_byte_identical_to_a_local_build(
    cluster, shards, http_server, tmp_path
):
    urls = [http_server.put(p, f"dask/{os.path.basename(p)}") for p in shards]
    opts = http_server.storage_options
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    here = build_index(urls, str(tmp_path / "one" / "idx.json"), storage_options=opts)
    there = build_index(
        urls,
        str(tmp_path / "two" / "idx.json"),
        storage_options=opts,
        executor=cluster.get_executor(),
    )
    assert (there.scanned, there.reused, there.samples) == (NSHARDS, 0, NSHARDS * 20)
    assert (there.bytes_read, there.requests) == (here.bytes_read, here.requests)
    one, two = tree(tmp_path / "one"), tree(tmp_path / "two")
    assert len(one) == NSHARDS + 1 and one == two  # the description and every sidecar
    # SQLite (and the shard table): the jobs return member tables, the client writes them.
    sql = build_index(
        urls, str(tmp_path / "idx.sqlite"), storage_options=opts, executor=cluster.get_executor()
    )
    assert sql.scanned == NSHARDS
    a, b = open_index(str(tmp_path / "idx.sqlite")), open_index(str(tmp_path / "one" / "idx.json"))
    try:
        assert [a.members(k) for k in range(NSHARDS)] == [b.members(k) for k in range(NSHARDS)]
    finally:
        a.close()
        b.close()


def test_dask_build_writes_sidecars_to_s3_and_a_rerun_keeps_them(cluster, shards, s3_server):
    urls = [s3_server.put(p, f"dask/{os.path.basename(p)}") for p in shards]
    opts = s3_server.storage_options
    out = s3_server.url("dask-index/idx.json")
    ex = cluster.get_executor()
    first = build_index(urls, out, storage_options=opts, executor=ex)
    assert (first.scanned, first.reused) == (NSHARDS, 0)
    again = build_index(urls, out, storage_options=opts, executor=ex)
    assert (again.scanned, again.reused, again.bytes_read) == (0, NSHARDS, 0)
    local = open_index(build_index(shards, os.path.dirname(shards[0]) + "/loc.json").output)
    idx = open_index(out, opts)
    try:  # sidecars written by the workers were kept (not removed as stale) and load
        assert [idx.members(k) for k in range(NSHARDS)] == [
            local.members(k) for k in range(NSHARDS)
        ]
    finally:
        idx.close()
        local.close()


def test_a_rerun_after_a_crash_scans_only_shards_without_sidecars(cluster, shards, tmp_path):
    local = [shutil.copy(p, tmp_path) for p in shards]
    out = str(tmp_path / "idx.json")
    done = []

    def crash(n: int, total: int) -> None:
        done.append(n)
        if n == 3:
            raise KeyboardInterrupt  # the client dies after three shards

    with pytest.raises(KeyboardInterrupt):
        build_index(local, out, executor=cluster.get_executor(), progress=crash)
    assert not os.path.exists(out)  # no description: the client wrote nothing itself
    assert len(os.listdir(tmp_path / "idx.members")) >= 3  # the finished shards' sidecars
    rerun = build_index(local, out, executor=cluster.get_executor())
    # Jobs in flight at the crash may or may not have finished: those are all that is lost.
    assert rerun.reused >= 3 and rerun.scanned == NSHARDS - rerun.reused
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for p in local:
        shutil.copy2(p, fresh)
    build_index([str(fresh / os.path.basename(p)) for p in local], str(fresh / "idx.json"))
    assert tree(tmp_path / "idx.members") == tree(fresh / "idx.members")


def test_a_bad_shard_is_the_only_one_rescanned(cluster, shards, tmp_path):
    local = [shutil.copy(p, tmp_path) for p in shards]
    good = open(local[2], "rb").read()
    with open(local[2], "wb") as f:
        f.write(good[:700])  # truncated
    out = str(tmp_path / "idx.json")
    ex = cluster.get_executor()
    with pytest.raises(WidsError):
        build_index(local, out, executor=ex)
    report = build_index(local, out, executor=ex, skip_bad=True)
    assert len(report.bad) == 1 and report.shards == NSHARDS - 1
    with open(local[2], "wb") as f:
        f.write(good)
    fixed = build_index(local, out, executor=ex)
    assert (fixed.scanned, fixed.reused, fixed.shards) == (1, NSHARDS - 1, NSHARDS)


def test_cli_create_verify_and_subset_with_dask(cluster, shards, tmp_path, capsys):
    address = cluster.scheduler.address
    local = [shutil.copy(p, tmp_path) for p in shards]
    out = str(tmp_path / "idx.json")
    assert main(["index", "create", *local, "-o", out, "-q", "--dask", address]) == 0
    assert f"{NSHARDS} scanned" in capsys.readouterr().out
    assert verify_index(out, executor=cluster.get_executor(), deep=True) == (NSHARDS, [])
    write_shard(local[1], [("x.cls", b"1"), ("y.cls", b"2")])  # changed behind the index
    assert main(["index", "verify", out, "--dask", address]) == 1
    text = capsys.readouterr().out
    assert "CHANGED" in text and os.path.basename(local[1]) in text
    assert f"{NSHARDS - 1} of {NSHARDS} shards match" in text
    sub = tmp_path / "sub"
    report = make_subset(out, sub, shards=slice(2, 5), executor=cluster.get_executor())
    assert report.copied == 3 and sorted(os.listdir(sub)) == sorted(
        ["idx.json", "idx.members", *(os.path.basename(p) for p in local[2:5])]
    )
    assert (
        main(["subset", out, "--shards", "5:", "--to", str(tmp_path / "s2"), "--dask", address])
        == 0
    )
