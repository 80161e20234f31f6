"""Where an index is written: checks before any work, publishing with its sidecars."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest

from wids import JsonIndexWriter, ShardInfo, ShardMembers, SqliteIndexWriter
from wids.errors import DestinationError, OutputExistsError
from wids.index.output import check_output, index_destination


@pytest.mark.parametrize("name", ["x.txt", "x.json.gz", "x", "s3://b/x.csv?a=.json"])
def test_a_name_that_selects_no_backend_is_refused(tmp_path: Path, name: str) -> None:
    where = name if "://" in name else str(tmp_path / name)
    expected = r"must end in \.json or \.sqlite/\.sqlite3/\.db or \.widx"
    with pytest.raises(DestinationError, match=expected):
        check_output(where, [])


def test_outputs_that_must_not_be_written(tmp_path: Path) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(b"x" * 1024)
    with pytest.raises(DestinationError, match="read-only"):
        check_output("https://host/train.json", [])
    with pytest.raises(OutputExistsError, match="one of the shards"):
        check_output(str(tmp_path / "." / "a.tar.json"), [str(tmp_path / "a.tar.json")])
    (tmp_path / "d.json").mkdir()
    with pytest.raises(OutputExistsError, match="directory"):
        check_output(str(tmp_path / "d.json"), [str(shard)])
    for name, content in (("notes.json", b'{"mine": 1}'), ("data.db", b"not sqlite")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(OutputExistsError, match="not a wids index"):
            check_output(str(tmp_path / name), [str(shard)])


def test_a_file_where_the_member_tables_go_is_refused_and_kept(tmp_path: Path) -> None:
    """``train.members`` is a user's file: a typed error before any work, the file untouched.

    Before, the build failed deep in ``os.makedirs`` with a bare ``FileExistsError``.
    """
    from tarfixtures import make_samples, write_shard

    from wids import build_index

    write_shard(tmp_path / "a.tar", make_samples(2, prefix="a", fields=(".txt",)))
    (tmp_path / "train.members").write_bytes(b"mine")
    with pytest.raises(OutputExistsError, match="train.members/, which exists and is not a dir"):
        build_index([str(tmp_path / "a.tar")], str(tmp_path / "train.json"))
    assert (tmp_path / "train.members").read_bytes() == b"mine"
    assert not (tmp_path / "train.json").exists()
    build_index([str(tmp_path / "a.tar")], str(tmp_path / "train.sqlite"))  # no member folder


def test_an_existing_index_even_a_damaged_one_may_be_rewritten(tmp_path: Path) -> None:
    json_index, sqlite_index = tmp_path / "i.json", tmp_path / "i.sqlite"
    with JsonIndexWriter(json_index), SqliteIndexWriter(sqlite_index):
        pass
    json_index.write_text(json_index.read_text()[:-20])  # damaged: --full repairs it
    for path in (json_index, sqlite_index, tmp_path / "new.json"):
        check_output(str(path), [])


def _publish(url: str, suffix: str, shard: str) -> None:
    table = ShardMembers.from_samples([("k", [(".x", 512, 3)])])
    with index_destination(url) as path:
        assert not path.startswith("memory:") and path.endswith(f"train{suffix}")
        writer = JsonIndexWriter(path) if suffix == ".json" else SqliteIndexWriter(path)
        with writer:
            writer.add(ShardInfo(shard, 1, size=2048), table)


@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_a_remote_index_is_published_whole_with_its_sidecars(suffix: str) -> None:
    fs = fsspec.filesystem("memory")
    root = f"/wids-out-{uuid.uuid4().hex[:8]}"
    url = f"memory://{root}/train{suffix}"
    _publish(url, suffix, "gone.tar")  # its sidecar is stale once the next version is out
    fs.pipe(f"{root}/train.members/0123456789abcdef-old.tar.json", b"{}")  # an older wids's
    _publish(url, suffix, "a.tar")
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.find(root))
    if suffix == ".json":
        doc = json.loads(fs.cat(f"{root}/train.json"))
        sidecar = doc["shardlist"][0]["members"].rsplit("/", 1)[-1]
        assert listed == sorted([sidecar, "train.json"])  # the stale sidecars are gone
    else:
        assert listed == ["0123456789abcdef-old.tar.json", "train.sqlite"]  # not its sidecars


def test_a_members_directory_no_index_names_keeps_every_file() -> None:
    """A ``train.members/`` that no wids index beside it names is not wids's: nothing removed.

    Before, publishing ``train.json`` there removed every file named like a sidecar.
    """
    fs = fsspec.filesystem("memory")
    root = f"/wids-out-{uuid.uuid4().hex[:8]}"
    theirs = f"{root}/train.members/0123456789abcdef01234567-theirs.tar.json"
    fs.pipe(theirs, b'{"theirs": 1}')
    _publish(f"memory://{root}/train.json", ".json", "a.tar")
    assert fs.cat(theirs) == b'{"theirs": 1}'


# -- only files that are recognisably an index are replaced (issue 21, item 3) ---------------


def _users_sqlite(path: Path) -> None:
    import sqlite3

    with sqlite3.connect(path) as conn:  # a user's database that happens to use these names
        conn.execute("CREATE TABLE shards (id INTEGER PRIMARY KEY, url TEXT)")
        conn.execute("CREATE TABLE members (shard_id, sample_idx, field_id, offset, size)")
        conn.execute("INSERT INTO shards VALUES (1, 'my own data')")
    conn.close()


@pytest.mark.parametrize(
    "content",
    [
        b'{"model": {"shardlist": ["a.tar"], "__kind__": "x"}, "lr": 0.1}',
        b'{"note": "\\"shardlist\\": [], \\"__kind__\\": \\"wids-shard-index-v1\\""}',
        b'{"shardlist": ["a", "b"], "owner": "me"}',  # no wids_version: a user's list
        b'[{"url": "a.tar", "nsamples": 3}]',
    ],
)
def test_a_users_json_mentioning_index_keys_is_not_overwritten(tmp_path: Path, content) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(OutputExistsError, match="not a wids index"):
        check_output(str(path), [])


def test_a_users_sqlite_with_shards_and_members_tables_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "mine.sqlite"
    _users_sqlite(path)
    with pytest.raises(OutputExistsError, match="not a wids index"):
        check_output(str(path), [])


def test_reference_and_large_indexes_are_recognised(tmp_path: Path) -> None:
    from wids import create_index_writer

    shardlist = [{"url": f"s-{i:06d}.tar", "nsamples": 10} for i in range(5000)]
    for name, doc in {
        "bare.json": {"wids_version": 1, "shardlist": shardlist},  # written by hand
        "late.json": {"name": "x" * 70000, "__kind__": "wids-shard-index-v1"},
        "big.json": {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shardlist},
    }.items():
        (tmp_path / name).write_text(json.dumps(doc, indent=2))
        if name != "late.json":
            check_output(str(tmp_path / name), [])
    with pytest.raises(OutputExistsError):  # its keys are past the first 64 KB: not risked
        check_output(str(tmp_path / "late.json"), [])
    big = tmp_path / "big.sqlite"
    writer = create_index_writer(big, name="n" * 100_000)
    with writer:
        for i in range(20_000):
            writer.add(ShardInfo(f"s-{i:06d}.tar", 1, size=4096), None)
    check_output(str(big), [])


def test_the_cli_gives_no_repair_hint_for_a_file_that_never_was_an_index(tmp_path: Path) -> None:
    import subprocess
    import sys

    from wids.synth import write_dataset

    shards = write_dataset(str(tmp_path), shards=1, samples_per_shard=3, real_images=False)
    db, config = tmp_path / "mine.sqlite", tmp_path / "config.json"
    _users_sqlite(db)
    config.write_text('{"model": {"shardlist": "x"}, "lr": 0.1}')
    before = {p: p.read_bytes() for p in (db, config)}

    def wids(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "wids", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    for out in (db, config):
        for extra in ([], ["--full"]):
            r = wids("index", "create", *shards, "-o", str(out), "-q", *extra)
            assert r.returncode == 2 and "not a wids index" in r.stderr, r.stderr
            assert "--full" not in r.stderr and "to repair" not in r.stderr
        r = wids("index", "info", str(out))
        assert r.returncode == 2 and "not a wids" in r.stderr and "to repair" not in r.stderr
    assert {p: p.read_bytes() for p in (db, config)} == before
    damaged = tmp_path / "i.json"
    assert wids("index", "create", *shards, "-o", str(damaged), "-q").returncode == 0
    damaged.write_bytes(damaged.read_bytes()[:-40])
    r = wids("index", "info", str(damaged))
    assert r.returncode == 2 and "to repair" in r.stderr  # a damaged index gets the hint


def test_readers_raise_not_an_index_for_a_users_file(tmp_path: Path) -> None:
    from wids import open_index
    from wids.errors import NotAnIndexError

    db, config = tmp_path / "mine.sqlite", tmp_path / "config.json"
    _users_sqlite(db)
    config.write_text('{"lr": 0.1}')
    for path in (db, config):
        with pytest.raises(NotAnIndexError, match="not a wids"):
            index = open_index(str(path))
            index.shards  # noqa: B018  (JSON loads on first use)
