"""``wids subset`` and ``wids cache``; the offline acceptance test with the server stopped."""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import pytest
from serverfixtures import HttpServer
from tar_oracle import dataset_samples, strip_meta

from wids import ShardCache, ShardListDataset, build_index
from wids.cli import main
from wids.cli.options import parse_duration, parse_size
from wids.errors import IndexMismatchError, OfflineError, OutputExistsError
from wids.storage import Source
from wids.subset import make_subset, select_shards
from wids.synth import write_dataset

NS, NSAMPLES = 5, 12


def _tree(root) -> dict[str, str]:
    """Every file and directory under ``root``: relative path -> sha256 of its bytes."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs:
            out[os.path.relpath(os.path.join(d, n), root) + "/"] = "dir"
        for n in files:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), root)] = hashlib.sha256(
                    f.read()
                ).hexdigest()
    return out


def _start_nginx(tmp_path, root):
    server = HttpServer(root, tmp_path / "nginx", workers=1)
    return server, server.base


@pytest.mark.servers
def test_subset_then_offline_with_the_server_stopped(tmp_path, capsys):
    root = tmp_path / "www"
    paths = write_dataset(
        str(root / "train"),
        shards=NS,
        samples_per_shard=NSAMPLES,
        real_images=False,
        jpg_bytes=800,
        extra_fields=True,
    )
    oracle = dataset_samples(paths)
    server, base = _start_nginx(tmp_path, root)
    try:
        urls = [f"{base}/train/{os.path.basename(p)}" for p in paths]
        build_index(urls, str(root / "train.json"), name="train")  # the index is remote too
        index_url = f"{base}/train.json"
        small = tmp_path / "small"
        assert main(["subset", index_url, "--shards", "1:3", "--to", str(small), "-q"]) == 0
        assert "2 shards" in capsys.readouterr().out
        # Again: the files are there, so it refuses (one line) and changes nothing ...
        before = _tree(small)
        assert main(["subset", index_url, "--shards", "1:3", "--to", str(small), "-q"]) == 2
        err = capsys.readouterr().err
        assert "already holds" in err and "--force" in err and err.count("\n") == 1
        assert _tree(small) == before
        # ... unless forced: every shard is copied (and verified) again.
        argv = ["subset", index_url, "--shards", "1:3", "--to", str(small), "-q", "--force"]
        assert main(argv) == 0
        assert "(2 copied)" in capsys.readouterr().out
    finally:
        server.stop()
    with pytest.raises(OSError):
        Source(index_url).info()  # really gone
    index = str(small / "train.json")
    assert sorted(os.listdir(small)) == [
        "synth-000001.tar",
        "synth-000002.tar",
        "train.json",
        "train.members",
    ]
    ds = ShardListDataset(index, offline=True, transformations=[])
    assert len(ds) == 2 * NSAMPLES and ds.name == "train"
    for i in range(len(ds)):
        assert strip_meta(ds[i]) == oracle[NSAMPLES + i], i
    batch = ds.__getitems__(list(range(0, len(ds), 3)))
    assert [strip_meta(s) for s in batch] == oracle[NSAMPLES : 3 * NSAMPLES : 3]
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    # The full dataset offline: what is not local is named.
    with pytest.raises(OfflineError, match="train.json"):
        len(ShardListDataset(index_url, offline=True))
    full = ShardListDataset(
        [{"url": u, "nsamples": NSAMPLES} for u in urls], offline=True, cache_dir=tmp_path / "c"
    )
    with pytest.raises(OfflineError, match="synth-000000.tar"):
        full[0]


def test_subset_by_samples_and_local_names(tmp_path, capsys):
    src = tmp_path / "src"
    a = write_dataset(str(src / "a"), shards=2, samples_per_shard=10, real_images=False)
    b = write_dataset(str(src / "b"), shards=2, samples_per_shard=10, real_images=False, seed=1)
    index = str(tmp_path / "mixed.json")
    build_index([*a, *b], index)
    out = tmp_path / "out"
    assert main(["subset", index, "--samples", "25", "--to", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "3 shards, 30 samples" in text
    tars = sorted(n for n in os.listdir(out) if n.endswith(".tar"))
    assert len(tars) == 3 and len(set(tars)) == 3  # same basenames from a/ and b/ kept apart
    ds = ShardListDataset(str(out / "mixed.json"), transformations=[])
    assert [strip_meta(ds[i]) for i in range(30)] == dataset_samples([*a, *b])[:30]
    doc = json.loads((out / "mixed.json").read_text())
    assert all("/" not in s["url"] for s in doc["shardlist"])  # relative: the dir can move


def test_clashing_copies_are_named_by_the_one_url_name():
    from wids.storage import url_name
    from wids.subset.destination import local_names

    urls = ["s3://a/x/train-0.tar", "s3://b/x/train-0.tar?X-Amz-Signature=S", "s3://a/x/t-1.tar"]
    assert local_names(urls) == [url_name(urls[0]), url_name(urls[1]), "t-1.tar"]


def test_select_shards():
    assert select_shards([10, 10, 10], shards=slice(1, None)) == [1, 2]
    assert select_shards([10, 10, 10], samples=1) == [0]
    assert select_shards([10, 10, 10], samples=11) == [0, 1]
    assert select_shards([10, 10, 10], samples=1000) == [0, 1, 2]
    for kw in ({}, {"shards": slice(0, 1), "samples": 3}, {"shards": slice(5, 6)}):
        with pytest.raises(ValueError):
            select_shards([10, 10, 10], **kw)


def test_bad_subset_arguments_are_one_line_errors(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main(["subset", "x.json", "--shards", "a:b", "--to", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["subset", "x.json", "--to", str(tmp_path)])
    monkeypatch.chdir(tmp_path)  # a relative --to lands here, never in the repository
    assert main(["subset", str(tmp_path / "nope.json"), "--samples", "3", "--to", "o"]) == 2
    assert "nope.json" in capsys.readouterr().err
    assert main(["subset", "nope.json", "--samples", "3", "--to", "s3://bucket/o"]) == 2
    assert os.listdir(tmp_path) == []  # a typo'd source leaves no (empty) directory behind


def test_cache_ls_du_clean(tmp_path, capsys):
    import fsspec

    fs = fsspec.filesystem("memory")
    cache_dir = str(tmp_path / "cache")
    cache = ShardCache(cache_dir)
    for i in range(3):
        fs.pipe_file(f"/wids-cli-cache/{i}/s.tar", bytes([i]) * (1000 * (i + 1)))
        cache.open(Source(f"memory://wids-cli-cache/{i}/s.tar")).close()
    assert main(["cache", "--cache-dir", cache_dir, "ls"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all("memory://wids-cli-cache/" in line for line in out)
    assert main(["cache", "--cache-dir", cache_dir, "ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(e["size"] for e in listed) == [1000, 2000, 3000]
    assert main(["cache", "--cache-dir", cache_dir, "du"]) == 0
    assert "6.0 KB in 3 shards" in capsys.readouterr().out
    assert main(["cache", "--cache-dir", cache_dir, "clean", "--older-than", "1d"]) == 0
    assert "removed 0 shards" in capsys.readouterr().out
    assert main(["cache", "--cache-dir", cache_dir, "clean", "--max-size", "4k"]) == 0
    assert cache.total_bytes() <= 4000
    assert main(["cache", "--cache-dir", cache_dir, "clean"]) == 0
    assert cache.total_bytes() == 0
    fs.rm("/wids-cli-cache", recursive=True)


def test_cache_dir_default_comes_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WIDS_CACHE_DIR", str(tmp_path / "envcache"))
    assert main(["cache", "du"]) == 0
    assert str(tmp_path / "envcache") in capsys.readouterr().out


def test_parse_size_and_duration():
    assert parse_size("1000") == 1000
    assert parse_size("1.5k") == 1500
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("10G") == 10**10
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("90s") == 90
    assert parse_duration("1.5h") == 5400
    for bad in ("", "ten", "5 parsecs"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)


@pytest.mark.servers
def test_remote_index_offline_from_the_cache_with_the_server_stopped(tmp_path):
    root = tmp_path / "www"
    paths = write_dataset(
        str(root / "d"), shards=3, samples_per_shard=NSAMPLES, real_images=False, jpg_bytes=800
    )
    oracle = dataset_samples(paths)
    cache_dir = tmp_path / "cache"
    server, base = _start_nginx(tmp_path, root)
    try:
        urls = [f"{base}/d/{os.path.basename(p)}" for p in paths]
        build_index(urls, str(root / "train.json"), name="train")
        index_url = f"{base}/train.json"
        online = ShardListDataset(
            index_url, access="shard", cache_dir=cache_dir, transformations=[]
        )
        for i in range(2 * NSAMPLES):  # shards 0 and 1 end up in the cache
            assert strip_meta(online[i]) == oracle[i]
        online.close()
    finally:
        server.stop()
    for access in ("auto", "shard"):
        ds = ShardListDataset(
            index_url, access=access, cache_dir=cache_dir, offline=True, transformations=[]
        )
        assert len(ds) == 3 * NSAMPLES and ds.name == "train"
        for i in range(2 * NSAMPLES):
            assert strip_meta(ds[i]) == oracle[i], i
        with pytest.raises(OfflineError, match="synth-000002.tar"):
            ds[2 * NSAMPLES]
    with pytest.raises(OfflineError, match="train.json"):
        len(ShardListDataset(index_url, cache_dir=tmp_path / "empty", offline=True))


# --------------------------------------------------------------- subset never harms user files


def _dataset(root, shards=3, n=NSAMPLES, index="train.json", md5=True):
    paths = write_dataset(str(root), shards=shards, samples_per_shard=n, real_images=False)
    build_index(paths, str(root / index), name="train", md5=md5)
    return paths, str(root / index)


def test_subset_refuses_the_source_directory_even_forced(tmp_path, capsys):
    src = tmp_path / "d"
    _, index = _dataset(src)
    before = _tree(src)
    for force in ([], ["--force"]):
        assert main(["subset", index, "--shards", "0:2", "--to", str(src), "-q", *force]) == 2
        err = capsys.readouterr().err
        assert "wids: error:" in err and err.count("\n") == 1
        assert _tree(src) == before  # train.json and train.members/* untouched
    with pytest.raises(OutputExistsError, match="source"):
        make_subset(index, src, shards=slice(0, 2), force=True)
    assert _tree(src) == before


def test_subset_from_sqlite_keeps_the_users_files_beside_it(tmp_path, capsys):
    src = tmp_path / "d"
    paths = write_dataset(str(src / "shards"), shards=3, samples_per_shard=NSAMPLES)
    build_index(paths, str(src / "train.sqlite"), name="train")
    (src / "train.json").write_text('{"mine": "a file the user wrote"}')
    before = _tree(src)
    assert main(["subset", str(src / "train.sqlite"), "--samples", "5", "--to", str(src)]) == 2
    assert "source index's own directory" in capsys.readouterr().err
    assert _tree(src) == before
    out = tmp_path / "o"
    (out).mkdir()
    (out / "train.sqlite").write_text("mine")  # the subset of a SQLite index is SQLite
    with pytest.raises(OutputExistsError, match="train.sqlite"):
        make_subset(str(src / "train.sqlite"), out, samples=5)
    assert _tree(out) == {"train.sqlite": hashlib.sha256(b"mine").hexdigest()}
    report = make_subset(str(src / "train.sqlite"), tmp_path / "fresh", samples=5)
    ds = ShardListDataset(report.index, transformations=[])
    assert [strip_meta(ds[i]) for i in range(len(ds))] == dataset_samples(paths)[:NSAMPLES]


def test_subset_into_a_user_directory_replaces_only_with_force(tmp_path):
    paths, index = _dataset(tmp_path / "src")
    oracle = dataset_samples(paths)
    user = tmp_path / "user"
    (user / "train.members").mkdir(parents=True)
    (user / "other.members").mkdir()
    (user / "synth-000001.tar").write_bytes(b"my own tar")
    # Named like a sidecar: the index writer's stale-sidecar sweep used to delete these.
    unrelated = {
        "train.members/0123456789abcdef-notes.json": b'{"my": "notes"}',
        "other.members/0123456789abcdef-x.json": b"{}",
        "notes.txt": b"keep me",
    }
    for name, data in unrelated.items():
        (user / name).write_bytes(data)
    before = _tree(user)
    with pytest.raises(OutputExistsError, match="synth-000001.tar"):
        make_subset(index, user, shards=slice(0, 2))
    assert _tree(user) == before  # nothing written, nothing removed
    report = make_subset(index, user, shards=slice(0, 2), force=True)
    assert report.copied == 2
    for name, data in unrelated.items():
        assert (user / name).read_bytes() == data, name
    assert (user / "synth-000001.tar").read_bytes() == open(paths[1], "rb").read()
    ds = ShardListDataset(report.index, transformations=[])
    assert [strip_meta(ds[i]) for i in range(len(ds))] == oracle[: 2 * NSAMPLES]


def test_a_stale_same_size_shard_is_refused_or_replaced_never_served(tmp_path):
    paths, index = _dataset(tmp_path / "src")
    oracle = dataset_samples(paths)
    out = tmp_path / "o"
    make_subset(index, out, shards=slice(0, 2))
    stale = out / "synth-000001.tar"
    data = bytearray(stale.read_bytes())
    data[-2048] ^= 0xFF  # same size, different bytes: a copy from an older version of the shard
    data[1100:1110] = b"X" * 10
    stale.write_bytes(bytes(data))
    before = _tree(out)
    with pytest.raises(OutputExistsError, match="synth-000001.tar"):
        make_subset(index, out, shards=slice(0, 2))
    assert _tree(out) == before
    make_subset(index, out, shards=slice(0, 2), force=True)
    assert stale.read_bytes() == open(paths[1], "rb").read()
    ds = ShardListDataset(str(out / "train.json"), transformations=[])
    assert [strip_meta(ds[i]) for i in range(len(ds))] == oracle[: 2 * NSAMPLES]


@pytest.mark.parametrize("md5", [True, False])
def test_a_copy_that_is_not_the_indexed_shard_is_not_published(tmp_path, md5):
    paths, index = _dataset(tmp_path / "src", md5=md5)
    # The source shard was rewritten after indexing at the same size: its first member is
    # now named differently (a valid tar still, checksum and all).
    st = os.stat(paths[1])
    with open(paths[1], "r+b") as f:
        h = bytearray(f.read(512))
        assert h[:6] == b"000001"
        h[:6] = b"999999"
        h[148:156] = b" " * 8
        h[148:156] = b"%06o\0 " % sum(h)
        f.seek(0)
        f.write(h)
    out = tmp_path / "o"
    # its fingerprint (a new modification time; another md5 if recorded) tells
    changed = "contents changed" if md5 else "modified at"
    with pytest.raises(IndexMismatchError, match=rf"synth-000001.tar.*{changed}"):
        make_subset(index, out, shards=slice(0, 3))
    assert not out.exists()
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns))  # and with its mtime restored,
    changed = "contents changed" if md5 else "member"  # the md5, or else the header
    with pytest.raises(IndexMismatchError, match=rf"synth-000001.tar.*{changed}"):
        make_subset(index, out, shards=slice(0, 3))
    assert not out.exists()  # everything this call created is gone again
    (out / "train.members").mkdir(parents=True)
    (out / "mine.txt").write_text("x")
    with pytest.raises(IndexMismatchError):
        make_subset(index, out, shards=slice(0, 3), jobs=1)
    assert _tree(out) == {"train.members/": "dir", "mine.txt": hashlib.sha256(b"x").hexdigest()}


def test_a_typo_leaves_no_directory(tmp_path, capsys):
    _, index = _dataset(tmp_path / "src")
    new = tmp_path / "new" / "deeper"
    assert main(["subset", index + "x", "--samples", "3", "--to", str(new)]) == 2
    assert main(["subset", index, "--shards", "7:9", "--to", str(new)]) == 2
    assert "selection names no shards" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.mark.servers
def test_snapshot_stores_no_secrets_and_works_offline(tmp_path):
    root = tmp_path / "www"
    paths = write_dataset(
        str(root / "d"), shards=2, samples_per_shard=NSAMPLES, real_images=False, jpg_bytes=500
    )
    oracle = dataset_samples(paths)
    secrets = [b"hunter2pw", b"SIGxyz123secret", b"TOKENabc987", b"CREDqq42"]
    cache_dir = tmp_path / "cache"
    server, base = _start_nginx(tmp_path, root)
    host = base.split("://", 1)[1]
    signed = "?X-Amz-Signature=SIGxyz123secret&X-Amz-Credential=CREDqq42&v=1"
    try:
        urls = [f"http://alice:hunter2pw@{host}/d/{os.path.basename(p)}{signed}" for p in paths]
        build_index(urls, str(root / "train.json"), name="train")
        index_url = f"http://alice:hunter2pw@{host}/train.json?X-Amz-Security-Token=TOKENabc987"
        online = ShardListDataset(
            index_url, access="shard", cache_dir=cache_dir, transformations=[]
        )
        assert [strip_meta(online[i]) for i in range(len(online))] == oracle
        online.close()
    finally:
        server.stop()
    found = []
    for d, _, files in os.walk(cache_dir):
        for n in files:
            data = open(os.path.join(d, n), "rb").read()
            found += [(n, s) for s in secrets if s in data or s.decode() in n]
    assert found == []
    assert os.listdir(cache_dir / "indexes")  # there is a snapshot, and it is clean
    # Offline, with the same URL or a re-signed one (a new password, a new token): found.
    for url in (index_url, f"http://alice:newpw@{host}/train.json?X-Amz-Security-Token=NEWTOKEN"):
        ds = ShardListDataset(url, cache_dir=cache_dir, offline=True, transformations=[])
        assert [strip_meta(ds[i]) for i in range(len(ds))] == oracle
        ds.close()


# -- a killed subset, long names (issue 21, smaller items) ------------------------------------


def test_a_sigkilled_subset_leaves_no_staging_directory_after_a_rerun(
    tmp_path, http_server, fault_proxy
):
    import signal
    import subprocess
    import sys
    import time

    from faultproxy import FaultPlan

    root = http_server.root / f"kill-{os.getpid()}-{time.monotonic_ns()}"
    write_dataset(str(root), shards=3, samples_per_shard=4, real_images=False, jpg_bytes=100)
    build_index(sorted(str(p) for p in root.glob("*.tar")), str(root / "i.sqlite"))
    rel = root.relative_to(http_server.root)
    stall = FaultPlan({"stall": 1}, rate=1.0, only=".tar", stall=60)
    proxy = fault_proxy(http_server.base, stall)  # shard reads hang: the subset is mid-copy
    out = tmp_path / "sub"
    argv = [sys.executable, "-m", "wids", "subset", proxy.url(f"{rel}/i.sqlite"), "--shards", "0:3"]
    argv += ["--to", str(out), "-q"]
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob(".wids-subset-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(out.glob(".wids-subset-*")), "the subset never started copying"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    report = make_subset(f"{http_server.base}/{rel}/i.sqlite", out, shards=slice(0, 3))
    assert report.shards == 3 and len(ShardListDataset(report.index)) == 12
    assert not list(out.glob(".wids-subset-*")), sorted(p.name for p in out.iterdir())


def test_a_live_runs_staging_directory_is_left_alone(tmp_path):
    from wids.subset.destination import Run, remove_stale_staging

    live = Run(force=False)
    path = live.staging(str(tmp_path))
    assert remove_stale_staging(str(tmp_path), min_age=0) == [] and os.path.isdir(path)
    other = Run(force=False).staging(str(tmp_path))  # a second run staging beside it
    assert os.path.isdir(path) and os.path.isdir(other)
    live.finish()
    assert not os.path.exists(path)


def test_a_300_character_s3_basename_is_copied_under_a_short_name(tmp_path, s3_server):
    import fsspec

    from wids.storage import url_name

    prefix = f"long-{os.getpid()}-{tmp_path.name[-12:]}"
    local = tmp_path / "src"
    shards = write_dataset(str(local), shards=2, samples_per_shard=3, real_images=False)
    fs = fsspec.filesystem("s3", **s3_server.storage_options)
    urls = []
    for i, path in enumerate(shards):
        url = s3_server.url(f"{prefix}/{'x' * 292}-{i:03d}.tar")  # a 300-character basename
        fs.put_file(path, url)
        urls.append(url)
    index = s3_server.url(f"{prefix}/long.json")
    build_index(urls, index, storage_options=s3_server.storage_options)
    so = s3_server.storage_options
    report = make_subset(index, tmp_path / "sub", shards=slice(0, 2), storage_options=so)
    names = sorted(p.name for p in (tmp_path / "sub").glob("*.tar"))
    assert names == sorted(url_name(u) for u in urls) and all(len(n) < 120 for n in names)
    assert len(ShardListDataset(report.index)) == 6


@pytest.mark.parametrize("suffix", [".widx", ".sqlite"])
def test_a_subset_keeps_the_index_format(tmp_path, capsys, suffix):
    shards = write_dataset(str(tmp_path / "src"), shards=3, samples_per_shard=5, real_images=False)
    index = str(tmp_path / f"train{suffix}")
    build_index(shards, index)
    out = tmp_path / "out"
    assert main(["subset", index, "--shards", "1:", "--to", str(out), "-q"]) == 0
    assert sorted(n for n in os.listdir(out) if not n.endswith(".tar")) == [f"train{suffix}"]
    assert f"train{suffix}: 2 shards, 10 samples" in capsys.readouterr().out
    ds = ShardListDataset(str(out / f"train{suffix}"), transformations=[])
    assert [strip_meta(ds[i]) for i in range(10)] == dataset_samples(shards)[5:]
