"""Hostile inputs: crafted tars, crafted indexes (JSON and SQLite), huge values.

Every case asserts the typed error (never a raw ``OverflowError``, ``RecursionError``,
``MemoryError`` or a hang) and that its message names the file and what is wrong. All inputs
are generated here; no binary fixtures.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from tarfixtures import make_samples, write_shard

from wids import build_index, open_index
from wids.cli import main as wids_main
from wids.errors import IndexFormatError, TarFormatError, UntrustedLocationError
from wids.storage import redact_url
from wids.tar import iter_members_fetch, iter_members_stream, scan_local

# -------------------------------------------------------------------------------------------
# Tars


def _rechecksum(raw: bytearray, at: int) -> None:
    block = raw[at : at + 512]
    block[148:156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(block)


def _member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.USTAR_FORMAT)


def _all_parsers(path: Path) -> list:
    """One call per entry point: local scan, fetch callable, stream."""
    data = path.read_bytes()
    return [
        lambda: scan_local(path, shard=str(path)),
        lambda: list(iter_members_fetch(lambda s, e: data[s:e], shard=str(path))),
        lambda: list(
            iter_members_fetch(lambda s, e: data[s:e], shard=str(path), file_size=len(data))
        ),
        lambda: list(iter_members_stream(io.BytesIO(data), shard=str(path))),
    ]


def _base256_size_tar(path: Path, size: int) -> Path:
    """A shard whose second member's header says ``size`` in base-256 (GNU) notation."""
    write_shard(path, make_samples(2, fields=(".txt",)), format="gnu")
    raw = bytearray(path.read_bytes())
    raw[1024 + 124 : 1024 + 136] = b"\x80" + size.to_bytes(11, "big")
    _rechecksum(raw, 1024)
    path.write_bytes(bytes(raw))
    return path


def test_base256_size_2_80_is_a_tar_error_naming_shard_and_offset(tmp_path: Path) -> None:
    path = _base256_size_tar(tmp_path / "huge.tar", 2**80)
    for parse in _all_parsers(path):
        with pytest.raises(TarFormatError) as err:
            parse()
        assert err.value.offset == 1024
        assert "huge.tar" in str(err.value) and "size" in str(err.value)


def test_base256_size_past_the_end_is_truncation_not_overflow(tmp_path: Path) -> None:
    """A large but representable size: the archive is reported short, no C-long overflow."""
    path = _base256_size_tar(tmp_path / "big.tar", 2**61)
    for parse in _all_parsers(path):
        with pytest.raises(TarFormatError, match="big.tar"):
            parse()


def _pax_tar(path: Path, records: bytes) -> Path:
    """A pax ``x`` record with the given raw record data, then the member ``k.txt``."""
    xinfo = tarfile.TarInfo("././@PaxHeader")
    xinfo.type, xinfo.size = tarfile.XHDTYPE, len(records)
    pad = -len(records) % 512
    body = b"hi".ljust(512, b"\0")
    data = (
        xinfo.tobuf(tarfile.USTAR_FORMAT)
        + records
        + bytes(pad)
        + _member_header("k.txt", 2)
        + body
        + _member_header("k.cls", 2)
        + body
        + bytes(1024)
    )
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(b"20 path=sample.txt\n", id="one-too-large"),  # value "sample.txt\n"
        pytest.param(b"20 path=sample.txt\n11 size=2\n", id="too-large-before-another"),
        pytest.param(b"18 path=sample.txt\n", id="one-too-small"),
        pytest.param(b"12 path=sample.txt\n", id="much-too-small"),  # tarfile dropped the rest
        pytest.param(b"99 path=sample.txt\n", id="past-the-end"),
        pytest.param(b"19 path=sample.txt\n8 size=2\n", id="second-too-small"),
        pytest.param(b"19 path=sample.txt\ngarbage", id="trailing-garbage"),
        pytest.param(b"9" * 40 + b" path=x\n", id="absurd-digits"),
    ],
)
def test_bad_pax_record_length_is_a_tar_error(tmp_path: Path, records: bytes) -> None:
    path = _pax_tar(tmp_path / "pax.tar", records)
    for parse in _all_parsers(path):
        with pytest.raises(TarFormatError) as err:
            parse()
        assert err.value.offset == 0 and "pax.tar" in str(err.value)


def test_good_pax_record_with_nul_padding_still_parses(tmp_path: Path) -> None:
    path = _pax_tar(tmp_path / "pax.tar", b"19 path=sample.txt\n\0\0\0")
    for parse in _all_parsers(path):
        assert [m.name for m in parse()] == ["sample.txt", "k.cls"]


def test_skip_bad_skips_only_the_overflowing_shard(tmp_path: Path, capsys) -> None:
    good = [write_shard(tmp_path / f"good{i}.tar", make_samples(3, start=10 * i)) for i in (0, 1)]
    bad = _base256_size_tar(tmp_path / "bad.tar", 2**80)
    paxbad = _pax_tar(tmp_path / "paxbad.tar", b"20 path=sample.txt\n")
    shards = [str(good[0]), str(bad), str(paxbad), str(good[1])]
    out = tmp_path / "idx.json"
    assert (
        wids_main(["index", "create", *shards, "-o", str(out), "--skip-bad"]) == 1
    )  # 1: some skipped
    idx = open_index(str(out))
    assert [os.path.basename(s.url) for s in idx.shards] == ["good0.tar", "good1.tar"]
    report = json.loads(out.read_text())["wids_index"]["report"]
    bad_names = sorted(os.path.basename(b["url"]) for b in report["bad"])
    assert bad_names == ["bad.tar", "paxbad.tar"]
    # and through the Python API, without skip_bad, the error names the shard
    with pytest.raises(TarFormatError, match="bad.tar"):
        build_index([str(good[0]), str(bad)], str(tmp_path / "other.json"))


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_mutated_tars_only_give_tar_errors(tmp_path: Path, fmt: str) -> None:
    """Random header bytes (checksums fixed up): a result or a TarFormatError, nothing raw."""
    import random

    path = write_shard(tmp_path / "s.tar", make_samples(4, fields=(".txt", "." + "x" * 120)))
    if fmt == "pax":
        path = _pax_tar(tmp_path / "s.tar", b"19 path=sample.txt\n")
    clean = path.read_bytes()
    headers = [m.header_offset for m in scan_local(path)]
    rng = random.Random(7)
    for _ in range(300):
        raw = bytearray(clean)
        at = rng.choice(headers)
        for _ in range(rng.randint(1, 4)):
            raw[at + rng.choice([124, 125, 130, 135, 156, 0, 345, rng.randrange(512)])] = (
                rng.choice([0, 0x80, 0xFF, 0x30, 0x37, 0x20, rng.randrange(256)])
            )
        _rechecksum(raw, at)
        path.write_bytes(bytes(raw))
        for parse in _all_parsers(path):
            try:
                parse()
            except TarFormatError as e:
                assert "s.tar" in str(e)


# -------------------------------------------------------------------------------------------
# Crafted JSON indexes


def _built(tmp_path: Path, suffix: str, nshards: int = 2) -> Path:
    """A real index of ``nshards`` small shards, to be tampered with."""
    shards = [
        str(write_shard(tmp_path / f"s{i}.tar", make_samples(4, start=10 * i)))
        for i in range(nshards)
    ]
    out = tmp_path / f"idx.{suffix}"
    build_index(shards, str(out))
    return out


def _sidecar(index: Path, shard: int = 0) -> Path:
    doc = json.loads(index.read_text())
    return index.parent / doc["shardlist"][shard]["members"]


def _first_members(index: Path):
    idx = open_index(str(index))
    try:
        return idx.members(0)
    finally:
        idx.close()


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        pytest.param(lambda d: d.update(member_offset=[2**70] * 12), "member_offset", id="2**70"),
        pytest.param(lambda d: d.update(member_offset=[2**62] * 12), "member_offset", id="2**62"),
        pytest.param(
            lambda d: d["member_field"].__setitem__(0, -1), "member_field", id="neg-field"
        ),
        pytest.param(lambda d: d["member_field"].__setitem__(0, 7), "member_field", id="field-7"),
        pytest.param(lambda d: d["member_size"].__setitem__(0, -5), "member_size", id="neg-size"),
        pytest.param(lambda d: d["member_offset"].reverse(), "overlaps", id="unsorted"),
        pytest.param(
            lambda d: d["member_offset"].__setitem__(1, d["member_offset"][0] + 1),
            "overlaps",
            id="overlapping",
        ),
        pytest.param(
            lambda d: d["member_size"].__setitem__(-1, 10**9), "past the shard", id="past-end"
        ),
        pytest.param(lambda d: d["member_offset"].__setitem__(0, 0), "member_offset", id="zero"),
        pytest.param(lambda d: d["member_offset"].__setitem__(0, 1.5), "not integers", id="float"),
        pytest.param(lambda d: d["member_offset"].__setitem__(0, "9"), "not integers", id="text"),
        pytest.param(lambda d: d["member_offset"].__setitem__(0, True), "member_offset", id="bool"),
        pytest.param(lambda d: d.update(fields=".jpg"), "fields", id="fields-string"),
        pytest.param(lambda d: d.update(fields=[".a", ".a", ".b"]), "fields", id="fields-dup"),
        pytest.param(lambda d: d.update(sample_start=[0, 3, 3, 6, 12]), "sample_start", id="empty"),
    ],
)
def test_crafted_sidecar_values_are_index_errors(tmp_path: Path, edit, words: str) -> None:
    index = _built(tmp_path, "json")
    sidecar = _sidecar(index)
    _edit_json(sidecar, edit)
    with pytest.raises(IndexFormatError) as err:
        _first_members(index)
    assert sidecar.name in str(err.value) and words in str(err.value)


def test_deeply_nested_json_is_an_index_error(tmp_path: Path) -> None:
    index = _built(tmp_path, "json")
    sidecar = _sidecar(index)
    sidecar.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(IndexFormatError, match="nested too deeply") as err:
        _first_members(index)
    assert sidecar.name in str(err.value)
    index.write_text('{"wids_version": 1, "shardlist": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(IndexFormatError, match="nested too deeply") as err:
        _ = open_index(str(index)).shards
    assert "idx.json" in str(err.value)


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        pytest.param({"nsamples": 10**12}, "'nsamples' 1000000000000 is more than", id="count"),
        pytest.param({"nsamples": 10**30, "filesize": None}, "nsamples", id="no-size"),
        pytest.param({"filesize": 2**62}, "filesize", id="size-2**62"),
        pytest.param({"filesize": -1}, "filesize", id="size-negative"),
        pytest.param({"mtime": float("nan")}, "mtime", id="mtime-nan"),
        pytest.param({"mtime": float("inf")}, "mtime", id="mtime-inf"),
    ],
)
def test_crafted_description_values_are_index_errors(tmp_path: Path, entry, words: str) -> None:
    index = _built(tmp_path, "json")
    _edit_json(index, lambda d: d["shardlist"][1].update(entry))
    with pytest.raises(IndexFormatError) as err:
        _ = open_index(str(index)).shards
    assert "idx.json" in str(err.value) and "shardlist[1]" in str(err.value)
    assert words in str(err.value)


def test_huge_integer_literal_is_an_index_error(tmp_path: Path) -> None:
    index = tmp_path / "idx.json"
    index.write_text(
        '{"wids_version": 1, "shardlist": [{"url": "a", "nsamples": 9%s}]}' % ("9" * 5000)
    )
    with pytest.raises(IndexFormatError, match="idx.json: not valid JSON"):
        _ = open_index(str(index)).shards


def test_source_url_fan_out_is_bounded(tmp_path: Path) -> None:
    """Each level lists the next one 100 times: 10**6 loads unless the total is capped."""
    for level in range(3):
        sub = {"datasets": [{"source_url": f"l{level + 1}.json"}] * 100}
        (tmp_path / f"l{level}.json").write_text(json.dumps({"wids_version": 1, **sub}))
    (tmp_path / "l3.json").write_text(json.dumps({"wids_version": 1, "shardlist": []}))
    with pytest.raises(IndexFormatError, match="descriptions loaded through source_url"):
        _ = open_index(str(tmp_path / "l0.json")).shards


# -------------------------------------------------------------------------------------------
# Crafted SQLite indexes


def _edit_sqlite(path: Path, *statements: str) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        for sql in statements:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


_RECURSIVE_SHARDS = (
    "ALTER TABLE shards RENAME TO real_shards",
    "CREATE VIEW shards AS WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r) "
    "SELECT i AS id, 'x' || i AS url, 1 AS nsamples, NULL AS size, NULL AS etag, "
    "NULL AS mtime, NULL AS md5sum, 0 AS has_members, NULL AS extra FROM r",
)


@pytest.mark.parametrize(
    ("statements", "words"),
    [
        pytest.param(_RECURSIVE_SHARDS, "'shards' is a view", id="recursive-view"),
        pytest.param(
            (
                "ALTER TABLE members RENAME TO m0",
                "CREATE VIEW members AS SELECT * FROM m0",
            ),
            "'members' is a view",
            id="members-view",
        ),
        pytest.param(("DROP TABLE components",), "'components' is missing", id="missing"),
        pytest.param(("DROP INDEX members_shard",), "lacks its indexes", id="no-index"),
        pytest.param(
            (
                "DROP INDEX members_shard",
                "CREATE INDEX members_shard ON members (size)",
            ),
            "lacks its indexes",
            id="wrong-index",
        ),
        pytest.param(
            (
                "ALTER TABLE fields RENAME TO f0",
                "CREATE TABLE fields (id INTEGER PRIMARY KEY, "
                "name TEXT GENERATED ALWAYS AS (printf('%.*c', 1000000000, 'x')))",
            ),
            "generated columns",
            id="generated-column",
        ),
        pytest.param(
            ("UPDATE shards SET id = 1099511627776 WHERE id = 1",), "shards row 1", id="id"
        ),
        pytest.param(("UPDATE shards SET nsamples = 10000000000000",), "nsamples", id="count"),
        pytest.param(("UPDATE shards SET size = -3",), "size in [0, 2**62)", id="size"),
        pytest.param(("UPDATE shards SET mtime = 'soon'",), "mtime", id="mtime-text"),
        pytest.param(("UPDATE shards SET url = X'41'",), "a url", id="url-blob"),
        pytest.param(
            ("UPDATE fields SET id = 4611686018427387904 WHERE id = 0",),
            "fields row",
            id="field-id",
        ),
        pytest.param(("UPDATE components SET stop_shard = 99",), "stop_shard", id="component"),
    ],
)
def test_crafted_sqlite_schema_and_shards_are_index_errors(
    tmp_path: Path, statements: tuple[str, ...], words: str
) -> None:
    index = _built(tmp_path, "sqlite")
    _edit_sqlite(index, *statements)
    with pytest.raises(IndexFormatError) as err:
        idx = open_index(str(index))
        _ = idx.shards
        idx.members(0)
    assert "idx.sqlite" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize(
    ("statement", "words"),
    [
        ("UPDATE members SET field_id = 4611686018427387904 WHERE rowid = 1", "field ids"),
        ("UPDATE members SET field_id = -1 WHERE rowid = 1", "field ids"),
        ("UPDATE members SET sample_idx = 1152921504606846976 WHERE rowid = 12", "samples outside"),
        ("UPDATE members SET sample_idx = -1 WHERE rowid = 1", "samples outside"),
        ('UPDATE members SET "offset" = 4611686018427387904 WHERE rowid = 12', "member_offset"),
        ('UPDATE members SET "offset" = 9.5 WHERE rowid = 2', "integers only"),
        ('UPDATE members SET "offset" = NULL WHERE rowid = 2', "integers only"),
        ('UPDATE members SET "offset" = "offset" + 5000 WHERE rowid = 1', "overlaps"),
        ("UPDATE members SET size = size + 100000 WHERE rowid = 12", "past the shard"),
        ("UPDATE samples SET idx = idx + 7 WHERE idx = 3", "numbered"),
        ('UPDATE samples SET "key" = NULL WHERE idx = 1', "text keys"),
    ],
)
def test_crafted_sqlite_member_rows_are_index_errors(
    tmp_path: Path, statement: str, words: str
) -> None:
    index = _built(tmp_path, "sqlite")
    _edit_sqlite(index, statement)
    with pytest.raises(IndexFormatError) as err:
        _first_members(index)
    assert "idx.sqlite" in str(err.value) and "shard 0" in str(err.value)
    assert words in str(err.value)


def test_sqlite_report_nested_too_deeply(tmp_path: Path) -> None:
    index = _built(tmp_path, "sqlite")
    _edit_sqlite(index, "UPDATE meta SET value = '%s' WHERE key = 'report'" % ("[" * 100_000))
    with pytest.raises(IndexFormatError, match="idx.sqlite: meta 'report' is not valid JSON"):
        _ = open_index(str(index)).report


# -------------------------------------------------------------------------------------------
# A remote index may not point at local files


def _remote_index(http_server, tmp_path: Path, name: str, urls: list[str], suffix: str = "json"):
    """An index on nginx whose shards are a real remote shard and then ``urls``, as written."""
    local = write_shard(tmp_path / "real.tar", make_samples(3))
    http_server.put(local, f"{name}/real.tar")
    out = tmp_path / f"{name}.{suffix}"
    build_index([http_server.url(f"{name}/real.tar")], str(out))
    if suffix == "json":
        doc = json.loads(out.read_text())
        entry = dict(doc["shardlist"][0])
        entry.pop("members", None)
        doc["shardlist"] += [dict(entry, url=u) for u in urls]
        out.write_text(json.dumps(doc))
    else:
        stmts = [
            f"INSERT INTO shards (id, url, nsamples, size, has_members) "
            f"SELECT {i + 1}, '{u}', nsamples, size, 0 FROM shards WHERE id = 0"
            for i, u in enumerate(urls)
        ]
        _edit_sqlite(out, *stmts, f"UPDATE components SET stop_shard = stop_shard + {len(urls)}")
    http_server.put(out, f"{name}/index.{suffix}")
    return http_server.url(f"{name}/index.{suffix}"), local


@pytest.mark.parametrize(
    "bad",
    [
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "memory://x/secret.tar",
        "simplecache::file:///etc/passwd",
        "tar://passwd::/etc/passwd.tar",
        "asynclocal:///etc/passwd",  # the local disk (morefs): was taken as remote
        "git:///home/me/repo:main@secrets.tar",  # a local git repository (pygit2)
        "dvc://data/a.tar",  # a local DVC repository
    ],
)
@pytest.mark.parametrize("suffix", ["json", "sqlite"])
def test_remote_index_cannot_name_local_files(
    http_server, tmp_path: Path, bad: str, suffix: str, capsys
) -> None:
    from wids import ShardListDataset

    name = f"local-{suffix}-{abs(hash(bad))}"
    url, _ = _remote_index(http_server, tmp_path, name, [bad], suffix)
    ds = ShardListDataset(url, transformations=[])
    with pytest.raises(UntrustedLocationError) as err:
        len(ds)
    text = str(err.value)
    assert isinstance(err.value, IndexFormatError) and "repair" not in text
    assert f"index.{suffix}" in text and "not a remote location" in text
    assert ("shardlist[1]" if suffix == "json" else "shards row 1") in text
    assert bad.split("::")[0].split("://")[0].lower() in text and "allow_local_shards" in text
    # wids subset refuses too, and creates nothing
    dest = tmp_path / "subset"
    assert wids_main(["subset", url, "--to", str(dest), "--shards", "0:2"]) != 0
    assert "not a remote location" in capsys.readouterr().err and not dest.exists()


@pytest.mark.parametrize(
    "bad", ["bogus://host/a.tar", " https://host/a.tar", "htps://u:pw@h/a.tar"]
)
def test_a_shard_url_of_no_known_protocol_is_an_index_error_naming_it(
    http_server, tmp_path: Path, bad: str
) -> None:
    """fsspec's bare ``ValueError: Protocol not known`` named no shard; now a typed error does."""
    from wids import ShardListDataset

    name = f"unknown-{abs(hash(bad))}"
    url, _ = _remote_index(http_server, tmp_path, name, [bad], "json")
    for ds in (
        ShardListDataset(url, transformations=[]),
        ShardListDataset([{"url": bad, "nsamples": 2}], transformations=[]),
    ):
        with pytest.raises(IndexFormatError, match="no storage backend is known") as err:
            ds[len(ds) - 1]
        assert err.value.shard == redact_url(bad) and "pw" not in str(err.value)


def test_remote_index_with_a_local_base_or_source_url(http_server, tmp_path: Path) -> None:
    real = write_shard(tmp_path / "passwd", make_samples(2))
    base_doc = {"wids_version": 1, "base": f"file://{tmp_path}", "shardlist": []}
    base_doc["shardlist"].append({"url": "passwd", "nsamples": 2})
    http_server.put_bytes(json.dumps(base_doc).encode(), "localbase/index.json")
    (tmp_path / "mine.json").write_text(json.dumps({"wids_version": 1, "shardlist": []}))
    sub_doc = {"wids_version": 1, "datasets": [{"source_url": f"file://{tmp_path}/mine.json"}]}
    http_server.put_bytes(json.dumps(sub_doc).encode(), "localbase/sub.json")
    with pytest.raises(IndexFormatError, match=r"shardlist\[0\]: url .*not a remote location"):
        _ = open_index(http_server.url("localbase/index.json")).shards
    with pytest.raises(IndexFormatError, match="source_url .*not a remote location"):
        _ = open_index(http_server.url("localbase/sub.json")).shards
    # the caller may opt in, and then the local shard is served
    from wids import ShardListDataset

    ds = ShardListDataset(
        http_server.url("localbase/index.json"), transformations=[], allow_local_shards=True
    )
    assert len(ds) == 2 and ds[1][".cls"] == b"1"
    assert real.exists()


def test_remote_index_may_name_remote_shards_anywhere(http_server, tmp_path: Path) -> None:
    """Path-absolute and ``..`` URLs stay on the index's host: they are remote, so allowed."""
    url, _ = _remote_index(http_server, tmp_path, "remote-abs", ["/remote-abs/real.tar"])
    from wids import ShardListDataset

    ds = ShardListDataset(url, transformations=[])
    assert len(ds) == 6 and ds[4][".cls"] == b"1"


def test_remote_index_opt_in_through_the_cli(http_server, tmp_path: Path) -> None:
    local = write_shard(tmp_path / "mine.tar", make_samples(2))
    entry = {"url": f"file://{local}", "nsamples": 2, "filesize": local.stat().st_size}
    doc = {"wids_version": 1, "shardlist": [{"url": "x.tar", "nsamples": 0}, entry]}
    http_server.put_bytes(json.dumps(doc).encode(), "optin/index.json")
    url = http_server.url("optin/index.json")
    dest = tmp_path / "copy"
    argv = ["subset", url, "--to", str(dest), "--shards", "1:2"]
    assert wids_main(argv) != 0 and not dest.exists()
    assert wids_main([*argv, "--allow-local-shards"]) == 0
    assert (dest / "mine.tar").read_bytes() == local.read_bytes()


# -------------------------------------------------------------------------------------------
# Huge sample counts: samplers hold shards and chunks, never per-sample arrays

HUGE = 10**12


def _peak_bytes(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class _Shards:
    """Shard lengths as a dataset (a plain list would be one shard of len() samples)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths


def _take(sampler, n: int) -> list[int]:
    import itertools

    return list(itertools.islice(iter(sampler), n))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: __import__("wids").ChunkedSampler(_Shards([HUGE])), id="chunked"),
        pytest.param(
            lambda: __import__("wids").ChunkedSampler(_Shards([HUGE // 2] * 2)), id="2-shards"
        ),
        pytest.param(
            lambda: __import__("wids").ChunkedSampler(_Shards([HUGE]), shufflefirst=True),
            id="reordered",
        ),
        pytest.param(
            lambda: __import__("wids").ChunkedSampler(_Shards([HUGE]), num_workers=4, batch_size=8),
            id="workers",
        ),
        pytest.param(lambda: __import__("wids").ShardedSampler(lengths=[HUGE]), id="sharded"),
        pytest.param(
            lambda: __import__("wids").DistributedChunkedSampler(
                _Shards([HUGE]), num_replicas=4, rank=3
            ),
            id="distributed",
        ),
        pytest.param(
            lambda: __import__("wids").DistributedChunkedSampler(
                _Shards([HUGE]), num_replicas=4, rank=0, partition="global", chunksize=2000
            ),
            id="global",
        ),
    ],
)
def test_samplers_over_10_12_samples_use_little_memory(make) -> None:
    box: dict = {}

    def run() -> None:
        s = box["s"] = make()
        s.set_epoch(1)  # epoch 1 shuffles the chunk order too
        box["a"] = _take(s, 50_000)

    peak = _peak_bytes(run)
    s, first = box["s"], box["a"]
    assert peak < 200 << 20, f"{peak / 2**20:.0f} MiB"
    assert len(first) == 50_000 and len(set(first)) == 50_000
    assert all(0 <= i < HUGE for i in first)
    assert len(s) in (HUGE, HUGE // 4)
    # deterministic per seed and epoch, and resumable
    again = make()
    again.set_epoch(1)
    assert _take(again, 1000) == first[:1000]
    state = s.state_dict(position=700)
    resumed = make()
    resumed.load_state_dict(state)
    assert _take(resumed, 300) == first[700:1000]


def test_distributed_ranks_have_equal_exact_lengths_at_10_12() -> None:
    from wids import DistributedChunkedSampler

    lengths = [HUGE + 3, 7]
    for drop_last in (False, True):
        sizes = {
            len(
                DistributedChunkedSampler(
                    _Shards(lengths), num_replicas=8, rank=r, drop_last=drop_last
                )
            )
            for r in range(8)
        }
        assert sizes == {(HUGE + 10) // 8 if drop_last else -(-(HUGE + 10) // 8)}


# -------------------------------------------------------------------------------------------
# Terminal escape sequences in shard URLs


def test_cache_ls_escapes_control_characters_of_shard_urls(tmp_path, capsys):
    """An OSC title, a clear screen and a bell in a cached shard's URL are shown escaped."""
    import fsspec

    from wids.cache import ShardCache
    from wids.storage import Source

    fs = fsspec.filesystem("memory")
    name = "/wids-hostile-ls/a\x1b]0;pwned\x07\x1b[2J\x1b[31m\u202e.tar"
    fs.pipe_file(name, b"x" * 1000)
    try:
        cache_dir = str(tmp_path / "cache")
        ShardCache(cache_dir).open(Source("memory://" + name.lstrip("/"))).close()
        assert wids_main(["cache", "--cache-dir", cache_dir, "ls"]) == 0
        out = capsys.readouterr().out
        assert "wids-hostile-ls/a" in out
        for c in ("\x1b", "\x07", "\u202e"):
            assert c not in out, repr(out)
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in out
    finally:
        fs.rm("/wids-hostile-ls", recursive=True)


# -- member names (issue 21: 15 MB pax names were accepted as keys) ----------------------------


@pytest.mark.parametrize("fmt", ["pax", "gnu"])
def test_a_member_name_over_4096_bytes_is_a_tar_error(tmp_path: Path, fmt: str) -> None:
    from wids.tar import MAX_NAME

    long_key = "d/" + "k" * (MAX_NAME - 5)  # name = key + ".txt": one byte over the limit
    members = [("000000.txt", b"a"), (f"{long_key}.txt", b"b"), ("000002.txt", b"c")]
    path = write_shard(tmp_path / f"{fmt}.tar", members, format=fmt)
    for parse in _all_parsers(path):
        with pytest.raises(TarFormatError, match="member name of 4,097 bytes"):
            parse()
    fits = [("000000.txt", b"a"), (f"{long_key[:-1]}.txt", b"b")]  # exactly at the limit
    ok = write_shard(tmp_path / f"{fmt}-ok.tar", fits, format=fmt)
    for parse in _all_parsers(ok):
        parse()


# -- a per-sample size bound (issue 21, item 11) -----------------------------------------------


def _sparse_tar(path: Path, huge: int = 64 << 30) -> Path:
    """A tar whose middle sample is one ``huge``-byte member, written sparse (a few KB on disk)."""
    with open(path, "wb") as f:
        for name, data, size in (
            ("000000.txt", b"small", 5),
            ("000001.bin", None, huge),
            ("000002.txt", b"after", 5),
        ):
            info = tarfile.TarInfo(name)
            info.size = size
            f.write(info.tobuf(tarfile.GNU_FORMAT))
            if data is None:
                f.seek(size + (-size % 512), os.SEEK_CUR)
            else:
                f.write(data + b"\0" * (-size % 512))
        f.write(b"\0" * 1024)
    return path


def _assert_too_large(err, size: int) -> None:
    from wids.errors import SampleTooLargeError

    assert isinstance(err, SampleTooLargeError) and isinstance(err, ValueError)
    assert err.key == "000001" and err.size == size and "sparse.tar" in str(err)
    assert "'000001'" in str(err) and f"{size:,} bytes" in str(err) and "stream" in str(err)


def test_a_64_gib_sample_is_refused_naming_shard_key_and_size(tmp_path: Path) -> None:
    from wids import ShardListDataset

    shard = _sparse_tar(tmp_path / "sparse.tar")
    build_index([str(shard)], str(tmp_path / "i.json"), md5=False)  # headers only: fine
    ds = ShardListDataset(str(tmp_path / "i.json"))
    assert ds[0][".txt"] == "small" and ds[2][".txt"] == "after"
    for read in (lambda: ds[1], lambda: ds.__getitems__([0, 1, 2])):
        with pytest.raises(ValueError) as err:
            read()
        _assert_too_large(err.value, 64 << 30)
    assert [s[".txt"] for s in ds.__getitems__([0, 2])] == ["small", "after"]


def test_the_sample_bound_is_configurable(tmp_path: Path) -> None:
    from wids import ShardListDataset

    shard = _sparse_tar(tmp_path / "sparse.tar", huge=5000)
    build_index([str(shard)], str(tmp_path / "i.json"))
    small = ShardListDataset(str(tmp_path / "i.json"), max_sample_bytes=4999, transformations=[])
    with pytest.raises(ValueError) as err:
        small[1]
    _assert_too_large(err.value, 5000)
    fits = ShardListDataset(str(tmp_path / "i.json"), max_sample_bytes=5000, transformations=[])
    assert len(fits[1][".bin"]) == 5000
    unbounded = ShardListDataset(str(tmp_path / "i.json"), max_sample_bytes=None)
    assert len(unbounded.__getitems__([1])[0][".bin"]) == 5000
    with pytest.raises(ValueError, match="max_sample_bytes"):
        ShardListDataset(str(tmp_path / "i.json"), max_sample_bytes=0)


def test_a_remote_64_gib_sample_is_refused_before_any_read(http_server) -> None:
    from wids import ShardListDataset

    root = http_server.root / f"sparse-{os.getpid()}"
    root.mkdir(exist_ok=True)
    _sparse_tar(root / "sparse.tar")
    build_index([str(root / "sparse.tar")], str(root / "i.json"), md5=False)
    rel = root.relative_to(http_server.root)
    ds = ShardListDataset(f"{http_server.base}/{rel}/i.json", access="range")
    assert ds[0][".txt"] == "small"
    before = http_server.request_count("sparse.tar")
    for read in (lambda: ds[1], lambda: ds.__getitems__([1, 2])):
        with pytest.raises(ValueError) as err:
            read()
        _assert_too_large(err.value, 64 << 30)
    assert http_server.request_count("sparse.tar") == before
