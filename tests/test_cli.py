from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from wids.cli import build_parser, main, parse_storage_options
from wids.synth import write_dataset


def run(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wids", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    return write_dataset(str(d), shards=3, samples_per_shard=20, real_images=False, jpg_bytes=500)


def _subcommand_paths(parser, prefix=()):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield from _subcommand_paths(sub, (*prefix, name))
            return
    yield prefix


def test_every_subcommand_has_help_with_an_example():
    paths = list(_subcommand_paths(build_parser()))
    assert ("index", "create") in paths
    for path in paths:
        out = run(*path, "--help")
        assert out.returncode == 0, out.stderr
        assert "example" in out.stdout, f"wids {' '.join(path)} --help has no example"


def test_index_create_info_verify_convert(shards, tmp_path):
    d = os.path.dirname(shards[0])
    out = str(tmp_path / "i.json")
    r = run("index", "create", os.path.join(d, "synth-{000000..000002}.tar"), "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    assert "3 shards, 60 samples" in r.stdout
    info = json.loads(run("index", "info", out, "--json").stdout)
    assert info["shards"] == 3 and info["samples"] == 60
    assert info["fields"] == {".cls": 60, ".jpg": 60, ".json": 60}
    assert run("index", "verify", out, "--deep").returncode == 0
    db = str(tmp_path / "i.sqlite")
    assert run("index", "convert", out, db).returncode == 0, "convert failed"
    assert json.loads(run("index", "info", db, "--json").stdout)["fields"] == info["fields"]


def test_verify_reports_a_changed_shard(shards, tmp_path):
    import shutil

    local = [shutil.copy(p, tmp_path) for p in shards]
    out = str(tmp_path / "i.json")
    assert main(["index", "create", *local, "-o", out, "-q"]) == 0
    with open(local[1], "ab") as f:
        f.write(b"\0" * 512)
    r = run("index", "verify", out)
    assert r.returncode == 1
    assert "CHANGED" in r.stdout and os.path.basename(local[1]) in r.stdout


def test_errors_are_one_line_without_traceback(tmp_path):
    r = run("index", "create", str(tmp_path / "missing.tar"), "-o", str(tmp_path / "x.json"))
    assert r.returncode == 2
    assert r.stderr.startswith("wids: error:") and "Traceback" not in r.stderr
    assert "missing.tar" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run(
        "--debug", "index", "create", str(tmp_path / "missing.tar"), "-o", str(tmp_path / "x.json")
    )
    assert "Traceback" in r.stderr


def test_storage_options_parse_json_values_and_nest():
    got = parse_storage_options(
        ["anon=true", "client_kwargs.endpoint_url=http://127.0.0.1:9", "key=abc"]
    )
    assert got == {
        "anon": True,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "key": "abc",
    }
