"""One registry of index backends: readers by content, writers by name (``wids.index.registry``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from wids import (
    JsonIndex,
    JsonIndexWriter,
    SqliteIndex,
    SqliteIndexWriter,
    create_index_writer,
    open_index,
)
from wids.index import TableIndex, TableIndexWriter
from wids.index.registry import INDEX_SUFFIXES, is_sqlite_name, is_table_name, writer_for


def test_open_index_detects_sqlite_by_content(tmp_path: Path) -> None:
    path = tmp_path / "no-suffix"
    with SqliteIndexWriter(path, name="x"):
        pass
    assert isinstance(open_index(str(path)), SqliteIndex)
    shutil.copy(path, tmp_path / "odd.json")
    assert isinstance(open_index(str(tmp_path / "odd.json")), SqliteIndex)


@pytest.mark.parametrize(
    "name, writer",
    [
        ("x.json", JsonIndexWriter),
        ("X.JSON", JsonIndexWriter),
        ("x.sqlite", SqliteIndexWriter),
        ("x.sqlite3", SqliteIndexWriter),
        ("x.db", SqliteIndexWriter),
        ("x.widx", TableIndexWriter),
    ],
)
def test_create_index_writer_by_suffix(tmp_path: Path, name: str, writer: type) -> None:
    assert writer_for(tmp_path / name) is writer
    assert isinstance(create_index_writer(tmp_path / name), writer)
    assert is_sqlite_name(tmp_path / name) is (writer is SqliteIndexWriter)
    assert is_table_name(tmp_path / name) is (writer is TableIndexWriter)


def test_one_list_of_suffixes_and_no_backend_for_others(tmp_path: Path) -> None:
    assert INDEX_SUFFIXES == (".json", ".sqlite", ".sqlite3", ".db", ".widx")
    for bad in ("x.txt", "x.json.gz", "x"):
        with pytest.raises(ValueError, match="name the index"):
            create_index_writer(tmp_path / bad)
    # a remote URL's query string is not part of its name
    assert writer_for("s3://b/x.sqlite?versionId=3") is SqliteIndexWriter
    assert is_sqlite_name("s3://b/x.db?v=1") and not is_sqlite_name("s3://b/x.json?a=.db")


def test_open_index_detects_the_shard_table_by_content(tmp_path: Path) -> None:
    path = tmp_path / "x.widx"
    with TableIndexWriter(path, name="x"):
        pass
    shutil.copy(path, tmp_path / "odd.json")
    for p in (path, tmp_path / "odd.json"):
        assert isinstance(open_index(str(p)), TableIndex)


def test_a_json_description_opens_as_json(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"  # the content decides, not the name
    with JsonIndexWriter(path, name="x"):
        pass
    assert isinstance(open_index(str(path)), JsonIndex)


def test_a_remote_json_index_is_read_with_one_request(http_server, tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    with JsonIndexWriter(path, name="x"):
        pass
    url = http_server.put(path, "registry/one.json")
    http_server.reset_counts()
    reader = open_index(url)
    assert isinstance(reader, JsonIndex) and reader.name == "x" and reader.shards == []
    # no separate request for the first bytes: the JSON reader parses the one read
    assert http_server.request_count("registry/one.json") == 1
    # the content still decides: SQLite and shard-table files named *.json
    for cls, writer in ((SqliteIndex, SqliteIndexWriter), (TableIndex, TableIndexWriter)):
        with writer(tmp_path / cls.__name__, name="y"):
            pass
        odd = open_index(http_server.put(tmp_path / cls.__name__, f"registry/{cls.__name__}.json"))
        assert isinstance(odd, cls) and odd.name == "y"
        odd.close()


def test_a_dataset_over_a_json_index_loads_without_the_other_backends(http_server, tmp_path):
    """``len(ds)`` in the DataLoader's main process imports what loading needs only: on the
    old code the registry imported the SQLite reader and writer (sqlite3) and the shard-table
    writer, and the description the columns module, ~10 ms of a dataset's first load."""
    import os
    import subprocess
    import sys

    from wids import build_index
    from wids.synth import write_dataset

    paths = write_dataset(str(tmp_path), shards=2, samples_per_shard=5, real_images=False)
    build_index(paths, str(tmp_path / "idx.json"))
    for root, _, files in os.walk(tmp_path):
        for name in files:
            path = os.path.join(root, name)
            http_server.put(path, "lazyreg/" + os.path.relpath(path, tmp_path))
    script = (
        "import sys\n"
        "from wids import ShardListDataset\n"
        f"ds = ShardListDataset({http_server.url('lazyreg/idx.json')!r}, transformations=[])\n"
        "assert len(ds) == 10 and ds[7]['__key__']\n"
        "print(sorted(m for m in ('sqlite3', 'wids.index.sqlitereader', 'wids.index.sqlitewriter',"
        " 'wids.index.tablewriter', 'wids.index.columns') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
