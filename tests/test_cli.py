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


# ------------------------------------------------------------------ version, locks, umask


def test_version_flag_and_attribute_come_from_package_metadata():
    from importlib.metadata import version

    import wids

    assert wids.__version__ == version("wids-shards")
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"wids {wids.__version__}"


def _run_umask(umask: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wids", *args],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(umask),
    )


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_index_files_get_the_umask_and_no_lock_file_is_left(shards, tmp_path, umask):
    out = tmp_path / "out"
    out.mkdir()
    r = _run_umask(umask, "index", "create", *shards, "-o", str(out / "i.json"), "-q")
    assert r.returncode == 0, r.stderr
    r = _run_umask(umask, "index", "create", *shards, "-o", str(out / "i.sqlite"), "-q")
    assert r.returncode == 0, r.stderr
    r = _run_umask(umask, "index", "convert", str(out / "i.sqlite"), str(out / "c.json"))
    assert r.returncode == 0, r.stderr
    made = [p for p in out.rglob("*") if p.is_file()]
    assert len(made) == 2 + 3 + 1 + 3  # two descriptions and their sidecars, one database
    for p in made:
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask, p
    assert not [p for p in out.rglob("*") if p.name.endswith((".lock", ".tmp"))]


# ------------------------------------------------------------------------------- secrets

SECRET_USER, SECRET_PASS, SECRET_SIG = "alice", "HUNTER2pw", "SIGabcdef0123"


def test_index_info_and_errors_never_print_credentials(http_server, shards, tmp_path):
    import shutil

    from wids.build import build_index

    d = tmp_path / "served"
    d.mkdir()
    for p in shards:
        shutil.copy(p, d)
    build_index([str(d / os.path.basename(p)) for p in shards], str(d / "sec.json"))
    for p in d.rglob("*"):
        if p.is_file():
            http_server.put(p, str(p.relative_to(d)))
    plain = http_server.url("sec.json")
    secret = plain.replace("http://", f"http://{SECRET_USER}:{SECRET_PASS}@")
    secret += f"?X-Amz-Signature={SECRET_SIG}&X-Amz-Credential=AKIA%2F2024&v=1"
    runs = [
        run("index", "info", secret),
        run("index", "info", secret, "--json"),
        run("--debug", "index", "info", secret),
        run("index", "info", secret.replace("sec.json", "missing.json")),
        run("--debug", "index", "info", secret.replace("sec.json", "missing.json")),
    ]
    assert [r.returncode for r in runs] == [0, 0, 0, 2, 2]
    assert "samples  60" in runs[0].stdout and "fsspec" in runs[2].stderr
    for r in runs:
        for s in (SECRET_PASS, SECRET_SIG, "AKIA"):
            assert s not in r.stdout + r.stderr, (s, r.args)
    assert json.loads(runs[1].stdout)["index"] == f"{plain}?v=1"


def test_debug_logs_of_s3_libraries_are_redacted(s3_server, shards, tmp_path):
    key, secret = "AKIAWIDSTESTKEY", "wIdSsUpErSeCrEtVaLuE"
    url = s3_server.put(shards[0], "secret-logs/a.tar")
    endpoint = s3_server.storage_options["client_kwargs"]["endpoint_url"]
    r = run(
        "--debug",
        "index",
        "create",
        url,
        "-o",
        str(tmp_path / "i.json"),
        "-q",
        *("-s", f"key={key}", "-s", f"secret={secret}"),
        *(
            "-s",
            f"client_kwargs.endpoint_url={endpoint}",
            "-s",
            "client_kwargs.region_name=us-east-1",
        ),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "botocore" in r.stderr and "Authorization': ***" in r.stderr  # logs were there
    for s in (key, secret):
        assert s not in r.stdout + r.stderr
    assert "Signature=" not in r.stderr.replace("Signature=***", "")
