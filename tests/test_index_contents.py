"""A copied dataset (new timestamps, same bytes) reads without a rebuild; a rewrite is caught.

``wids.index.contents``: the recorded md5 is compared once with the bytes of a local shard whose
modification time differs, and what was read is remembered in a directory wids owns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from tarfixtures import make_samples, write_shard

from wids import ShardListDataset, ShardWriter, build_index
from wids.errors import IndexMismatchError
from wids.index import ContentMemo, file_md5, verify_index

N = 3
PER = 8


def _dataset(root: Path, suffix: str = ".json", md5: bool = True) -> tuple[list[Path], Path]:
    root.mkdir(parents=True)
    paths = [root / f"train-{k:04d}.tar" for k in range(N)]
    for k, p in enumerate(paths):
        write_shard(p, make_samples(PER, fields=(".txt", ".cls"), prefix=f"s{k}-"))
    out = root / f"train{suffix}"
    build_index([str(p) for p in paths], str(out), md5=md5)
    time.sleep(0.02)  # a copy made now gets other modification times
    return paths, out


def _copy(src: Path, dst: Path, how: str) -> None:
    if how == "copytree":  # copies bytes only: no copystat, new timestamps
        shutil.copytree(src, dst, copy_function=shutil.copyfile)
    else:
        subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    for a in src.glob("*.tar"):
        assert os.stat(a).st_mtime_ns != os.stat(dst / a.name).st_mtime_ns


def _read_all(index: Path, **kwargs) -> list:
    ds = ShardListDataset(str(index), transformations=[], **kwargs)
    try:
        return [ds[i][".txt"] for i in range(len(ds))]
    finally:
        ds.close()


def test_index_create_records_each_shards_md5_and_can_skip_it(tmp_path):
    paths, out = _dataset(tmp_path / "a")
    entries = json.loads(out.read_text())["shardlist"]
    assert [e["md5sum"] for e in entries] == [
        hashlib.md5(p.read_bytes()).hexdigest() for p in paths
    ]
    _, bare = _dataset(tmp_path / "b", md5=False)
    assert all("md5sum" not in e for e in json.loads(bare.read_text())["shardlist"])
    # the CLI's switch
    from wids.cli import main

    assert main(["index", "create", *map(str, paths), "-o", str(tmp_path / "c.json")]) == 0
    assert all("md5sum" in e for e in json.loads((tmp_path / "c.json").read_text())["shardlist"])
    args = ["index", "create", *map(str, paths), "-o", str(tmp_path / "d.json"), "--no-md5"]
    assert main(args) == 0
    assert all(
        "md5sum" not in e for e in json.loads((tmp_path / "d.json").read_text())["shardlist"]
    )


@pytest.mark.parametrize("how", ["copytree", "cp -r"])
@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_a_copied_dataset_reads_every_sample(tmp_path, how, suffix, caplog):
    _, out = _dataset(tmp_path / "a", suffix)
    expected = _read_all(out)
    _copy(tmp_path / "a", tmp_path / "b", how)
    before = sorted(os.listdir(tmp_path / "b"))
    with caplog.at_level(logging.INFO, logger="wids.index.contents"):
        assert _read_all(tmp_path / "b" / out.name) == expected
    assert sum("to compare its md5" in r.getMessage() for r in caplog.records) == N
    if suffix == ".json":  # remembered in the index's members directory (wids made it)
        digests = sorted((tmp_path / "b" / "train.members").glob("*.md5.json"))
        assert len(digests) == N
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="wids.index.contents"):
            assert _read_all(tmp_path / "b" / out.name) == expected  # a new process's view
        assert not any("to compare its md5" in r.getMessage() for r in caplog.records)
    else:  # a single-file index: nothing is written beside it, the memo is this process's
        assert sorted(os.listdir(tmp_path / "b")) == before


def test_remembered_in_cache_dir_when_the_dataset_has_one(tmp_path):
    _, out = _dataset(tmp_path / "a", ".sqlite")
    _copy(tmp_path / "a", tmp_path / "b", "cp -r")
    cache = tmp_path / "cache"
    assert len(_read_all(tmp_path / "b" / out.name, cache_dir=str(cache))) == N * PER
    records = [json.loads(p.read_text()) for p in (cache / "digests").glob("*.md5.json")]
    assert len(records) == N and all(r["format"] == "wids-content-digest" for r in records)
    assert {r["md5"] for r in records} == {file_md5(str(p)) for p in (tmp_path / "b").glob("*.tar")}


def test_a_same_size_rewrite_of_a_copy_is_caught_and_named(tmp_path):
    paths, out = _dataset(tmp_path / "a")
    _copy(tmp_path / "a", tmp_path / "b", "cp -r")
    assert len(_read_all(tmp_path / "b" / out.name)) == N * PER  # verified, remembered
    victim = tmp_path / "b" / paths[1].name
    data = bytearray(victim.read_bytes())
    data[515] ^= 0xFF  # the first member's data: same size, same layout, other bytes
    victim.write_bytes(bytes(data))
    ds = ShardListDataset(str(tmp_path / "b" / out.name), transformations=[])
    with pytest.raises(IndexMismatchError) as e:
        for i in range(len(ds)):
            ds[i]
    msg = str(e.value)
    assert e.value.shard == str(victim)
    assert "its contents changed (same size, other bytes)" in msg
    assert "wids index create" in msg  # what to run


def test_a_copy_of_an_index_without_md5_says_why_and_what_to_run(tmp_path):
    _, out = _dataset(tmp_path / "a", md5=False)
    _copy(tmp_path / "a", tmp_path / "b", "copytree")
    ds = ShardListDataset(str(tmp_path / "b" / out.name), transformations=[])
    with pytest.raises(IndexMismatchError) as e:
        ds[0]
    msg = str(e.value)
    assert "records no md5" in msg and "cp -r" in msg and "wids index create" in msg


def test_verify_reports_copies_as_ok_and_rewrites_as_changed(tmp_path, capsys):
    from wids.cli import main

    paths, out = _dataset(tmp_path / "a")
    _copy(tmp_path / "a", tmp_path / "b", "copytree")
    copy = tmp_path / "b" / out.name
    for deep in ([], ["--deep"]):
        assert main(["index", "verify", str(copy), *deep]) == 0
        text = capsys.readouterr().out
        assert text.count("OK (copy) ") == N and f"{N} of {N} shards match" in text
    victim = tmp_path / "b" / paths[2].name
    data = bytearray(victim.read_bytes())
    data[515] ^= 0xFF  # the first member's data: same size, same layout, other bytes
    victim.write_bytes(bytes(data))
    for deep in ([], ["--deep"]):
        assert main(["index", "verify", str(copy), *deep]) == 1
        text = capsys.readouterr().out
        assert f"CHANGED {victim}: its contents changed" in text
        assert text.count("OK (copy) ") == N - 1
    notes: list = []
    total, problems = verify_index(str(copy), notes=notes)
    assert total == N and [p.url for p in problems] == [str(victim)]
    assert [n.kind for n in notes] == ["COPY"] * (N - 1)


def test_shardwriter_records_md5_so_its_copies_read(tmp_path):
    root = tmp_path / "a"
    root.mkdir()
    with ShardWriter(str(root / "w-%04d.tar"), maxcount=5) as w:
        for i in range(12):
            w.write({"__key__": f"{i:04d}", "txt": f"t{i}"})
    entries = json.loads((root / "w.json").read_text())["shardlist"]
    assert [e["md5sum"] for e in entries] == [file_md5(str(root / e["url"])) for e in entries]
    _copy(root, tmp_path / "b", "cp -r")
    ds = ShardListDataset(str(tmp_path / "b" / "w.json"))
    assert [ds[i][".txt"] for i in range(12)] == [f"t{i}" for i in range(12)]
    with ShardWriter(str(root / "x-%04d.tar"), maxcount=5, md5=False) as w:  # skipped
        w.write({"__key__": "0000", "txt": "t"})
    assert "md5sum" not in json.loads((root / "x.json").read_text())["shardlist"][0]


def test_memo_remembers_a_version_not_a_name(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"one")
    memo = ContentMemo(str(tmp_path))
    assert memo.md5(str(p)) == hashlib.md5(b"one").hexdigest()
    p.write_bytes(b"two")  # same size, a new version: read again, not served from memory
    assert memo.md5(str(p)) == hashlib.md5(b"two").hexdigest()
    # a record another process left for this version is used; for another version, not
    fresh = ContentMemo(str(tmp_path))
    assert fresh.md5(str(p)) == hashlib.md5(b"two").hexdigest()
    (rec,) = tmp_path.glob("*.md5.json")
    data = json.loads(rec.read_text())
    data["md5"] = "0" * 32
    rec.write_text(json.dumps(data))
    assert ContentMemo(str(tmp_path)).md5(str(p)) == "0" * 32  # trusted: wids' own directory
    os.utime(p, ns=(0, 10**9))
    assert ContentMemo(str(tmp_path)).md5(str(p)) == hashlib.md5(b"two").hexdigest()


def test_a_memo_that_cannot_be_written_warns_once_and_keeps_the_verdict_in_memory(tmp_path, caplog):
    files = [tmp_path / f"f{k}" for k in range(2)]
    for k, p in enumerate(files):
        p.write_bytes(b"x%d" % k)
    (tmp_path / "plain").write_bytes(b"")
    memo = ContentMemo(str(tmp_path / "plain" / "dir"))  # where nothing can be written
    with caplog.at_level(logging.WARNING, logger="wids.index.contents"):
        got = [memo.md5(str(p)) for p in files + files]
    assert got == [hashlib.md5(p.read_bytes()).hexdigest() for p in files + files]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cache_dir" in warnings[0].getMessage()


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_dataloader_workers_read_a_copied_dataset(tmp_path, ctx):
    torch = pytest.importorskip("torch")
    _, out = _dataset(tmp_path / "a")
    expected = _read_all(out)
    _copy(tmp_path / "a", tmp_path / "b", "cp -r")
    ds = ShardListDataset(str(tmp_path / "b" / out.name), transformations=[])
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=2, multiprocessing_context=ctx, collate_fn=_texts
    )
    assert [t for batch in loader for t in batch] == expected
    assert len(list((tmp_path / "b" / "train.members").glob("*.md5.json"))) == N


def _texts(batch: list) -> list:
    return [s[".txt"] for s in batch]


def test_verify_on_an_executor_reports_copies_and_leaves_nothing_beside_the_index(tmp_path):
    import concurrent.futures as cf

    _, out = _dataset(tmp_path / "a")
    _copy(tmp_path / "a", tmp_path / "b", "cp -r")
    copy = tmp_path / "b" / out.name
    notes: list = []
    with cf.ProcessPoolExecutor(2) as pool:
        assert verify_index(str(copy), executor=pool, deep=True, notes=notes) == (N, [])
    assert [n.kind for n in notes] == ["COPY"] * N
    assert [n.url for n in notes] == [str(tmp_path / "b" / f"train-{k:04d}.tar") for k in range(N)]
    assert not list((tmp_path / "b" / "train.members").glob("*.md5.json"))


def test_digests_go_only_into_a_members_dir_the_index_names(tmp_path):
    """A user's train.members/ beside a reference-format train.json is not wids's to fill."""
    _, out = _dataset(tmp_path / "a")
    desc = json.loads(out.read_text())
    del desc["wids_index"]  # not made by wids: no members_dir of its own
    desc["shardlist"] = [
        {k: e[k] for k in ("url", "nsamples", "filesize", "md5sum", "mtime")}
        for e in desc["shardlist"]
    ]
    shutil.rmtree(tmp_path / "a" / "train.members")
    out.write_text(json.dumps(desc))
    _copy(tmp_path / "a", tmp_path / "b", "cp -r")
    users = tmp_path / "b" / "train.members"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    assert len(_read_all(tmp_path / "b" / out.name)) == N * PER
    verify_index(str(tmp_path / "b" / out.name))
    assert sorted(os.listdir(users)) == ["notes.txt"]
