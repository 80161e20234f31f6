"""``shards_ending``: the shards a URL's last part can name, from an index without a record each.

Held against the records themselves (``reader.shard(k).url``, what an exclusion's pass over
every shard used to read) on real shard-table and SQLite indexes, written with URLs of every
shape an index may store: relative, in sub-directories, absolute paths, remote URLs, a bare
name, ``pipe:`` commands, ``~`` paths, names ending in ``/`` or ``.``, non-ASCII names.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from wids import IndexFormatError, ShardInfo, write_index
from wids.index import open_index, shards_ending

BACKENDS = ("widx", "sqlite")

STORED = [
    "a.tar",
    "shards/a.tar",
    "other/a.tar",
    "shards/b.tar",
    "shards/ab.tar",
    "shards/xa.tar",
    "/abs/dir/a.tar",
    "s3://bucket/dir/a.tar",
    "https://host/p/b.tar",
    "shards/ünï-0001.tar",
    "deep/er/ünï-0001.tar",
    "shards/c.tgz",
    "shards/dir/",
    "shards/dots/..",
    "shards/a.tar/.",
    "~/data/a.tar",
    "pipe:curl -s -L https://host/p/c.tar",
    "shards/pipe:x.tar",
    "b.tar",
    "shards/s-0000001.tar",
    "shards/s-0000002.tar",
    "shards/s-0000012.tar",
]


def _write(path: Path, urls: list[str]) -> str:
    with write_index(path, name="t") as writer:
        for url in urls:
            writer.add(ShardInfo(url, 0), None)
    return str(path)


def _exact(reader, names: set[str]) -> set[int]:
    """The shards whose resolved URL has one of ``names`` as its last part (every record)."""
    return {k for k in range(reader.nshards) if reader.shard(k).url.rsplit("/", 1)[-1] in names}


@pytest.mark.filterwarnings("ignore:wids reads 'pipe:")  # the pipe: URL, read as its URL
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_shard_a_name_can_match_is_a_candidate(tmp_path, backend):
    reader = open_index(_write(tmp_path / f"i.{backend}", STORED))
    parts = {u.rsplit("/", 1)[-1] for u in STORED} | {"c.tar", "nope.tar", "dir", "a", ""}
    rng = random.Random(0)
    for names in [{p} for p in parts] + [set(rng.sample(sorted(parts), 4)) for _ in range(30)]:
        got = shards_ending(reader, names)
        assert got is not None and got.dtype == np.int64
        assert got.tolist() == sorted(set(got.tolist())), "sorted, each once"
        assert _exact(reader, names) <= set(got.tolist()), names


@pytest.mark.parametrize("backend", BACKENDS)
def test_plain_urls_give_exactly_the_shards_ending_in_the_name(tmp_path, backend):
    urls = [f"shards/{d}/s-{k:05d}.tar" for d in ("x", "y") for k in range(300)]
    urls += ["s-00007.tar", "/abs/s-00007.tar", "gs://b/s-00007.tar", "s-00007.tar.gz"]
    reader = open_index(_write(tmp_path / f"i.{backend}", urls))
    for names in ({"s-00007.tar"}, {"s-00299.tar", "s-00000.tar", "x"}, {"s-00007.tar.gz"}):
        got = shards_ending(reader, names)
        assert got is not None
        assert set(got.tolist()) == _exact(reader, names)
    assert shards_ending(reader, {"00007.tar", "tar", "nope"}).tolist() == []  # type: ignore[union-attr]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_url_map_that_may_rename_a_last_part_asks_for_every_record(tmp_path, backend):
    path = _write(tmp_path / f"i.{backend}", ["/data/a-1.tar", "/data/b-1.tar"])
    keeps = open_index(path, url_map={"/data/": "/mirror/"})
    assert shards_ending(keeps, {"a-1.tar"}).tolist() == [0]  # type: ignore[union-attr]
    assert keeps.shard(0).url == "/mirror/a-1.tar"
    renames = open_index(path, url_map={"/data/a-": "/mirror/b-"})
    assert renames.shard(0).url == "/mirror/b-1.tar"  # now named b-1.tar: no column can say
    assert shards_ending(renames, {"b-1.tar"}) is None


def test_a_json_index_has_no_such_lookup(tmp_path):
    reader = open_index(_write(tmp_path / "i.json", ["a.tar"]))
    assert shards_ending(reader, {"a.tar"}) is None


def test_sqlite_rows_that_are_not_text_are_candidates_and_refused_when_read(tmp_path):
    path = _write(tmp_path / "i.sqlite", ["shards/a.tar", "shards/b.tar"])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE shards SET url = CAST('shards/a.tar' AS BLOB) WHERE id = 1")
    reader = open_index(path)
    assert shards_ending(reader, {"a.tar"}).tolist() == [0, 1]  # type: ignore[union-attr]
    with pytest.raises(IndexFormatError, match="shards row 1"):
        reader.shard(1)


def test_malformed_url_offsets_are_candidates_so_reading_them_raises():
    from wids.index.lastpart import blob_candidates

    blob = np.frombuffer(b"x/a.tarb.tar", dtype=np.uint8)
    # shard 0: x/a.tar; 1: past the blob's end; 2: backwards; 3: ".tar"; 4: b.tar, a bare name
    offsets = np.array([0, 7, 100, 3, 7, 12], dtype=np.int64)
    assert blob_candidates(blob, offsets, {"a.tar"}).tolist() == [0, 1, 2]
    assert blob_candidates(blob, offsets, {"b.tar"}).tolist() == [1, 2, 4]
    assert blob_candidates(blob, offsets, {"c.tar", "\ud800"}).tolist() == [1, 2]
