"""``ds.column`` and ``ds.where`` over real shards and real indexes of every format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from tarfixtures import write_shard

from wids import ColumnError, IndexFormatError, ShardListDataset, build_index
from wids.index.coladd import add_columns

SHARDS, PER = 3, 6
FORMATS = ("json", "sqlite", "widx")


def _meta(i: int) -> dict | None:
    """Sample i's .json: sample 7 has no width, sample 10 no .json member at all."""
    if i == 10:
        return None
    meta: dict = {"width": 100 * i, "height": 50 + i, "caption": f"c{i % 3}", "ok": i % 2 == 0}
    if i == 7:
        del meta["width"]
    return meta


def write_shards(d: Path) -> list[str]:
    paths = []
    for k in range(SHARDS):
        members = []
        for j in range(PER):
            i = PER * k + j
            key = f"{i:06d}"
            members.append((key + ".jpg", b"x" * (100 + i)))
            meta = _meta(i)
            if meta is not None:
                members.append((key + ".json", json.dumps(meta).encode()))
        paths.append(str(write_shard(d / f"s-{k}.tar", members, format="pax")))
    return paths


SPECS = ["json:width", "json:height", "json:caption", "json:ok", "size:.jpg", "has:.json"]
N = SHARDS * PER


@pytest.fixture(scope="module", params=FORMATS)
def index(request, tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp(f"cols-{request.param}")
    paths = write_shards(d)
    out = str(d / f"train.{request.param}")
    build_index(paths, out)
    add_columns(out, SPECS)
    return out


def _keys(ds: ShardListDataset) -> list[int]:
    return [int(ds[i]["__key__"]) for i in range(len(ds))]


def test_column_is_aligned_with_samples_typed_and_missing_is_nan(index):
    ds = ShardListDataset(index, transformations=[])
    width = ds.column("width")
    assert width.dtype == np.float64 and len(width) == len(ds) == N
    for i in range(N):
        key = int(ds[i]["__key__"])
        meta = _meta(key)
        if meta is None or "width" not in meta:
            assert math.isnan(width[i])
        else:
            assert width[i] == meta["width"]
    # an int column without gaps stays int64; with missing= the type is kept
    size = ds.column("size_jpg")
    assert size.dtype == np.int64 and size.tolist() == [100 + i for i in range(N)]
    filled = ds.column("width", missing=-1)
    assert filled.dtype == np.int64 and filled[7] == -1 and filled[10] == -1 and filled[3] == 300
    has = ds.column("has_json")
    assert has.dtype == bool and has.tolist() == [i != 10 for i in range(N)]
    caption = ds.column("caption")
    assert caption.dtype == object and caption[10] is None and caption[4] == "c1"
    ok = ds.column("ok")  # bool with a gap (sample 10): float64 with NaN
    assert ok.dtype == np.float64 and math.isnan(ok[10]) and ok[4] == 1.0 and ok[5] == 0.0
    assert ds.column("ok", missing=False).dtype == bool


def test_column_follows_exclusions(index):
    ds = ShardListDataset(index, transformations=[], exclude=[0, 5, 13])
    width = ds.column("width", missing=-1)
    assert len(width) == len(ds) == N - 3
    assert width.tolist() == [100 * k if k not in (7, 10) else -1 for k in _keys(ds)]


def test_where_gives_the_exclusion_that_keeps_what_the_expression_holds_for(index):
    ds = ShardListDataset(index, transformations=[])
    cases = {
        "width >= 300 and height < 62": [3, 4, 5, 6, 8, 9, 11],
        "not (width > 500)": [0, 1, 2, 3, 4, 5, 7, 10],
        "isnull(width)": [7, 10],
        "width / height > 10 and size_jpg != 117": [6, 8, 9, 11, 12, 13, 14, 15, 16],
        "caption in ('c0', 'c2') and ok": [0, 2, 6, 8, 12, 14],
        "256 <= width < 700 or caption == 'c1' and not has_json": [3, 4, 5, 6],
        "abs(height - 60) <= 1": [9, 11],
    }
    for expr, keep in cases.items():
        excluded = ds.where(expr)
        assert excluded.dtype == np.int64
        got = ShardListDataset(index, transformations=[], exclude=excluded)
        assert _keys(got) == keep, expr
        assert sorted(set(range(N)) - set(excluded.tolist())) == keep


def test_where_adds_to_the_exclusion_already_there(index):
    ds = ShardListDataset(index, transformations=[], exclude=[3])
    excluded = ds.where("width < 500")
    assert _keys(ShardListDataset(index, transformations=[], exclude=excluded)) == [0, 1, 2, 4]


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "width.__class__",
        "width[0]",
        "(lambda: 1)()",
        "open('x')",
        "width if 1 else 2",
        "[x for x in width]",
        "width ** 2 > 1",
        "width is None",
        "f'{width}'",
        "width >= ",
        "1" + " + 1" * 600,
        "x" * 5000,
        "nosuch > 1",
        "caption + 1 > 2",
        "caption < 3",
        "caption",
        "abs(width, 1) > 0",
    ],
)
def test_where_refuses_what_is_not_in_the_language(index, expr):
    ds = ShardListDataset(index, transformations=[])
    with pytest.raises(ColumnError):
        ds.where(expr)


def test_where_numbers_beyond_int64_neither_crash_nor_wrap(index):
    """Review of issue 23: OverflowError from deep in numpy, int64 wrap-around, ``// 0`` = 0.

    Integer constants past int64 (or past float) are numbers like any other; integer
    arithmetic that would wrap is done in float64; ``//`` and ``%`` by zero give infinity or
    NaN as the page says (not 0).
    """
    ds = ShardListDataset(index, transformations=[])
    huge = "9" * 400
    assert ds.where("size_jpg * 99999999999999999999999999 > 0").tolist() == []
    assert ds.where("size_jpg + 9223372036854775807 > 0").tolist() == []
    assert ds.where("size_jpg - 9223372036854775807 - 1000 < 0").tolist() == []
    assert ds.where(f"size_jpg + {huge} > 0").tolist() == []
    assert ds.where(f"size_jpg < {huge} and size_jpg > -{huge}").tolist() == []
    assert ds.where(f"width < {huge}").tolist() == [7, 10]
    assert ds.where(f"width == {huge}").tolist() == list(range(N))
    kept = set(range(N)) - set(ds.where(f"size_jpg in (117, {huge})").tolist())
    assert kept == {17}
    assert ds.where("size_jpg // 0 > 1e300").tolist() == []
    assert ds.where("size_jpg % 0 >= 0").tolist() == list(range(N))


def test_where_a_bool_column_in_a_list_of_bools(index):
    """Review of issue 23: ``ok in (True,)`` kept nothing (bools were dropped from the list
    as not numbers), though ``ok == True`` kept the samples it should."""
    ds = ShardListDataset(index, transformations=[])

    def kept(expr: str) -> list[int]:
        return sorted(set(range(N)) - set(ds.where(expr).tolist()))

    evens = [i for i in range(N) if i % 2 == 0 and i != 10]  # sample 10 has no .json
    assert kept("ok in (True,)") == evens == kept("ok == True") == kept("ok not in [False]")
    assert kept("ok in (True, False)") == [i for i in range(N) if i != 10]


def test_unknown_column_and_no_index(index, tmp_path):
    ds = ShardListDataset(index, transformations=[])
    with pytest.raises(ColumnError, match="no column named 'depth'.*width"):
        ds.column("depth")
    with pytest.raises(ColumnError):
        ds.column("not a name")
    shard = str(Path(index).parent / "s-0.tar")
    with pytest.raises(ColumnError, match="no index"):
        ShardListDataset([{"url": shard, "nsamples": PER}]).column("width")


def test_an_index_without_columns_opens_and_reads_as_before(tmp_path):
    paths = write_shards(tmp_path)
    build_index(paths, str(tmp_path / "plain.json"))
    ds = ShardListDataset(str(tmp_path / "plain.json"), transformations=[])
    assert len(ds) == N and ds[4]["__key__"] == "000004"
    with pytest.raises(ColumnError, match="first shard has: none"):
        ds.column("width")


def test_a_damaged_stored_column_is_an_index_error_naming_the_shard(tmp_path):
    paths = write_shards(tmp_path)
    out = str(tmp_path / "train.json")
    build_index(paths, out)
    add_columns(out, ["json:width"])
    desc = json.loads(Path(out).read_text())
    # a JSON index keeps a shard's columns in its member sidecar, the description says so
    assert [e["wids_columns"] for e in desc["shardlist"]] == ["members"] * SHARDS
    sidecars = [tmp_path / e["members"] for e in desc["shardlist"]]
    texts = [p.read_text() for p in sidecars]
    col = json.loads(texts[1])["wids_columns"]["columns"]["width"]

    def damaged(k: int, change) -> None:
        for p, t in zip(sidecars, texts, strict=True):
            p.write_text(t)
        doc = json.loads(texts[k])
        change(doc)
        sidecars[k].write_text(json.dumps(doc))

    for damage in (
        {"dtype": "<i8", "data": "AAAA"},  # too few bytes
        {"dtype": "<U4"},  # not a column dtype
        {"type": "complex"},
        {"data": "not base64!"},
        {"nulls": "AAAAAAAAAAAAAAAAAAAAAAAA"},  # a mask longer than the shard
    ):
        damaged(1, lambda d, x=damage: d["wids_columns"]["columns"].update(width={**col, **x}))
        ds = ShardListDataset(out, transformations=[])
        assert len(ds) == N  # opening does not read columns
        with pytest.raises(IndexFormatError) as e:
            ds.column("width")
        assert "s-1.tar" in str(e.value), damage
    damaged(1, lambda d: d.pop("wids_columns"))
    with pytest.raises(IndexFormatError, match="no 'wids_columns'"):
        ShardListDataset(out, transformations=[]).column("width")
    damaged(2, lambda d: d.update(size=d["size"] + 512))  # a stale sidecar
    with pytest.raises(IndexFormatError, match="stale member table"):
        ShardListDataset(out, transformations=[]).column("width")
    damaged(0, lambda d: d["wids_columns"].update(version=2))
    with pytest.raises(ColumnError, match="newer wids"):
        ShardListDataset(out, transformations=[]).column("width")
    for p, t in zip(sidecars, texts, strict=True):
        p.write_text(t)
    assert ShardListDataset(out).column("width", missing=-1)[:3].tolist() == [0, 100, 200]


def test_a_newer_or_hostile_str_column_names_its_shard(tmp_path):
    """Review of issue 23: the version error said ``None: columns of version 2``, and a
    stored ``str`` column holding an object or an over-long string was a ``ColumnError``
    naming a sample but no shard (it is damage to the index: ``IndexFormatError``)."""
    paths = write_shards(tmp_path)
    out = str(tmp_path / "train.json")
    build_index(paths, out, columns=["json:caption"])
    desc = json.loads(Path(out).read_text())
    sidecar = tmp_path / desc["shardlist"][1]["members"]
    text = sidecar.read_text()

    def damaged(change) -> ShardListDataset:
        doc = json.loads(text)
        change(doc["wids_columns"])
        sidecar.write_text(json.dumps(doc))
        return ShardListDataset(out, transformations=[])

    with pytest.raises(ColumnError, match="s-1.tar.*newer wids"):
        damaged(lambda c: c.update(version=2)).column("caption")
    for value in ({"a": 1}, "x" * 5000, 3):
        ds = damaged(lambda c, v=value: c["columns"]["caption"]["values"].__setitem__(2, v))
        with pytest.raises(IndexFormatError, match="s-1.tar"):
            ds.column("caption")
        with pytest.raises(IndexFormatError, match="s-1.tar"):
            ds.where("caption == 'c0'")
    sidecar.write_text(text)
    assert ShardListDataset(out).column("caption")[:2].tolist() == ["c0", "c1"]


def test_the_documented_example_runs(tmp_path, monkeypatch, capsys):
    import shlex

    from wids.cli import main

    doc = (Path(__file__).resolve().parent.parent / "docs" / "columns.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/columns.md", "exec"), scope)
    assert len(scope["big"]) == 4
    shell = doc.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    for line in shell:
        argv = shlex.split(line)
        assert argv[0] == "wids"
        assert main(argv[1:]) == 0, line
    out = capsys.readouterr().out
    assert "(20 excluded)" in out
    # the subset's columns as its dataset sees them: the 4 samples its exclusion keeps
    assert "excluded 20 by big/scanned.widx.exclude (4 samples kept)" in out
    assert "column   width            int64    4 values, 0 missing, min 256, max 384" in out
    big = ShardListDataset("big/scanned.widx", transformations=[])
    assert [big[i]["__key__"] for i in range(len(big))] == ["000003", "000011", "000015", "000023"]


def test_a_pickled_dataset_reads_its_columns(index):
    """What a spawn or forkserver worker gets: the copy reads the same column."""
    import pickle

    ds = ShardListDataset(index, transformations=[], exclude=[2])
    assert len(ds) == N - 1
    copy = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(copy.column("width"), ds.column("width"), equal_nan=True)


def test_a_concatenation_has_its_parts_columns_aligned_with_its_samples(index, tmp_path):
    """Review of issue 23: ``ds1 + ds2`` had no ``column``, so ``keys="width"`` of the
    bucketing sampler refused it; its column is the parts' columns (after their exclusions)."""
    pytest.importorskip("torch")
    from wids import BucketBatchSampler

    a = ShardListDataset(index, transformations=[], exclude=[0, 7])
    b = ShardListDataset(index, transformations=[], exclude=a.where("width < 1000"))
    both = a + b
    width = both.column("width", missing=-1)
    assert len(width) == len(both) == len(a) + len(b)
    for i in range(len(both)):
        meta = _meta(int(both[i]["__key__"]))
        assert width[i] == (-1 if meta is None or "width" not in meta else meta["width"])
    assert both.column("size_jpg").dtype == np.int64
    with pytest.raises(ColumnError, match="no column named 'depth'"):
        both.column("depth")
    sampler = BucketBatchSampler(
        both, "size_jpg", batch_size=2, num_buckets=2, num_replicas=1, rank=0
    )
    batches = list(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(len(both)))
    with pytest.raises(ColumnError, match="part 1"):
        (a + list(range(3))).column("width")
