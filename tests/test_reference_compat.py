"""The JSON index we write loads in the reference wids (webdataset 0.2.111), unchanged.

The reference's import name ``wids`` collides with ours, so it runs in its own venv
(``$WIDS_REFERENCE_PYTHON``, see ``tests/reference.py``; ``tools/test.sh`` makes it) in a
subprocess started with ``-I`` (no current directory or user site on its path). Without the
variable these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from indexcontract import shard_info, tar_table
from reference import reference_python
from tarfixtures import make_samples, write_shard

from wids import JsonIndexWriter, SqliteIndexWriter, convert_index

pytestmark = pytest.mark.slow

_READ = r"""
import json, os, sys
import wids
results = []
for job in json.loads(sys.argv[1]):
    os.chdir(job["cwd"])
    ds = wids.ShardListDataset(job["index"], cache_dir=job["cache"], transformations=[])
    samples = []
    for i in job["picks"]:
        s = ds[i]
        samples.append({
            "key": s["__key__"],
            "fields": sorted(k for k in s if not k.startswith("__")),
            "cls": s[".cls"].read().decode() if ".cls" in s else None,
            "shard": s["__shard__"],
        })
    results.append({
        "len": int(len(ds)),
        "lengths": [int(x) for x in ds.lengths],
        "name": ds.spec.get("name"),
        "urls": [sh["url"] for sh in ds.shards],
        "samples": samples,
    })
print("RESULT " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def ref_python() -> str:
    return reference_python()


def run_reference(python: str, jobs: list[dict]) -> list[dict]:
    """Load each ``{"index", "picks", "cwd"}`` in one reference process (torch imports once)."""
    for job in jobs:
        job.setdefault("cache", os.path.join(job["cwd"], "ref-cache"))
    r = subprocess.run(
        [python, "-I", "-c", _READ, json.dumps(jobs)],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def make_shards(d: Path) -> list[Path]:
    d.mkdir(parents=True)
    return [
        write_shard(d / "a-000.tar", make_samples(7, start=0), format="gnu"),
        write_shard(d / "a-001.tar", make_samples(5, start=7, prefix="sub/dir/"), format="pax"),
        write_shard(d / "a-002.tar", make_samples(3, start=12), format="ustar"),
    ]


def write_json_index(path: Path, shards: list[Path], *, components: bool = False) -> None:
    with JsonIndexWriter(path, name="compat") as w:
        for i, p in enumerate(shards):
            if components and i == 2:
                w.start_component("tail", 0.5)
            table = tar_table(p)
            w.add(shard_info(p, path.parent, table), table)
        w.set_report({"shards": len(shards)})


@pytest.fixture(scope="module")
def loaded(ref_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three indexes written by us, and what the reference made of each."""
    root = tmp_path_factory.mktemp("refcompat")
    d = root / "ds"
    shards = make_shards(d)
    plain = d / "compat.json"
    write_json_index(plain, shards)
    sqlite_path = d / "compat.sqlite"
    with SqliteIndexWriter(sqlite_path, name="compat") as w:
        for p in shards:
            table = tar_table(p)
            w.add(shard_info(p, d, table), table)
    converted = root / "elsewhere" / "converted.json"
    converted.parent.mkdir()
    convert_index(str(sqlite_path), converted)
    mixed = d / "mixed.json"
    write_json_index(mixed, shards, components=True)
    jobs = [
        {"index": str(plain), "picks": [0, 6, 7, 11, 12, 14], "cwd": str(root)},
        {"index": str(converted), "picks": [3, 13], "cwd": str(root)},
        # The reference resolves inline sub-dataset URLs against the current directory, not
        # the file's: run it from the index's directory so that its reads work at all.
        {"index": str(mixed), "picks": [0, 12], "cwd": str(d)},
    ]
    plain_r, converted_r, mixed_r = run_reference(ref_python, jobs)
    return {"shards": shards, "plain": plain_r, "converted": converted_r, "mixed": mixed_r}


def test_reference_loads_our_json_index(loaded: dict) -> None:
    got = loaded["plain"]
    assert got["len"] == 15 and got["lengths"] == [7, 5, 3]
    assert got["name"] == "compat"
    assert got["urls"] == [str(p) for p in loaded["shards"]]
    keys = [s["key"] for s in got["samples"]]
    assert keys == ["000000", "000006", "sub/dir/000007", "sub/dir/000011", "000012", "000014"]
    assert [s["cls"] for s in got["samples"]] == ["0", "6", "7", "11", "12", "14"]
    assert all(s["fields"] == [".cls", ".jpg", ".json"] for s in got["samples"])


def test_reference_loads_a_converted_sqlite_index(loaded: dict) -> None:
    got = loaded["converted"]
    assert got["lengths"] == [7, 5, 3]
    assert got["urls"] == [str(p) for p in loaded["shards"]]  # absolute: outside its directory
    assert [s["cls"] for s in got["samples"]] == ["3", "13"]


def test_reference_loads_an_index_with_sub_datasets(loaded: dict) -> None:
    got = loaded["mixed"]
    assert got["len"] == 15 and got["lengths"] == [7, 5, 3]
    assert [s["cls"] for s in got["samples"]] == ["0", "12"]
    assert os.path.basename(got["samples"][1]["shard"]) == "a-002.tar"
