"""The JSON index we write loads in the reference wids (webdataset 0.2.111), unchanged.

The reference's import name ``wids`` collides with ours, so it runs in its own venv
(``$TMPDIR/wids-refvenv``, with ``torch==2.13.0`` and ``webdataset==0.2.111``) in a subprocess
started with ``-I`` (no current directory or user site on its path).

An existing venv is used whenever it works. Creating one takes minutes and needs the package
index, so it happens only when slow tests are selected (``pytest -m slow``); otherwise, or if
creating it fails, the tests skip with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from indexcontract import shard_info, tar_table
from tarfixtures import make_samples, write_shard

from wids import JsonIndexWriter, SqliteIndexWriter, convert_index

pytestmark = pytest.mark.slow

REF_VENV = Path(tempfile.gettempdir()) / "wids-refvenv"
REF_PACKAGES = ("torch==2.13.0", "webdataset==0.2.111")

_PROBE = "import torch, wids, wids.wids_specs; print(wids.__file__)"

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


def _works(python: Path) -> bool:
    if not python.exists():
        return False
    r = subprocess.run(
        [str(python), "-I", "-c", _PROBE], capture_output=True, text=True, cwd=tempfile.gettempdir()
    )
    return r.returncode == 0 and str(REF_VENV) in r.stdout


def _create_venv() -> str | None:
    """Create the venv (once, under a lock); return why it failed, or None."""
    from wids.lock import FileLock

    python = REF_VENV / "bin" / "python"
    with FileLock(str(REF_VENV) + ".lock", timeout=3600):
        if _works(python):
            return None
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(REF_VENV)],
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *REF_PACKAGES,
            ],
        ]
        for cmd in steps:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"{cmd[:3]}: {e}"
            if r.returncode != 0:
                return f"{' '.join(cmd[:4])} failed: {r.stderr.strip()[-500:]}"
    return None if _works(python) else "the venv does not import the reference wids"


@pytest.fixture(scope="module")
def ref_python(request: pytest.FixtureRequest) -> str:
    python = REF_VENV / "bin" / "python"
    if not _works(python):
        if "slow" not in (request.config.getoption("markexpr") or ""):
            pytest.skip(f"no reference venv at {REF_VENV}; run with -m slow to create it")
        why = _create_venv()
        if why is not None:
            pytest.skip(f"cannot make the reference venv: {why}")
    return str(python)


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
