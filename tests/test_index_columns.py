"""Metadata columns in the index: specs, collection, storage in every format, the CLI paths."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tarfixtures import write_shard

from wids import (
    ColumnError,
    ExclusionError,
    IndexFormatError,
    ShardListDataset,
    ShardWriter,
    build_index,
    convert_index,
    open_index,
)
from wids.cli import main
from wids.index.coladd import add_columns
from wids.index.columns import (
    EXTRA_KEY,
    MAX_JSON_BYTES,
    MAX_STRING_BYTES,
    ColumnSpec,
    decode_columns,
    encode_columns,
    parse_specs,
    values_column,
)

FORMATS = ("json", "sqlite", "widx")


def _shard(path: Path, metas: list, start: int = 0, jpg: bool = True) -> str:
    members = []
    for j, meta in enumerate(metas):
        key = f"{start + j:06d}"
        if jpg:
            members.append((key + ".jpg", b"x" * (10 + start + j)))
        if meta is not None:
            raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
            members.append((key + ".json", raw))
    return str(write_shard(path, members, format="gnu"))


def test_specs_and_their_default_names():
    assert ColumnSpec.parse("json:width") == ColumnSpec("width", "json", "width")
    assert ColumnSpec.parse("json:meta.w") == ColumnSpec("meta_w", "json", "meta.w")
    assert ColumnSpec.parse("size:.jpg") == ColumnSpec("size_jpg", "size", ".jpg")
    assert ColumnSpec.parse("has:.seg.png") == ColumnSpec("has_seg_png", "has", ".seg.png")
    assert ColumnSpec.parse("w=json:a.b") == ColumnSpec("w", "json", "a.b")
    for bad in (
        "width",
        "json:",
        "json:a..b",
        "size:jpg",
        "blob:.jpg",
        "class=json:x",  # a keyword
        "isnull=json:x",  # reserved by filters
        "json:my-width",  # no identifier: needs NAME=
        "x" * 65 + "=json:a",
    ):
        with pytest.raises(ColumnError):
            ColumnSpec.parse(bad)
    with pytest.raises(ColumnError, match="two columns"):
        parse_specs(["json:w", "w=size:.jpg"])
    with pytest.raises(ColumnError, match="at most"):
        parse_specs([f"c{i}=json:x" for i in range(65)])


def test_values_are_typed_and_mixtures_refused():
    assert values_column([1, 2, None]).type == "int64"
    col = values_column([1, 2.5, None, float("nan")])
    assert col.type == "float64" and col.missing.tolist() == [False, False, True, True]
    assert values_column([True, None]).type == "bool"
    assert values_column(["a", None]).type == "str"
    assert values_column([None, None]).type == "null"
    for bad, why in (
        ([1, "a"], "str value"),
        ([True, 1], "int64 value"),
        ([{"a": 1}], "got dict"),
        ([1 << 63], "out of int64"),
        (["x" * (MAX_STRING_BYTES + 1)], "over"),
    ):
        with pytest.raises(ColumnError, match=why):
            values_column(bad, "s.tar: ", ["k0"])


def test_encoding_round_trips_and_is_narrow():
    cols = {
        "a": values_column([1, None, -3]),
        "b": values_column([1 << 40, 0, 1]),
        "f": values_column([0.5, None, 2.0]),
        "t": values_column([True, False, None]),
        "s": values_column(["x", None, "é"]),
        "n": values_column([None, None, None]),
    }
    extra = {EXTRA_KEY: json.loads(json.dumps(encode_columns(cols, 3)))}
    assert extra[EXTRA_KEY]["columns"]["a"]["dtype"] == "|i1"
    assert extra[EXTRA_KEY]["columns"]["b"]["dtype"] == "<i8"
    back = decode_columns(extra, 3, "s.tar")
    assert back["a"].values.tolist()[::2] == [1, -3] and back["a"].missing.tolist() == [
        False,
        True,
        False,
    ]
    assert back["b"].values.tolist() == [1 << 40, 0, 1] and back["b"].missing is None
    assert math.isnan(back["f"].values[1]) and back["t"].missing.tolist() == [False, False, True]
    assert back["s"].values.tolist() == ["x", None, "é"] and back["n"].type == "null"
    with pytest.raises(ColumnError):
        encode_columns({"a": values_column([1])}, 3)  # wrong length


def test_hostile_json_members_are_typed_errors_naming_shard_and_sample(tmp_path):
    cases = {
        "notjson": [{"w": 1}, b"{not json"],
        "object": [{"w": {"x": 1}}],
        "mixed": [{"w": 1}, {"w": "wide"}],
        "huge": [{"w": 1, "pad": "x" * (MAX_JSON_BYTES + 10)}],
        "deep": [b"[" * 100000 + b"]" * 100000],
    }
    for name, metas in cases.items():
        d = tmp_path / name
        d.mkdir()
        shard = _shard(d / f"{name}.tar", metas)
        out = str(d / "i.json")
        with pytest.raises(ColumnError) as e:
            build_index([shard], out, columns=["json:w"])
        assert f"{name}.tar" in str(e.value) and "sample '0000" in str(e.value), name
        # the failed column pass leaves the scanned index as it was: loadable, no columns
        ds = ShardListDataset(out, transformations=[])
        assert len(ds) == len(metas)
        with pytest.raises(ColumnError, match="no column"):
            ds.column("w")


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_create_with_columns_then_info(tmp_path, capsys, fmt):
    shards = [
        _shard(tmp_path / "a.tar", [{"width": 10, "ok": True}, {"width": 20}, None]),
        _shard(tmp_path / "b.tar", [{"width": 35.5, "ok": False}, {"height": 3}], start=3),
    ]
    out = str(tmp_path / f"i.{fmt}")
    argv = ["index", "create", *shards, "-o", out, "-q", "--column", "json:width"]
    assert main([*argv, "--column", "size:.jpg", "--column", "json:ok"]) == 0
    ds = ShardListDataset(out, transformations=[])
    width = ds.column("width")
    assert width.dtype == np.float64  # ints and a float across shards
    assert np.array_equal(width, [10, 20, np.nan, 35.5, np.nan], equal_nan=True)
    assert ds.column("size_jpg").tolist() == [10, 11, 12, 13, 14]
    capsys.readouterr()
    assert main(["index", "info", out, "--columns"]) == 0
    text = capsys.readouterr().out
    assert "column   width            float64  3 values, 2 missing, min 10.0, max 35.5" in text
    assert "column   ok               bool     2 values, 3 missing, 1 true, 1 false" in text
    assert main(["index", "info", out, "--columns", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    size = next(c for c in info["columns"] if c["name"] == "size_jpg")
    assert (size["min"], size["max"], size["missing"]) == (10, 14, 0)
    assert sum(size["histogram"]["counts"]) == 5 and len(size["histogram"]["edges"]) == 11
    plain = str(tmp_path / f"plain.{fmt}")
    assert main(["index", "create", *shards, "-o", plain, "-q"]) == 0
    capsys.readouterr()
    assert main(["index", "info", plain, "--columns"]) == 0
    assert "no metadata columns" in capsys.readouterr().out


def test_columns_survive_conversion_rebuild_and_adding_more(tmp_path):
    shards = [
        _shard(tmp_path / f"s{k}.tar", [{"w": k * 10 + j} for j in range(4)]) for k in range(3)
    ]
    src = str(tmp_path / "i.json")
    build_index(shards, src, columns=["json:w"])
    want = [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]
    for fmt in FORMATS[1:]:
        dst = str(tmp_path / f"c.{fmt}")
        convert_index(src, dst)
        assert ShardListDataset(dst).column("w").tolist() == want
    # an incremental rebuild that asks for the columns again keeps them (shards reused)
    report = build_index(shards, src, columns=["json:w"])
    assert report.reused == 3 and ShardListDataset(src).column("w").tolist() == want
    # adding a column keeps the ones there
    add_columns(src, ["size:.jpg"])
    ds = ShardListDataset(src)
    assert ds.column("w").tolist() == want and len(ds.column("size_jpg")) == 12
    with pytest.raises(ColumnError, match="local index"):
        build_index(shards, "s3://bucket/i.json", columns=["json:w"])


def test_an_old_reader_sees_the_columns_as_extra_keys_only(tmp_path):
    """Readers before columns ignore unknown shard keys: the index opens, shards read."""
    shard = _shard(tmp_path / "s.tar", [{"w": 1}, {"w": 2}])
    for fmt in FORMATS:
        out = str(tmp_path / f"i.{fmt}")
        build_index([shard], out, columns=["json:w"])
        idx = open_index(out)
        try:
            assert set(idx.shard_extra(0)) == {EXTRA_KEY}
            assert idx.members(0).keys() == ["000000", "000001"]
        finally:
            idx.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_shardwriter_columns_match_index_create(tmp_path, fmt):
    d = tmp_path / "w"
    specs = ["json:width", "size:.jpg", "has:.txt", "label=json:meta.label"]
    with ShardWriter(
        str(d / "s-%03d.tar"), maxcount=3, index=str(d / f"i.{fmt}"), columns=specs
    ) as sink:
        for i in range(8):
            sample = {"__key__": f"{i:04d}", "jpg": b"y" * (5 + i)}
            if i != 4:
                sample["json"] = {"width": i * 100, "meta": {"label": f"L{i % 2}"}}
            if i % 3 == 0:
                sample["txt"] = "t"
            sink.write(sample)
    written = ShardListDataset(str(d / f"i.{fmt}"), transformations=[])
    scanned_index = str(tmp_path / f"scan.{fmt}")
    build_index(sorted(str(p) for p in d.glob("s-*.tar")), scanned_index, columns=specs)
    scanned = ShardListDataset(scanned_index, transformations=[])
    for name in ("width", "size_jpg", "has_txt", "label"):
        a, b = written.column(name), scanned.column(name)
        assert a.dtype == b.dtype and a.tolist() == pytest.approx(b.tolist(), nan_ok=True), name
    assert written.column("width", missing=-1).tolist() == [0, 100, 200, 300, -1, 500, 600, 700]
    assert written.column("label")[4] is None and written.column("label")[5] == "L1"


def test_shardwriter_resume_reads_the_kept_shards_columns(tmp_path):
    index = str(tmp_path / "i.sqlite")
    pattern = str(tmp_path / "s-%03d.tar")
    with ShardWriter(pattern, maxcount=2, index=index, columns=["json:w"]) as sink:
        for i in range(4):
            sink.write({"__key__": f"{i:04d}", "json": {"w": i}})
    with ShardWriter(pattern, maxcount=2, index=index, columns=["json:w"], resume=True) as sink:
        sink.write({"__key__": "0004", "json": {"w": 4}})
    assert ShardListDataset(index).column("w").tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ColumnError, match="index"):
        ShardWriter(pattern, index=None, columns=["json:w"])
    with pytest.raises(ColumnError):
        ShardWriter(pattern, index=index, columns=["nonsense"])


def test_a_bad_sample_for_a_column_is_refused_before_it_is_written(tmp_path):
    pattern = str(tmp_path / "s-%03d.tar")
    index = str(tmp_path / "i.json")
    with ShardWriter(pattern, maxcount=10, index=index, columns=["json:w"]) as sink:
        sink.write({"__key__": "0000", "json": {"w": 1}})
        with pytest.raises(ColumnError, match="sample '0001'"):
            sink.write({"__key__": "0001", "json": {"w": [1, 2]}})
        sink.write({"__key__": "0002", "json": {"w": 2}})
    ds = ShardListDataset(index, transformations=[])
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["0000", "0002"]
    assert ds.column("w").tolist() == [1, 2]


def test_cli_subset_where_writes_an_exclusion_and_keeps_columns(tmp_path, capsys):
    shards = [
        _shard(tmp_path / f"s{k}.tar", [{"w": 100 * (3 * k + j)} for j in range(3)], start=3 * k)
        for k in range(3)
    ]
    index = str(tmp_path / "i.widx")
    build_index(shards, index, columns=["json:w"])
    before = {p: os.stat(p).st_mtime_ns for p in shards}
    out = tmp_path / "sub"
    argv = ["subset", index, "--shards", "1:", "--where", "w >= 400 and w != 700", "--to", str(out)]
    assert main([*argv, "-q"]) == 0
    assert "(2 excluded)" in capsys.readouterr().out
    ds = ShardListDataset(str(out / "i.widx"), transformations=[])
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["000004", "000005", "000006", "000008"]
    assert ds.column("w").tolist() == [400, 500, 600, 800]
    assert {p: os.stat(p).st_mtime_ns for p in shards} == before  # no source touched
    assert (out / "i.widx.exclude").read_text().splitlines()[1:] == [
        "s1.tar\t000003",
        "s2.tar\t000007",
    ]
    bad = [
        "subset",
        index,
        "--shards",
        ":",
        "--where",
        "__import__('os')",
        "--to",
        str(tmp_path / "x"),
    ]
    assert main(bad) != 0
    assert "the functions are isnull, notnull, abs" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.servers
def test_remote_index_over_nginx_and_remote_shards_collected_by_range(
    http_server, tmp_path, capsys
):
    root = http_server.root / f"cols-{os.getpid()}"
    root.mkdir()
    shards = [
        _shard(root / f"s{k}.tar", [{"w": 10 * k + j} for j in range(5)], start=5 * k)
        for k in range(3)
    ]
    urls = [f"{http_server.base}/{root.name}/{Path(s).name}" for s in shards]
    # columns of remote shards: the .json members read by range over HTTP
    local = str(tmp_path / "remote-shards.json")
    build_index(urls, local, columns=["json:w", "size:.jpg"])
    assert ShardListDataset(local).column("w").tolist() == [
        0,
        1,
        2,
        3,
        4,
        10,
        11,
        12,
        13,
        14,
        20,
        21,
        22,
        23,
        24,
    ]
    # an index served by nginx: its columns read from the remote description
    index = str(root / "i.widx")
    build_index(shards, index, columns=["json:w"])
    ds = ShardListDataset(
        f"{http_server.base}/{root.name}/i.widx", transformations=[], exclude=[0, 7]
    )
    assert ds.column("w").tolist() == [1, 2, 3, 4, 10, 11, 13, 14, 20, 21, 22, 23, 24]
    keep = ds.where("w % 10 < 2")
    ds2 = ShardListDataset(
        f"{http_server.base}/{root.name}/i.widx", transformations=[], exclude=keep
    )
    assert [ds2[i]["__key__"] for i in range(len(ds2))] == [
        "000001",
        "000005",
        "000006",
        "000010",
        "000011",
    ]
    # a JSON index served by nginx: its columns are in the sidecars, read over HTTP
    build_index(shards, str(root / "i.json"), columns=["json:w"])
    ds = ShardListDataset(f"{http_server.base}/{root.name}/i.json", transformations=[])
    assert ds.column("w").tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24]
    # index info --columns reads the remote sidecars (several at once) as the local ones
    infos = []
    for where in (str(root / "i.json"), f"{http_server.base}/{root.name}/i.json"):
        assert main(["index", "info", where, "--columns", "--json"]) == 0
        infos.append(json.loads(capsys.readouterr().out)["columns"])
    assert infos[0] == infos[1] and infos[0][0]["count"] == 15
    shutil.rmtree(root)


def test_an_sqlite_index_opens_without_reading_the_rows_columns(tmp_path):
    """Opening counts every shard's samples: from an index, not the rows holding columns."""
    import sqlite3

    shard = _shard(tmp_path / "s.tar", [{"w": 1}, {"w": 2}])
    out = str(tmp_path / "i.sqlite")
    build_index([shard], out, columns=["json:w"])
    conn = sqlite3.connect(out)
    try:
        plan = conn.execute("EXPLAIN QUERY PLAN SELECT nsamples FROM shards ORDER BY id").fetchall()
    finally:
        conn.close()
    assert "COVERING INDEX" in str(plan)


def test_json_columns_of_a_compressed_shard_are_decoded_from_its_seek_points(tmp_path):
    pytest.importorskip("indexed_gzip")
    from compressfixtures import compressible_samples, tarfile_gz

    plain = compressible_samples(120, seed=3)  # .txt, .bin, .cls per sample
    members = []
    for i in range(120):
        members += plain[3 * i : 3 * i + 3]
        members.append((f"s{i:06d}.json", json.dumps({"w": i * 3, "tag": f"t{i % 4}"}).encode()))
    shard = tarfile_gz(tmp_path / "c.tar.gz", members)
    out = str(tmp_path / "c.json")  # compressed shards: a JSON index (docs/compressed.md)
    build_index(
        [str(shard)], out, columns=["json:w", "json:tag", "size:.bin"], seek_spacing=64 << 10
    )
    ds = ShardListDataset(out, transformations=[])
    assert ds.column("w").tolist() == [i * 3 for i in range(120)]
    assert ds.column("tag")[5] == "t1"
    assert ds.column("size_bin").tolist() == [len(plain[3 * i + 1][1]) for i in range(120)]


def test_a_shard_table_refuses_columns_its_readers_would_refuse(tmp_path):
    """A .widx keeps at most 1 MiB of extra keys per shard: more is refused when written."""
    caption = "x" * 1000
    shard = _shard(
        tmp_path / "big.tar", [{"cap": caption + str(i)} for i in range(1100)], jpg=False
    )
    out = str(tmp_path / "i.widx")
    with pytest.raises(IndexFormatError, match=r"over the shard table's 1048576.*\.sqlite"):
        build_index([shard], out, columns=["json:cap"])
    ds = ShardListDataset(out, transformations=[])  # the index as scanned, without columns
    assert len(ds) == 1100
    other = str(tmp_path / "i.sqlite")  # no such limit
    build_index([shard], other, columns=["json:cap"])
    assert ShardListDataset(other).column("cap")[1099] == caption + "1099"


def test_info_columns_of_values_spanning_more_than_a_float_holds(tmp_path, capsys):
    """Review of issue 23: numpy cannot make 10 finite bins over [-1.7e308, 1.7e308]: ``index
    info --columns`` failed with its ValueError. Such a column has no histogram."""
    shard = _shard(tmp_path / "a.tar", [{"v": 1.7e308}, {"v": -1.7e308}, {"v": 0.5}, {"n": 1}])
    out = str(tmp_path / "i.widx")
    build_index([shard], out, columns=["json:v", "size:.jpg"])
    capsys.readouterr()
    assert main(["index", "info", out, "--columns", "--json"]) == 0
    info = {c["name"]: c for c in json.loads(capsys.readouterr().out)["columns"]}
    assert (info["v"]["min"], info["v"]["max"], info["v"]["missing"]) == (-1.7e308, 1.7e308, 1)
    assert "histogram" not in info["v"] and sum(info["size_jpg"]["histogram"]["counts"]) == 4
    assert main(["index", "info", out, "--columns"]) == 0
    assert "min -1.7e+308, max 1.7e+308" in capsys.readouterr().out


def test_a_rebuild_without_columns_warns_that_it_drops_them(tmp_path, capsys):
    """Review of issue 23: ``wids index create`` again (incremental, one shard more) without
    ``--column`` silently wrote an index without the columns ``ds.where`` filters need."""
    import warnings

    shards = [
        _shard(tmp_path / f"s{k}.tar", [{"w": k}, {"w": k + 1}], start=2 * k) for k in range(3)
    ]
    out = str(tmp_path / "i.json")
    assert main(["index", "create", *shards[:2], "-o", out, "-q", "--column", "json:w"]) == 0
    with pytest.warns(UserWarning, match=r"has metadata columns \(w\).*--column SPEC"):
        assert main(["index", "create", *shards, "-o", out, "-q"]) == 0
    with pytest.raises(ColumnError, match="no column named 'w'"):
        ShardListDataset(out).column("w")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no columns now: nothing to warn about
        assert main(["index", "create", *shards, "-o", out, "-q", "--column", "json:w"]) == 0
        assert main(["index", "create", *shards, "-o", out, "-q", "--column", "json:w"]) == 0
    assert ShardListDataset(out).column("w").tolist() == [0, 1, 1, 2, 2, 3]


def test_a_writer_extending_an_index_without_columns_warns_that_it_drops_them(tmp_path):
    """Review of issue 23: ``ShardWriter(start_shard=...)`` (or ``resume``) without
    ``columns=`` over an index with columns rewrote it without them, silently."""
    pattern, index = str(tmp_path / "s-%03d.tar"), str(tmp_path / "i.json")
    with ShardWriter(pattern, maxcount=3, index=index, columns=["json:w"]) as w:
        for i in range(7):
            w.write({"__key__": f"{i:04d}", "json": {"w": i}})
    with pytest.warns(UserWarning, match=r"has metadata columns \(w\); this writer") as got:
        with ShardWriter(pattern, maxcount=3, index=index, start_shard=3) as w:
            w.write({"__key__": "0009", "json": {"w": 9}})
    assert got[0].filename == __file__  # the warning points at the user's line
    with pytest.raises(ColumnError, match="no column named 'w'"):
        ShardListDataset(index).column("w")


def test_info_of_a_filtered_subset_summarises_the_kept_samples(tmp_path, capsys):
    """Review of issue 23: ``index info --columns`` of ``wids subset --where``'s output
    summarised every sample of the copied shards (min width 64 after ``width >= 256``) and did
    not say that the index opens with an exclusion."""
    shards = [
        _shard(tmp_path / f"s{k}.tar", [{"w": 100 * (3 * k + j)} for j in range(3)], start=3 * k)
        for k in range(3)
    ]
    index = str(tmp_path / "i.json")
    build_index(shards, index, columns=["json:w", "size:.jpg"])
    argv = ["subset", index, "--shards", ":", "--where", "w >= 400", "--to", str(tmp_path / "sub")]
    assert main([*argv, "-q"]) == 0
    capsys.readouterr()
    sub = str(tmp_path / "sub" / "i.json")
    assert main(["index", "info", sub, "--columns", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    cols = {c["name"]: c for c in info["columns"]}
    assert (info["samples"], info["excluded"]) == (9, 4)
    assert (cols["w"]["count"], cols["w"]["min"], cols["w"]["max"]) == (5, 400, 800)
    assert cols["w"]["count"] == len(ShardListDataset(sub)) == sum(cols["w"]["histogram"]["counts"])
    assert (cols["size_jpg"]["min"], cols["size_jpg"]["missing"]) == (14, 0)
    assert main(["index", "info", sub, "--columns"]) == 0
    assert "excluded 4 by " in capsys.readouterr().out
    assert main(["index", "info", index, "--columns", "--json"]) == 0  # no exclusion beside
    assert "excluded" not in json.loads(capsys.readouterr().out)
    with open(sub + ".exclude", "a") as f:
        f.write("no-such-key\n")  # opening refuses it; info still answers, and says so
    with pytest.raises(ExclusionError):
        len(ShardListDataset(sub))
    assert main(["index", "info", sub]) == 0
    assert "excluded ? (exclude: 1 of 5 entries name no sample" in capsys.readouterr().out
