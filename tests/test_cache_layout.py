"""The cache directory's mark and layout: wids deletes and writes only what it created.

Each scenario of issue 10 item 1 (a user's ``data/`` folder, a ``data`` link to a user's
folder, a user's ``*.tmp`` files) is built for real here and shown to leave the user's files
alone; the dataset scenario (``access="shard"`` eviction) is in ``test_cache_dataset.py``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import time

import pytest

from wids.cache import ShardCache
from wids.cache.layout import MARKER, cache_state, cache_subdir, open_cache_dir
from wids.cli import main
from wids.errors import CacheDirError, CacheError
from wids.storage import FileStat, Source, url_name

SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
HOUR_AGO = time.time() - 3600


def writer(data: bytes):
    """A download callable writing ``data``."""

    def run(dest: str) -> FileStat:
        with open(dest, "wb") as f:
            f.write(data)
        return FileStat(len(data), None, None)

    return run


def fill(cache: ShardCache, n: int, size: int = 1000, prefix: str = "s3://b/") -> list[str]:
    urls = [f"{prefix}{i}.tar" for i in range(n)]
    for i, u in enumerate(urls):
        cache.open_with(u, writer(bytes([i]) * size), size=size).close()
    return urls


def user_folder(path, files: dict[str, bytes]) -> dict[str, bytes]:
    os.makedirs(path, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    return files


def contents(path) -> dict[str, bytes]:
    out = {}
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


def aged(*paths) -> None:
    for p in paths:
        os.utime(p, (HOUR_AGO, HOUR_AGO))


# -- marking ------------------------------------------------------------------------------------


def test_a_new_directory_is_marked_with_a_layout_version(tmp_path):
    d = tmp_path / "new" / "cache"
    fill(ShardCache(d), 1)
    with open(d / MARKER) as f:
        assert json.load(f) == {"format": "wids-cache", "version": 1}
    assert (d / "CACHEDIR.TAG").read_text().startswith(SIGNATURE + "\n")
    assert "wids" in (d / "CACHEDIR.TAG").read_text()
    assert cache_state(d) == "marked"


def test_an_empty_directory_is_adopted(tmp_path):
    assert cache_state(tmp_path) == "empty"
    fill(ShardCache(tmp_path), 2)
    assert cache_state(tmp_path) == "marked" and len(ShardCache(tmp_path).entries()) == 2


def test_a_cache_of_an_older_wids_is_adopted(tmp_path):
    """A directory tagged by a wids from before the marker: same layout, marked on first use."""
    (tmp_path / "CACHEDIR.TAG").write_text(
        SIGNATURE + "\n# This file is a cache directory tag created by wids.\n"
    )
    (tmp_path / "data").mkdir()
    fill(ShardCache(tmp_path), 1)
    assert (tmp_path / MARKER).exists()


@pytest.mark.parametrize(
    "mark, why",
    [
        ('{"format": "wids-cache", "version": 2}', "layout version 2"),
        ('{"format": "something-else", "version": 1}', "not a wids cache mark"),
        ("{not json", "unreadable"),
    ],
)
def test_an_unknown_mark_is_refused(tmp_path, mark, why):
    (tmp_path / MARKER).write_text(mark)
    with pytest.raises(CacheDirError, match=why):
        ShardCache(tmp_path).open_with("s3://b/x.tar", writer(b"x"))
    assert sorted(os.listdir(tmp_path)) == [MARKER]


def test_another_tools_cachedir_tag_is_not_a_mark(tmp_path):
    (tmp_path / "CACHEDIR.TAG").write_text(SIGNATURE + "\n# created by another tool\n")
    with pytest.raises(CacheDirError, match="not a wids cache"):
        ShardCache(tmp_path).open_with("s3://b/x.tar", writer(b"x"))


def _create_concurrently(directory: str, barrier, n: int) -> None:
    barrier.wait()
    cache = ShardCache(directory)
    cache.open_with(f"s3://b/{n}.tar", writer(b"x" * 100), size=100).close()


def test_processes_creating_one_new_cache_at_once_all_succeed(tmp_path):
    """Each sees the others' half-written mark (a temporary file) as still empty, not foreign."""
    ctx = mp.get_context("fork")
    for attempt in range(3):
        d = str(tmp_path / f"c{attempt}")
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_create_concurrently, args=(d, barrier, n)) for n in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
        assert len(ShardCache(d).entries()) == 4


# -- item 1: a user's data/ folder --------------------------------------------------------------


def test_a_directory_with_a_users_data_folder_is_refused(tmp_path):
    d = tmp_path / "D"
    mine = user_folder(d / "data", {"a.tar": b"mine", "notes.txt": b"keep"})
    cache = ShardCache(d, max_bytes=1)
    with pytest.raises(CacheDirError) as err:
        cache.open_with("s3://b/x.tar", writer(b"x"))
    msg = str(err.value)
    assert "\n" not in msg and str(d) in msg
    assert "not a wids cache" in msg and "empty or new" in msg
    for call in (cache.clean, lambda: cache.evict_to(0), lambda: cache.remove("s3://b/a.tar")):
        with pytest.raises(CacheDirError):
            call()
    assert isinstance(err.value, CacheError)
    assert contents(d / "data") == mine
    assert sorted(os.listdir(d)) == ["data"]  # nothing marked, nothing created


def test_cli_clean_refuses_a_users_directory(tmp_path, capsys):
    d = tmp_path / "D"
    mine = user_folder(d / "data", {"a.tar": b"mine", "b.tar": b"also mine"})
    assert main(["cache", "--cache-dir", str(d), "clean"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a wids cache" in err
    assert contents(d / "data") == mine


def test_users_files_in_a_marked_caches_data_are_never_deleted_or_counted(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=2500)
    fill(cache, 2)
    mine = user_folder(tmp_path / "data", {"mine.tar": b"m" * 5000, "x": b"y"})
    aged(*(tmp_path / "data" / n for n in mine))
    assert cache.total_bytes() == 2000  # the budget limits the cache's own entries only
    fill(cache, 4, prefix="s3://c/")  # evicts to make room
    assert cache.total_bytes() <= 2500
    assert len(cache.evict_to(0)) == 2
    assert cache.clean() == [] and cache.clean(older_than=1) == []
    assert contents(tmp_path / "data") == mine


# -- item 1: symbolic links in the layout -------------------------------------------------------


def test_a_directory_holding_only_a_data_link_is_refused(tmp_path):
    mine = user_folder(tmp_path / "user", {"a.tar": b"mine"})
    d = tmp_path / "D"
    d.mkdir()
    os.symlink(tmp_path / "user", d / "data")
    with pytest.raises(CacheDirError):
        ShardCache(d, max_bytes=1).open_with("s3://b/x.tar", writer(b"x"))
    assert contents(tmp_path / "user") == mine


@pytest.mark.parametrize("sub", ["data", "meta", "locks", "tmp", "scans", "indexes"])
def test_a_linked_subdirectory_of_a_marked_cache_is_refused(tmp_path, sub):
    d = tmp_path / "D"
    urls = fill(ShardCache(d), 2)
    mine = user_folder(tmp_path / "user", {"a.tar": b"mine"})
    if (d / sub).exists():
        for name in os.listdir(d / sub):  # the user's folder holds copies of what was there
            os.rename(d / sub / name, tmp_path / "user" / name)
        os.rmdir(d / sub)
        mine = contents(tmp_path / "user")
    os.symlink(tmp_path / "user", d / sub)
    cache = ShardCache(d, max_bytes=1500)
    for call in (
        lambda: cache.open_with("s3://b/new.tar", writer(b"n" * 1000), size=1000),
        cache.clean,
        lambda: cache.evict_to(0),
        lambda: cache.remove(urls[0]),
        lambda: cache_subdir(d, "scans"),
    ):
        with pytest.raises(CacheDirError, match="symbolic link"):
            call()
    assert contents(tmp_path / "user") == mine


def test_a_link_swapped_in_after_the_check_is_not_followed(tmp_path, caplog):
    """An object that already checked its directory still deletes and publishes without links."""
    d = tmp_path / "D"
    cache = ShardCache(d, max_bytes=2500)
    urls = fill(cache, 2)
    os.rename(d / "data", tmp_path / "user")  # the user's folder now holds the entries' names
    mine = contents(tmp_path / "user")
    os.symlink(tmp_path / "user", d / "data")
    with pytest.raises(CacheDirError):
        cache.evict_to(0)
    with pytest.raises(CacheDirError):
        cache.remove(urls[0])
    with pytest.raises(CacheDirError):
        cache.open_with("s3://b/new.tar", writer(b"n" * 1000), size=1000)
    cache.max_bytes = 500
    with caplog.at_level(logging.WARNING, logger="wids.cache.budget"):
        cache._evict_quietly()  # the path a read takes: logged, not raised
    assert "symbolic link" in caplog.text
    assert contents(tmp_path / "user") == mine


# -- item 1: a user's *.tmp files ---------------------------------------------------------------


def test_clean_removes_only_temporary_files_of_wids_naming(tmp_path):
    cache = ShardCache(tmp_path)
    fill(cache, 1)
    key = url_name("s3://b/gone.tar")
    ours = [
        tmp_path / "tmp" / f".{key}.0123456789ab.tmp",  # a killed download
        tmp_path / "meta" / f".{key}.json.0123456789ab.tmp",  # a killed record write
        tmp_path / f".{MARKER}.0123456789ab.tmp",  # a killed marking
    ]
    theirs = [
        tmp_path / ".x.tmp",
        tmp_path / "work.tmp",
        tmp_path / "tmp" / ".notes.tmp",
        tmp_path / "tmp" / "draft.tmp",
        tmp_path / "meta" / ".y.tmp",
    ]
    for p in ours + theirs:
        p.write_bytes(b"junk")
    aged(*ours, *theirs)
    cache.clean()
    assert [p.exists() for p in ours] == [False] * 3
    assert [p.exists() for p in theirs] == [True] * 5


# -- the other writers of the directory ---------------------------------------------------------


def test_scan_cache_and_snapshots_use_the_same_checks(tmp_path, caplog):
    from wids import open_index
    from wids.cache import save_snapshot, scan_cached
    from wids.index import build_index
    from wids.synth import write_dataset

    (path,) = write_dataset(str(tmp_path / "src"), shards=1, samples_per_shard=3)
    foreign = tmp_path / "foreign"
    mine = user_folder(foreign / "scans", {"a.json": b"{}"})
    with pytest.raises(CacheDirError):
        scan_cached(Source(path), cache_dir=str(foreign))
    index = str(tmp_path / "i.json")
    build_index([path], index)
    with caplog.at_level(logging.WARNING):
        assert save_snapshot(open_index(index), index, foreign) is None  # logged, not raised
    assert "not a wids cache" in caplog.text
    assert sorted(os.listdir(foreign)) == ["scans"] and contents(foreign / "scans") == mine

    new = tmp_path / "new"
    assert len(scan_cached(Source(path), cache_dir=str(new))) == 3
    assert save_snapshot(open_index(index), index, new) is not None
    assert cache_state(new) == "marked"
    assert os.listdir(new / "scans") and os.listdir(new / "indexes")


@pytest.mark.servers
def test_every_writer_names_its_files_by_url_name_and_keeps_no_credentials(http_server, tmp_path):
    from wids import open_index
    from wids.cache import save_snapshot, scan_cached, snapshot_path
    from wids.index import build_index
    from wids.synth import write_dataset

    (path,) = write_dataset(str(tmp_path / "src"), shards=1, samples_per_shard=3, prefix="names")
    url = http_server.put(path, "names/names-000000.tar")
    index_url = http_server.put(_index(tmp_path, build_index, url), "names/names.json")
    signed = url + "?X-Amz-Signature=SECRET"  # nginx ignores the query; wids must not keep it
    cache_dir = tmp_path / "cache"
    cache = ShardCache(cache_dir)
    cache.open(Source(signed)).close()
    scan_cached(Source(signed), cache_dir=str(cache_dir))
    signed_index = index_url + "?X-Goog-Signature=SECRET"  # a known signature: not identity
    assert save_snapshot(open_index(index_url), signed_index, cache_dir)
    assert os.listdir(cache_dir / "data") == [url_name(url)]
    scans = [n for n in os.listdir(cache_dir / "scans") if not n.endswith(".lock")]
    assert scans == [url_name(url, ".json")]  # was sha1[:16]-name
    assert os.listdir(cache_dir / "indexes") == [url_name(index_url, ".json")]
    assert snapshot_path(cache_dir, index_url) == str(
        cache_dir / "indexes" / url_name(index_url, ".json")
    )
    for root, _, files in os.walk(cache_dir):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                assert b"SECRET" not in f.read(), name  # the scan record kept the signed URL


def _index(tmp_path, build_index, url: str) -> str:
    out = str(tmp_path / "names.json")
    build_index([url], out)
    return out


def test_open_cache_dir_creates_nothing_when_asked_not_to(tmp_path):
    assert open_cache_dir(tmp_path / "missing", create=False) is None
    assert not (tmp_path / "missing").exists()
    assert ShardCache(tmp_path / "missing").clean() == []
    assert not (tmp_path / "missing").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(CacheDirError, match="not a directory"):
        cache_state(tmp_path / "file")


# -- the command line ---------------------------------------------------------------------------


def test_older_than_requires_a_unit(tmp_path, capsys):
    cache = ShardCache(tmp_path)
    fill(cache, 1)
    with pytest.raises(SystemExit) as e:
        main(["cache", "--cache-dir", str(tmp_path), "clean", "--older-than", "7"])
    assert e.value.code == 2
    assert "'7' has no unit: write 7s, 7m, 7h or 7d" in capsys.readouterr().err
    assert len(cache.entries()) == 1
    assert main(["cache", "--cache-dir", str(tmp_path), "clean", "--older-than", "7d"]) == 0
    assert len(cache.entries()) == 1  # used just now


def test_ls_and_du_say_when_there_is_no_cache(tmp_path, capsys):
    missing, empty, foreign = tmp_path / "missing", tmp_path / "empty", tmp_path / "foreign"
    empty.mkdir()
    user_folder(foreign, {"photo.jpg": b"x"})
    for cmd in ("ls", "du"):
        assert main(["cache", "--cache-dir", str(missing), cmd]) == 0
        assert capsys.readouterr().out == f"no cache: {missing} does not exist\n"
        assert main(["cache", "--cache-dir", str(empty), cmd]) == 0
        assert capsys.readouterr().out == f"no cache: {empty} is empty\n"
        assert main(["cache", "--cache-dir", str(foreign), cmd]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{foreign} is not a wids cache" in err
    assert main(["cache", "--cache-dir", str(empty), "ls", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [] and "is empty" in out.err
    assert not missing.exists() and os.listdir(empty) == []  # nothing created or marked


def test_ls_and_du_of_a_marked_cache(tmp_path, capsys):
    cache = ShardCache(tmp_path)
    cache._prepare()
    assert main(["cache", "--cache-dir", str(tmp_path), "ls"]) == 0
    assert capsys.readouterr().out == f"no cached shards in {tmp_path}\n"
    fill(cache, 2)
    (tmp_path / "scans").mkdir()
    (tmp_path / "scans" / "t.json").write_bytes(b"x" * 10)
    assert main(["cache", "--cache-dir", str(tmp_path), "du"]) == 0
    assert capsys.readouterr().out == f"2.0 KB in 2 shards, 10 B in 1 member tables  {tmp_path}\n"
    assert main(["cache", "--cache-dir", str(tmp_path), "clean"]) == 0
    assert "removed 2 shards" in capsys.readouterr().out
    assert (tmp_path / "scans" / "t.json").exists()
