"""Exclusions (``ShardListDataset(exclude=...)``, ``wids subset --exclude``) over real tars."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shlex
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from tarfixtures import make_samples, write_shard

from wids import (
    ChunkedSampler,
    DistributedChunkedSampler,
    ExclusionError,
    IndexFormatError,
    OutputExistsError,
    ShardedSampler,
    ShardInfo,
    ShardListDataset,
    build_index,
    convert_index,
    write_index,
)
from wids.cli import main
from wids.subset import make_subset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler  # noqa: E402

SHARDS, PER = 4, 10  # keys 000000 .. 000039, shard k holds 10k .. 10k+9


def _keys(ds: ShardListDataset) -> list[str]:
    return [ds[i]["__key__"] for i in range(len(ds))]


def _as_list(batch):
    return batch


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, str, list[str]]:
    d = tmp_path_factory.mktemp("excl")
    # uneven last shard: no per-shard division in locate; a sub-directory for shard/key names
    paths = []
    (d / "part").mkdir()
    for k in range(SHARDS):
        n = PER if k < SHARDS - 1 else PER - 3
        members = make_samples(n, start=PER * k, fields=(".cls", ".txt"))
        paths.append(str(write_shard(d / "part" / f"s-{k}.tar", members, format="pax")))
    index = str(d / "train.json")
    build_index(paths, index, name="train")
    keys = [f"{PER * k + j:06d}" for k in range(SHARDS) for j in range(PER)][: SHARDS * PER - 3]
    return d, index, keys


# shard 0: sample numbers 0 and 5; shard 1: key 000012; shard 3 by pair (path and basename)
EXCLUDE = [0, 5, "000012", "part/s-3.tar/000031", ("s-3.tar", "000036"), "s-2.tar\t000029"]
GONE = {"000000", "000005", "000012", "000031", "000036", "000029"}


def test_every_form_leaves_exactly_those_samples_out(data):
    _, index, keys = data
    ds = ShardListDataset(index, transformations=[], exclude=EXCLUDE)
    kept = [k for k in keys if k not in GONE]
    assert len(ds) == ds.total_length == len(kept)
    assert _keys(ds) == kept
    assert ds.lengths == [8, 9, 9, 5]
    assert ds.cum_lengths.tolist() == [8, 17, 26, 31]
    assert [(c.start, c.stop) for c in ds.components] == [(0, 31)]
    assert ds[-1]["__key__"] == kept[-1] and ds[-1]["__index__"] == len(kept) - 1
    batch = [0, 7, 8, 30]
    assert [s["__key__"] for s in ds.__getitems__(batch)] == [kept[i] for i in batch]
    with pytest.raises(IndexError):
        ds[len(kept)]


def test_a_file_of_entries_with_comments_and_blank_lines(data, tmp_path):
    _, index, keys = data
    f = tmp_path / "takedown.txt"
    f.write_text("# takedown list\n\n000012\r\npart/s-3.tar/000031\ns-2.tar\t000029\n  \n")
    ds = ShardListDataset(index, transformations=[], exclude=f)
    assert _keys(ds) == [k for k in keys if k not in {"000012", "000031", "000029"}]


def test_numbers_alone_read_no_member_table_and_are_cheap(data):
    _, index, keys = data
    ds = ShardListDataset(index, transformations=[], exclude=np.array([39 - 3, 3, 3, 10]))
    assert len(ds) == len(keys) - 3
    assert ds[3]["__key__"] == "000004" and ds[9]["__key__"] == "000011"


def test_unknown_entries_warn_with_a_count_or_are_refused(data):
    _, index, keys = data
    ds = ShardListDataset(index, transformations=[], exclude=["000001", "nokey", 10**9, "x.tar/1"])
    with pytest.warns(UserWarning, match="3 of 4 entries name no sample"):
        assert len(ds) == len(keys) - 1
    ds = ShardListDataset(index, exclude=[2**70, 2**71, -1, 1])  # no int64 holds the first two
    with pytest.warns(UserWarning, match="3 of 4 entries name no sample"):
        assert len(ds) == len(keys) - 1
    strict = ShardListDataset(index, exclude=["000001", "nokey"], exclude_strict=True)
    for _ in range(2):  # refused again, never skipped after the first refusal
        with pytest.raises(ExclusionError, match="1 of 2 entries"):
            len(strict)
    with pytest.raises(ExclusionError, match="not a key"):
        ShardListDataset(index, exclude=[1.5])
    with pytest.raises(TypeError):
        ShardListDataset(index, exclude=3)


def test_a_shard_name_matching_two_shards_is_refused(tmp_path):
    paths = []
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        paths.append(str(write_shard(tmp_path / sub / "s.tar", make_samples(3, fields=(".cls",)))))
    build_index(paths, str(tmp_path / "i.json"))
    ds = ShardListDataset(str(tmp_path / "i.json"), exclude=["s.tar/000001"])
    with pytest.raises(ExclusionError, match="names 2 shards"):
        len(ds)
    ds = ShardListDataset(str(tmp_path / "i.json"), transformations=[], exclude=["b/s.tar/000001"])
    assert len(ds) == 5 and ds[4]["__shard__"].endswith("b/s.tar")


def test_every_sampler_sees_only_kept_samples(data):
    _, index, keys = data
    ds = ShardListDataset(index, transformations=[], exclude=EXCLUDE)
    n = len(ds)
    for sampler in (
        ChunkedSampler(ds, chunksize=4),
        ShardedSampler(ds),
        RandomSampler(ds),
        SequentialSampler(ds),
    ):
        order = list(sampler)
        assert sorted(order) == list(range(n)), type(sampler).__name__
    per_rank = []
    for rank in range(3):
        s = DistributedChunkedSampler(ds, num_replicas=3, rank=rank, chunksize=4)
        got = list(s)
        assert len(got) == len(s) == -(-n // 3)  # exact, equal on every rank (padded)
        per_rank += got
    assert set(per_rank) == set(range(n))
    assert not GONE & {ds[i]["__key__"] for i in per_rank}


@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_read_the_same_kept_samples(data, ctx):
    _, index, keys = data
    ds = ShardListDataset(index, transformations=[], exclude=EXCLUDE)
    kept = [k for k in keys if k not in GONE]
    loader = DataLoader(
        ds,
        batch_size=5,
        num_workers=2,
        multiprocessing_context=ctx,
        collate_fn=_as_list,
        sampler=ChunkedSampler(ds, chunksize=5, seed=1),
    )
    got = {s["__index__"]: s["__key__"] for batch in loader for s in batch}
    assert got == dict(enumerate(kept))


def test_a_pickled_dataset_keeps_the_exclusion_without_the_file(data, tmp_path):
    _, index, keys = data
    f = tmp_path / "x.txt"
    f.write_text("000012\n")
    ds = ShardListDataset(index, transformations=[], exclude=f)
    f.unlink()  # parsed when the dataset was made: workers never read the file
    copy = pickle.loads(pickle.dumps(ds))
    assert _keys(copy) == [k for k in keys if k != "000012"]
    len(ds)  # resolved before pickling too
    assert _keys(pickle.loads(pickle.dumps(ds))) == _keys(copy)


def test_a_shard_pattern_dataset_excludes_by_key(data):
    d, _, keys = data
    ds = ShardListDataset(str(d / "part" / "s-{0..3}.tar"), transformations=[], exclude=["000039"])
    assert "000039" not in keys  # the last shard is short
    ds = ShardListDataset(str(d / "part" / "s-{0..3}.tar"), transformations=[], exclude=["000001"])
    assert _keys(ds) == keys[:1] + keys[2:]


def _digest(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.tar"))}


def test_subset_exclude_writes_an_index_that_opens_without_exclude(data, tmp_path, capsys):
    d, index, keys = data
    before = _digest(d)
    ex = tmp_path / "keys.txt"
    ex.write_text("# takedown\n000012\ns-2.tar/000029\n000001\n")
    nums = tmp_path / "nums.txt"
    nums.write_text("25\n")
    to = tmp_path / "sub"
    argv = ["subset", index, "--shards", "1:3", "--to", str(to), "-q", "--exclude", str(ex)]
    with pytest.warns(UserWarning, match="1 of 4 entries name no sample of the subset"):
        assert main([*argv, "--exclude-samples", str(nums)]) == 0
    assert "(3 excluded)" in capsys.readouterr().out
    sub = ShardListDataset(str(to / "train.json"), transformations=[])
    kept = [k for k in keys[10:30] if k not in {"000012", "000029", "000025"}]
    assert _keys(sub) == kept and sub.lengths == [9, 8]
    assert (to / "train.json.exclude").read_text().startswith("# wids-exclude 1")
    assert _digest(d) == before  # no source shard touched
    # wids show reads the subset as the dataset does: the kept samples only
    assert main(["show", str(to / "train.json"), "-n", "100"]) == 0
    shown = [ln.split()[1] for ln in capsys.readouterr().out.splitlines()[1:]]
    assert shown == kept
    # exclude= adds to the recorded exclusion
    more = ShardListDataset(str(to / "train.json"), transformations=[], exclude=["000010"])
    assert _keys(more) == kept[1:]
    # a second run into the same place is refused, then replaces it with force
    assert main(argv) != 0 and "already holds" in capsys.readouterr().err
    assert main([*argv[:-2], "--force"]) == 0  # no --exclude: the old file must not apply
    assert _keys(ShardListDataset(str(to / "train.json"), transformations=[])) == keys[10:30]
    with pytest.raises(ExclusionError, match="1 of 3 entries"):
        make_subset(index, to, shards=slice(1, 3), exclude=ex, exclude_strict=True, force=True)
    # a file of the exclusion's name that this subset did not write is never replaced
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "train.json.exclude").write_text("mine")
    with pytest.raises(OutputExistsError, match="exclude"):
        make_subset(index, lone, shards=slice(1, 3), exclude=ex)
    assert sorted(os.listdir(lone)) == ["train.json.exclude"]


def test_the_documented_example_runs(tmp_path, monkeypatch):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "exclusions.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/exclusions.md", "exec"), scope)
    assert len(scope["ds"]) == 27
    # the page's shell example: a subset that records the exclusion, opened without exclude=
    shell = doc.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    argv = shlex.split(shell[0])
    assert argv[:2] == ["wids", "subset"]
    with pytest.warns(UserWarning, match="1 of 3 entries"):
        assert main(argv[1:]) == 0
    assert len(ShardListDataset("small/train.json")) == 18


@pytest.mark.slow
def test_bench_exclude_runs_tiny(tmp_path):
    bench = Path(__file__).resolve().parent.parent / "tools" / "bench_exclude.py"
    env = {**os.environ, "PYTHONPATH": str(bench.parent.parent)}
    argv = [sys.executable, str(bench), "--shards", "40", "--samples", "50", "--exclude", "300"]
    argv += ["--formats", "sqlite,json"]  # and 1000 pairs: 25 of the real shard's samples
    r = subprocess.run(
        [*argv, "--dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    # the tool checks each run read the expected kept sample; lengths add up
    assert rows["none"]["samples"] == 2000 and rows["none"]["excluded"] == 0
    assert rows["array"]["samples"] == 2000 - rows["array"]["excluded"] > 2000 - 300
    assert rows["list"]["samples"] == rows["array"]["samples"]
    assert "goals (array)" in r.stdout
    for fmt in ("", "-sqlite", "-json"):
        assert rows[f"pairs{fmt}"]["excluded"] == 25 and rows[f"pairs{fmt}"]["samples"] == 1975


def test_a_subset_of_a_subset_keeps_the_exclusion_recorded_beside_its_index(data, tmp_path):
    """Review of issue 23: the source's ``.exclude`` was dropped, so excluded samples came back.

    A subset taken from an index that opens with an exclusion (``P.exclude``) must leave out
    the same samples the dataset leaves out, with or without ``--exclude``/``--where`` of its
    own, and take from that file only the samples of the shards it copies (no warning for the
    others).
    """
    import warnings

    d, index, keys = data
    first = tmp_path / "first"
    make_subset(index, first, shards=slice(0, 3), exclude=["000003", "000015", "000025"])
    inner = str(first / "train.json")
    assert "000015" not in _keys(ShardListDataset(inner, transformations=[]))
    again = tmp_path / "again"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = make_subset(inner, again, shards=slice(1, 3))
    assert report.excluded == 2
    got = _keys(ShardListDataset(str(again / "train.json"), transformations=[]))
    assert got == [k for k in keys[10:30] if k not in {"000015", "000025"}]
    more = tmp_path / "more"
    make_subset(inner, more, shards=slice(1, 3), exclude=["000011"])
    got = _keys(ShardListDataset(str(more / "train.json"), transformations=[]))
    assert got == [k for k in keys[10:30] if k not in {"000011", "000015", "000025"}]


# -- shard/key pairs against every backend: only the shards a name can match are looked at --

BACKENDS = ("json", "sqlite", "widx")


@pytest.fixture(scope="module")
def named(tmp_path_factory) -> tuple[Path, dict[str, str], list[str]]:
    """Shards part/s-0..3.tar and other/s-1.tar (two s-1.tar), indexed in every backend."""
    d = tmp_path_factory.mktemp("named")
    paths = []
    for sub, k in [("part", 0), ("part", 1), ("other", 1), ("part", 2), ("part", 3)]:
        (d / sub).mkdir(exist_ok=True)
        start = PER * k + (100 if sub == "other" else 0)
        members = make_samples(PER, start=start, fields=(".cls",))
        paths.append(str(write_shard(d / sub / f"s-{k}.tar", members, format="gnu")))
    build_index(paths, str(d / "i.json"), name="n")
    indexes = {"json": str(d / "i.json")}
    for backend in BACKENDS[1:]:
        indexes[backend] = str(d / f"i.{backend}")
        convert_index(indexes["json"], indexes[backend])
    keys = [ShardListDataset(indexes["json"], transformations=[])[i]["__key__"] for i in range(50)]
    return d, indexes, keys


def _pairs(d: Path) -> list:
    """Pairs that hit by each accepted name, repeat, and miss (shard or key)."""
    return [
        "part/s-0.tar/000001",  # a trailing part
        "s-0.tar\t000002",  # the basename, tab form
        (str(d / "part" / "s-2.tar"), "000021"),  # the path as the index resolves it
        "./part/s-2.tar/000022",  # ./ and the os separator are normalised
        ("part/s-3.tar", "000031"),
        ("part/s-3.tar", "000031"),  # repeated
        "s-3.tar/000031",  # the same sample by another name
        "s-3.tar/000032",
        "other/s-1.tar/000111",
        "part/s-1.tar/000011",
        "nope.tar/000001",  # no such shard
        "art/s-0.tar/000003",  # not a trailing part at a '/'
        "part/s-0.tar/999999",  # no such key
        str(d / "part" / "s-0.tar") + "x/000004",
        "000035",  # a bare key
        4,  # a sample number
    ]


def _old_resolution(index: str, entries: list) -> tuple[list[int], int]:
    """What a pass over every shard's record gives (resolve without ``among``)."""
    from wids.dataset import parse_exclude, resolve
    from wids.index import open_index

    reader = open_index(index)
    spec = parse_exclude(entries)
    assert spec is not None
    starts = np.concatenate([[0], np.cumsum([s.nsamples for s in reader.shards])])
    excluded, unknown = resolve(spec, starts, lambda k: reader.shards[k].url, reader.members)
    return excluded.tolist(), unknown


@pytest.mark.parametrize("backend", BACKENDS)
def test_pairs_resolve_as_a_pass_over_every_shard_did(named, backend):
    d, indexes, keys = named
    entries = _pairs(d)
    want, unknown = _old_resolution(indexes[backend], entries)
    gone = {"000001", "000002", "000021", "000022", "000031", "000032", "000111", "000011"}
    assert sorted(keys.index(k) for k in gone | {"000035", keys[4]}) == want and unknown == 4
    with pytest.warns(UserWarning, match=f"{unknown} of 15 entries name no sample"):
        ds = ShardListDataset(indexes[backend], transformations=[], exclude=entries)
        kept = _keys(ds)
    assert sorted(keys.index(k) for k in set(keys) - set(kept)) == want
    assert ds.lengths == [7, 9, 9, 8, 7]
    with pytest.raises(ExclusionError, match="4 of 15 entries"):
        len(ShardListDataset(indexes[backend], exclude=entries, exclude_strict=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_name_matching_two_shards_is_refused_in_every_backend(named, backend):
    _, indexes, _ = named
    for name in ("s-1.tar", "./s-1.tar"):
        with pytest.raises(ExclusionError, match="names 2 shards"):
            len(ShardListDataset(indexes[backend], exclude=[(name, "000011")]))


def _many_shards(tmp_path: Path, backend: str, n: int, real: int) -> str:
    """An index of ``n`` shards: ``real`` is a real tar; the others' records are unreadable.

    Every other shard's URL holds a NUL byte (written into the file after it was published):
    reading any of their records raises, so an exclusion that opens only reads the records
    of the shards its names can match.
    """
    from wids.index import open_index

    (tmp_path / "real").mkdir()
    path = write_shard(tmp_path / "real" / f"s-{real:07d}.tar", make_samples(PER, fields=(".cls",)))
    build_index([str(path)], str(tmp_path / "one.json"))
    one = open_index(str(tmp_path / "one.json"))
    out = tmp_path / f"many.{backend}"
    with write_index(out, name="many") as writer:
        for k in range(n):
            if k == real:
                info = one.shards[0]
                writer.add(ShardInfo(f"real/s-{k:07d}.tar", PER, info.size), one.members(0))
            else:
                writer.add(ShardInfo(f"fake/s-{k:07d}.tar", PER), None)
    if backend == "sqlite":
        with closing(sqlite3.connect(out)) as db, db:
            nul = "'fa' || char(0) || substr(url, 4)"  # fake/ -> fa<NUL>e/
            db.execute(f"UPDATE shards SET url = {nul} WHERE url LIKE 'fake/%' AND id > 0")
    else:
        data = out.read_bytes()
        head = data.index(b"fake/s-0000001.tar")  # shard 0 stays readable: opening reads it
        out.write_bytes(data[:head] + data[head:].replace(b"fake/", b"fa\x00e/"))
    return str(out)


@pytest.mark.parametrize("backend", ["sqlite", "widx"])
def test_pairs_over_many_shards_read_only_the_named_shards_records(tmp_path, backend):
    from wids.index import open_index

    n, real = 10_000, 5_000
    index = _many_shards(tmp_path, backend, n, real)
    with pytest.raises(IndexFormatError, match="shard 1|shards row 1"):
        open_index(index).shard(1)  # every other record is unreadable ...
    # ... yet the exclusion resolves: a pass over every record would have raised at shard 1
    ds = ShardListDataset(index, transformations=[], exclude=[f"s-{real:07d}.tar/000003"])
    assert len(ds) == n * PER - 1
    got = [ds[real * PER + j]["__key__"] for j in range(PER - 1)]
    assert got == [f"{j:06d}" for j in range(PER) if j != 3]
    with pytest.raises(IndexFormatError, match="shard 4|shards row 4"):  # a named one is read
        len(ShardListDataset(index, exclude=["s-0000004.tar/000003"]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_pairs_name_shards_as_a_url_map_renames_them(named, backend, tmp_path):
    d, indexes, keys = named
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for k in range(4):  # the mirror names part/s-K.tar t-K.tar
        (mirror / f"t-{k}.tar").write_bytes((d / "part" / f"s-{k}.tar").read_bytes())
    renaming = {str(d / "part" / "s-"): str(mirror / "t-")}  # a prefix not ending in '/'
    entries = ["t-0.tar/000001", ("t-2.tar", "000021"), "s-3.tar/000031", "mirror/t-3.tar/000032"]
    with pytest.warns(UserWarning, match="1 of 4 entries"):  # s-3.tar: no shard is named so
        ds = ShardListDataset(
            indexes[backend], transformations=[], url_map=renaming, exclude=entries
        )
        assert ds.lengths == [9, 10, 10, 9, 9]
    assert ds[0]["__shard__"] == str(mirror / "t-0.tar")
    assert {"000001", "000021", "000032"}.isdisjoint(_keys(ds))
    keeps = {str(d / "part") + "/": str(mirror) + "/"}  # no renaming: ends in '/'
    with pytest.warns(UserWarning, match="3 of 4 entries"):  # s-3.tar (now mirror/s-3.tar) only
        ds = ShardListDataset(indexes[backend], transformations=[], url_map=keeps, exclude=entries)
        assert ds.lengths == [10, 10, 10, 10, 9]
