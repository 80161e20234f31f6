"""Wildcards in shard lists (wids.storage.globs): local, S3 (moto), HTTP listings, the CLI.

Every place that takes a list of shards expands them: ``build_index`` / ``wids index create``,
``ShardListDataset`` (and so ``wids show``) given a shard pattern, ``@listfile`` lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from serverfixtures import python_http_server
from tarfixtures import make_samples, write_shard

from wids import ShardListDataset, ShardNotFoundError, build_index
from wids.storage import Store, expand_glob, has_glob, natural_key

NAMES = ["part-1.tar", "part-2.tar", "part-10.tar", "part-9.tar"]
NATURAL = ["part-1.tar", "part-2.tar", "part-9.tar", "part-10.tar"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("globs")
    for i, name in enumerate(NAMES):
        write_shard(d / name, make_samples(2, start=10 * i, fields=(".cls",)))
    (d / "notes.txt").write_text("not a shard")
    (d / "sub").mkdir()
    write_shard(d / "sub" / "deep-1.tar", make_samples(1, start=99, fields=(".cls",)))
    (d / "folder.tar").mkdir()  # a folder matching *.tar is no shard
    return d


def test_natural_order_and_what_counts_as_a_wildcard():
    names = ["a-10", "a-2", "a-1", "b", "a-02", "a"]
    assert sorted(names, key=natural_key) == ["a", "a-1", "a-02", "a-2", "a-10", "b"]
    assert has_glob("data/*.tar") and has_glob("s3://b/x-?.tar") and has_glob("gs://b/x[12].tar")
    assert has_glob("https://host/data/*.tar") and not has_glob("https://host/x.tar?sig=a*b")
    assert not has_glob("https://host/shard.tar?versionId=3") and not has_glob("plain.tar")
    assert not has_glob("simplecache::s3://b/*.tar")


def test_natural_key_takes_digit_runs_of_any_length():
    """A hostile listing's name with 5000 digits: int() refuses over 4300 (ValueError)."""
    huge = "9" * 5000
    names = [f"s-{huge}.tar", "s-10.tar", f"s-1{huge}.tar", "s-2.tar", "s-0002.tar"]
    assert sorted(names, key=natural_key) == [
        "s-0002.tar",
        "s-2.tar",
        "s-10.tar",
        f"s-{huge}.tar",
        f"s-1{huge}.tar",
    ]


def test_local_patterns_in_natural_order(folder, monkeypatch):
    got = expand_glob(str(folder / "part-*.tar"))
    assert got == [str(folder / n) for n in NATURAL]
    assert expand_glob(f"file://{folder}/part-?.tar") == [
        f"file://{folder}/{n}" for n in NATURAL if len(n) == 10
    ]
    assert expand_glob(str(folder / "*.tar")) == got  # the folder named folder.tar is left out
    assert expand_glob(str(folder / "**" / "*.tar"))[-1] == str(folder / "sub" / "deep-1.tar")
    monkeypatch.chdir(folder)
    assert expand_glob("part-[12].tar") == ["part-1.tar", "part-2.tar"]  # relative stays relative
    assert expand_glob("notes.txt") == ["notes.txt"]  # no wildcard: as given, unchecked


def test_a_file_whose_name_looks_like_a_pattern_is_that_file(tmp_path):
    odd = write_shard(tmp_path / "odd[1].tar", make_samples(1, fields=(".cls",)))
    write_shard(tmp_path / "odd1.tar", make_samples(1, fields=(".cls",)))
    assert expand_glob(str(odd)) == [str(odd)]


def test_nothing_matching_is_a_shard_not_found_error(folder):
    with pytest.raises(ShardNotFoundError, match="no file matches") as e:
        expand_glob(str(folder / "nothing-*.tar"))
    assert isinstance(e.value, FileNotFoundError) and e.value.shard.endswith("nothing-*.tar")


@pytest.mark.skipif(os.sep != "/", reason="a backslash is a separator there")
def test_a_windows_style_pattern_that_matches_nothing_says_so(folder, monkeypatch):
    monkeypatch.chdir(folder.parent)
    for pattern in (f"{folder.name}\\part-*.tar", "C:/data/part-*.tar"):
        with pytest.raises(ShardNotFoundError, match="Windows-style path"):
            expand_glob(pattern)
    with pytest.raises(ShardNotFoundError, match="matches this pattern$"):
        expand_glob(f"{folder.name}/nothing-*.tar")


def test_build_index_and_dataset_take_local_globs(folder, tmp_path):
    out = tmp_path / "g.json"
    report = build_index([str(folder / "part-*.tar")], str(out), progress=False)
    assert report.shards == 4
    urls = [s["url"] for s in json.loads(out.read_text())["shardlist"]]
    assert [os.path.basename(u) for u in urls] == NATURAL
    ds = ShardListDataset(str(folder / "part-*.tar"))
    assert [s["__key__"] for s in ds] == ["000000", "000001", "000010", "000011",
                                          "000030", "000031", "000020", "000021"]  # fmt: skip


def test_listfile_lines_may_be_globs(folder, tmp_path):
    listfile = tmp_path / "shards.txt"
    listfile.write_text(f"# shards\n{folder}/part-1?.tar\n{folder}/part-[29].tar\n")
    out = tmp_path / "l.json"
    build_index([f"@{listfile}"], str(out), progress=False)
    urls = [s["url"] for s in json.loads(out.read_text())["shardlist"]]
    assert [os.path.basename(u) for u in urls] == ["part-10.tar", "part-2.tar", "part-9.tar"]


def _wids(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wids", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_cli_index_create_and_show_take_quoted_globs(folder, tmp_path):
    r = _wids("index", "create", "part-*.tar", "-o", str(tmp_path / "c.json"), "-q", cwd=folder)
    assert r.returncode == 0 and "4 shards, 8 samples" in r.stdout, r.stderr
    urls = [s["url"] for s in json.loads((tmp_path / "c.json").read_text())["shardlist"]]
    assert [os.path.basename(u) for u in urls] == NATURAL
    r = _wids("show", "part-*.tar", "-n", "8", cwd=folder)
    assert r.returncode == 0, r.stderr
    keys = [line.split()[1] for line in r.stdout.splitlines()[1:]]
    assert keys == ["000000", "000001", "000010", "000011", "000030", "000031", "000020", "000021"]
    r = _wids("index", "create", "none-*.tar", "-o", str(tmp_path / "n.json"), cwd=folder)
    assert r.returncode == 2 and "none-*.tar: no file matches this pattern" in r.stderr


def test_s3_patterns_list_the_bucket_with_the_storage_options(s3_server, folder, tmp_path):
    for name in [*NAMES, "sub/deep-1.tar"]:
        s3_server.put(folder / name, f"globs/{name}")
    s3_server.put_bytes(b"x", "globs/notes.txt")
    opts = s3_server.storage_options
    got = expand_glob(s3_server.url("globs/part-*.tar"), Store(opts))
    assert got == [s3_server.url(f"globs/{n}") for n in NATURAL]
    with pytest.raises(ShardNotFoundError, match="no file matches"):
        expand_glob(s3_server.url("globs/none-*.tar"), Store(opts))
    out = tmp_path / "s3.json"
    report = build_index(s3_server.url("globs/part-*.tar"), str(out), storage_options=opts)
    assert report.shards == 4 and report.samples == 8
    ds = ShardListDataset(s3_server.url("globs/part-[12].tar"), storage_options=opts)
    assert [s["__key__"] for s in ds] == ["000000", "000001", "000010", "000011"]


def test_s3_pattern_on_the_command_line(s3_server, folder, tmp_path):
    for name in NAMES:
        s3_server.put(folder / name, f"cli-globs/{name}")
    flags = [f"--storage-option={k}={json.dumps(v)}" for k, v in s3_server.storage_options.items()]
    out = tmp_path / "cli.json"
    r = _wids("index", "create", s3_server.url("cli-globs/*.tar"), "-o", str(out), "-q", *flags,
              cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    urls = [s["url"] for s in json.loads(out.read_text())["shardlist"]]
    assert urls == [s3_server.url(f"cli-globs/{n}") for n in NATURAL]


@pytest.fixture
def listing_server(folder):
    """``python -m http.server`` over the folder: it answers a folder with a directory page."""
    with python_http_server(folder) as base:
        yield base


def test_http_patterns_read_the_servers_directory_page(listing_server):
    got = expand_glob(f"{listing_server}/part-*.tar")
    assert got == [f"{listing_server}/{n}" for n in NATURAL]
    with pytest.raises(ShardNotFoundError, match="no file matches"):
        expand_glob(f"{listing_server}/none-*.tar")


def test_gcs_patterns_list_the_bucket(gcs_server, folder):
    for name in NAMES:
        gcs_server.put(folder / name, f"gcs-globs/{name}")
    got = expand_glob(gcs_server.url("gcs-globs/part-*.tar"), Store(gcs_server.storage_options))
    assert got == [gcs_server.url(f"gcs-globs/{n}") for n in NATURAL]
