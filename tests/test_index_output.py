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


def test_an_existing_index_even_a_damaged_one_may_be_rewritten(tmp_path: Path) -> None:
    json_index, sqlite_index = tmp_path / "i.json", tmp_path / "i.sqlite"
    with JsonIndexWriter(json_index), SqliteIndexWriter(sqlite_index):
        pass
    json_index.write_text(json_index.read_text()[:-20])  # damaged: --full repairs it
    for path in (json_index, sqlite_index, tmp_path / "new.json"):
        check_output(str(path), [])


@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_a_remote_index_is_published_whole_with_its_sidecars(suffix: str) -> None:
    fs = fsspec.filesystem("memory")
    root = f"/wids-out-{uuid.uuid4().hex[:8]}"
    fs.pipe(f"{root}/train.members/0123456789abcdef-gone.tar.json", b"{}")  # an old sidecar
    url = f"memory://{root}/train{suffix}"
    table = ShardMembers.from_samples([("k", [(".x", 512, 3)])])
    with index_destination(url) as path:
        assert not path.startswith("memory:") and path.endswith(f"train{suffix}")
        writer = JsonIndexWriter(path) if suffix == ".json" else SqliteIndexWriter(path)
        with writer:
            writer.add(ShardInfo("a.tar", 1, size=2048), table)
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.find(root))
    if suffix == ".json":
        doc = json.loads(fs.cat(f"{root}/train.json"))
        sidecar = doc["shardlist"][0]["members"].rsplit("/", 1)[-1]
        assert listed == sorted([sidecar, "train.json"])  # the stale sidecar is gone
    else:
        assert listed == ["0123456789abcdef-gone.tar.json", "train.sqlite"]  # not its sidecars
