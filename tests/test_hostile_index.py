"""Hostile indexes, second round: values that escaped validation, and a seeded fuzz.

Every index a reader is handed may be crafted. Whatever its bytes, reading it (the
description, every shard's record and member table) either works or raises
:class:`~wids.errors.IndexFormatError` naming the file: never a builtin ``ValueError``,
``MemoryError``, ``UnicodeDecodeError`` or ``OverflowError``, never a hang. The fuzz below is
seeded and bounded in time (a few seconds per format in the suite; ``WIDS_FUZZ_SECONDS``
raises the budget for a longer hunt, ``WIDS_FUZZ_SEED`` changes the seed).
"""

from __future__ import annotations

import copy
import json
import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tarfixtures import make_samples, write_shard

from wids import build_index, open_index
from wids.errors import IndexFormatError, ShardNotFoundError

SECONDS = float(os.environ.get("WIDS_FUZZ_SECONDS", "3"))
SEED = int(os.environ.get("WIDS_FUZZ_SEED", "21"))

_INTERESTING_INTS = [
    0,
    1,
    -1,
    -2,
    511,
    512,
    2**31,
    2**32,
    2**53 + 1,
    2**62,
    2**63 - 1,
    -(2**63),
    2**64,
]
_INTERESTING = [
    *_INTERESTING_INTS,
    1.5,
    float("1e308"),
    "",
    "x",
    "\x00",
    "a\x00b",
    "\udcff",
    None,
    True,
    [],
    {},
    [1, 2],
    {"a": 1},
]


def _built(tmp_path: Path, suffix: str, nshards: int = 3) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    shards = [
        str(write_shard(tmp_path / f"s{i}.tar", make_samples(3 + i, start=10 * i)))
        for i in range(nshards)
    ]
    out = tmp_path / f"idx.{suffix}"
    build_index(shards, str(out))
    return out


def _read_all(path: Path) -> None:
    """Everything a dataset reads of an index: description, records, member tables."""
    from wids.index import iter_shards

    idx = open_index(str(path))
    try:
        _ = (idx.name, idx.components, idx.report, idx.has_members)
        for i, info in enumerate(iter_shards(idx)):
            _ = (info.url, info.fingerprint)
            idx.shard_extra(i)
            members = idx.members(i)
            if members is not None:
                members.spans()
                for j in range(len(members)):
                    members.key(j)
                    members.members(j)
    finally:
        idx.close()
    from wids import ShardListDataset

    ds = ShardListDataset(str(path), transformations=[])  # counts, cumulative counts, lookup
    if len(ds):
        ds._catalog.locate(len(ds) - 1)
    ds.close()


def _only_index_errors(path: Path, what: str) -> None:
    try:
        _read_all(path)
    except (IndexFormatError, ShardNotFoundError):
        return
    except Exception as e:
        import traceback

        where = "".join(traceback.format_exception(e)[-4:])
        raise AssertionError(f"{what}: {type(e).__name__}: {e}\n{where}") from e


# -- values that escaped validation ------------------------------------------------------------


def _sidecar(index: Path, shard: int = 0) -> Path:
    doc = json.loads(index.read_text())
    return index.parent / doc["shardlist"][shard]["members"]


def test_a_middle_member_offset_of_2_63_is_an_index_error_json(tmp_path: Path) -> None:
    index = _built(tmp_path, "json")
    side = _sidecar(index, 2)
    doc = json.loads(side.read_text())
    doc["member_offset"][1] = 2**63 - 1  # the first and last stay plausible
    side.write_text(json.dumps(doc))
    with pytest.raises(IndexFormatError, match="member_offset"):
        open_index(str(index)).members(2)


def test_a_middle_member_offset_of_2_63_is_an_index_error_table(tmp_path: Path) -> None:
    import numpy as np

    index = _built(tmp_path, "widx")
    idx = open_index(str(index))
    members = idx.members(2)
    assert members is not None
    idx.close()
    raw = bytearray(index.read_bytes())
    offsets = members.member_offset
    needle = offsets.astype("<i8").tobytes()
    at = raw.find(needle)
    assert at > 0
    raw[at + 8 : at + 16] = np.array([2**63 - 1], "<i8").tobytes()
    index.write_bytes(bytes(raw))
    with pytest.raises(IndexFormatError, match="member_offset"):
        open_index(str(index)).members(2)


def test_a_nul_in_a_shard_url_is_an_index_error(tmp_path: Path) -> None:
    from wids import ShardListDataset

    index = tmp_path / "ref.json"  # a reference description: the dataset scans the shard
    shard = {"url": "s0\x00.tar", "nsamples": 1}
    index.write_text(json.dumps({"wids_version": 1, "shardlist": [shard]}))
    with pytest.raises(IndexFormatError, match="NUL"):
        ShardListDataset(str(index))[0]
    index = _built(tmp_path / "json", "json")
    doc = json.loads(index.read_text())
    doc["shardlist"][1]["members"] += "\x00"  # the sidecar's path
    index.write_text(json.dumps(doc))
    with pytest.raises(IndexFormatError, match="members"):
        _read_all(index)
    index = _built(tmp_path, "sqlite")
    conn = sqlite3.connect(index)
    conn.execute("UPDATE shards SET url = 's0' || char(0) || '.tar' WHERE id = 0")
    conn.commit()
    conn.close()
    with pytest.raises(IndexFormatError, match="NUL"):
        _read_all(index)


def test_invalid_utf8_in_sqlite_master_is_an_index_error(tmp_path: Path) -> None:
    index = _built(tmp_path, "sqlite")
    conn = sqlite3.connect(index)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(
        "UPDATE sqlite_master SET sql = CAST(sql || X'ff' AS TEXT) WHERE name = 'components'"
    )
    conn.commit()
    conn.close()
    with pytest.raises(IndexFormatError, match="idx.sqlite"):
        _read_all(index)


@pytest.mark.parametrize("value", [-1, -2, -(2**40)])
def test_a_negative_members_sample_idx_is_an_index_error(tmp_path: Path, value: int) -> None:
    index = _built(tmp_path, "sqlite")
    conn = sqlite3.connect(index)
    conn.execute(f"UPDATE members SET sample_idx = {value} WHERE shard_id = 1")
    conn.commit()
    conn.close()
    with pytest.raises(IndexFormatError, match="idx.sqlite"):
        open_index(str(index)).members(1)


# -- the fuzz ----------------------------------------------------------------------------------


def _fuzz(
    tmp_path: Path, fmt: str, mutate: Callable[[random.Random, Path, Path], None], seed: int
) -> int:
    """Mutate a fresh copy of a real index until the time budget is spent; returns the count."""
    pristine = _built(tmp_path / "pristine", fmt)
    files = {p: p.read_bytes() for p in pristine.parent.rglob("*") if p.is_file()}
    rng = random.Random(seed)
    deadline, n = time.monotonic() + SECONDS, 0
    while time.monotonic() < deadline:
        for p, data in files.items():  # restore every file of the index
            p.write_bytes(data)
        mutate(rng, pristine, pristine.parent)
        _only_index_errors(pristine, f"{fmt} case {n} (seed {seed})")
        n += 1
    return n


def _flip_bytes(rng: random.Random, path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for _ in range(rng.choice((1, 2, 4, 8))):
        at = rng.randrange(len(raw))
        raw[at] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
    if rng.random() < 0.1:
        del raw[rng.randrange(len(raw)) :]
    path.write_bytes(bytes(raw))


def _mutate_json_value(rng: random.Random, doc: object) -> object:
    """One leaf (or container) of ``doc`` replaced by an interesting value."""
    if isinstance(doc, dict) and doc and rng.random() < 0.8:
        key = rng.choice(list(doc))
        if rng.random() < 0.1:
            del doc[key]
        else:
            doc[key] = _mutate_json_value(rng, doc[key])
        return doc
    if isinstance(doc, list) and doc and rng.random() < 0.8:
        i = rng.randrange(len(doc))
        doc[i] = _mutate_json_value(rng, doc[i])
        return doc
    return copy.deepcopy(rng.choice(_INTERESTING))


def _json_mutation(rng: random.Random, index: Path, root: Path) -> None:
    sidecars = sorted(root.glob("*.members/*.json"))
    target = rng.choice([index, *sidecars])
    if rng.random() < 0.3:
        _flip_bytes(rng, target)
        return
    doc = json.loads(target.read_text())
    for _ in range(rng.choice((1, 1, 2, 3))):
        doc = _mutate_json_value(rng, doc)
    target.write_text(json.dumps(doc))


def _table_mutation(rng: random.Random, index: Path, root: Path) -> None:
    raw = bytearray(index.read_bytes())
    if rng.random() < 0.5:
        _flip_bytes(rng, index)
        return
    # an 8-byte value (counts, offsets, sizes; packed tables need not be aligned) set to an
    # interesting integer, or a 2- or 4-byte one (field ids, flags)
    width = rng.choice((8, 8, 4, 2))
    at = (
        rng.randrange(len(raw) - width)
        if rng.random() < 0.5
        else width * rng.randrange(len(raw) // width)
    )
    value = rng.choice(_INTERESTING_INTS) % 2 ** (8 * width)
    raw[at : at + width] = value.to_bytes(width, "little")
    index.write_bytes(bytes(raw))


_SQL_TABLES = {
    "shards": ("id", "url", "nsamples", "size", "etag", "mtime", "md5sum", "has_members", "extra"),
    "members": ("shard_id", "sample_idx", "field_id", '"offset"', "size"),
    "samples": ("shard_id", "idx", '"key"', "start", '"end"'),
    "fields": ("id", "name"),
    "components": ("id", "name", "weight", "first_shard", "stop_shard"),
    "meta": ("key", "value"),
}
_SQL_VALUES = [
    *(str(v) for v in _INTERESTING_INTS if abs(v) < 2**63),
    "1.5",
    "1e308",
    "NULL",
    "''",
    "'x'",
    "X'00'",
    "X'ff'",
    "CAST(X'ff41' AS TEXT)",
    "'[' || 'x'",
    "'{\"a\": 1}'",
]


def _sqlite_mutation(rng: random.Random, index: Path, root: Path) -> None:
    if rng.random() < 0.2:
        _flip_bytes(rng, index)
        return
    conn = sqlite3.connect(index)
    try:
        for _ in range(rng.choice((1, 1, 2, 3))):
            table = rng.choice(list(_SQL_TABLES))
            column = rng.choice(_SQL_TABLES[table])
            value = rng.choice(_SQL_VALUES)
            where = rng.choice(("", " WHERE rowid = 1", " WHERE rowid = 2", " WHERE rowid % 2"))
            try:
                conn.execute(f"UPDATE {table} SET {column} = {value}{where}")
            except sqlite3.DatabaseError:
                pass  # a constraint said no: another mutation
        if rng.random() < 0.05:
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute(
                "UPDATE sqlite_master SET sql = CAST(sql || X'ff' AS TEXT) WHERE rowid = ?",
                (rng.randrange(1, 8),),
            )
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("fmt", "mutate"),
    [("json", _json_mutation), ("widx", _table_mutation), ("sqlite", _sqlite_mutation)],
)
def test_fuzzed_indexes_give_only_index_errors(tmp_path: Path, fmt: str, mutate) -> None:
    cases = _fuzz(tmp_path, fmt, mutate, SEED)
    assert cases > 10  # the budget was spent on cases, not on setting up
