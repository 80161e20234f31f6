from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from wids.cli import build_parser, main
from wids.cli.options import parse_storage_options
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
    table = str(tmp_path / "i.widx")
    assert run("index", "convert", db, "-o", table).returncode == 0, "convert -o failed"
    assert json.loads(run("index", "info", table, "--json").stdout)["fields"] == info["fields"]
    assert run("index", "verify", table, "--deep").returncode == 0
    assert run("index", "convert", db, table, "-o", table).returncode != 0


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


@pytest.mark.slow
def test_index_info_and_errors_never_print_credentials(http_server, shards, tmp_path):
    import shutil

    from wids import build_index

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
    # --debug turns the libraries' logs on (fsspec is no longer imported where plain HTTP
    # connections read the index: asyncio's are the ones here)
    assert "samples  60" in runs[0].stdout and "wids: DEBUG: asyncio" in runs[2].stderr
    for r in runs:
        for s in (SECRET_PASS, SECRET_SIG, "AKIA"):
            assert s not in r.stdout + r.stderr, (s, r.args)
    assert json.loads(runs[1].stdout)["index"] == f"{plain}?v=1"


@pytest.mark.parametrize("transport", ["fsspec", "auto"])  # auto: obstore (no botocore logs)
def test_debug_logs_of_s3_libraries_are_redacted(s3_server, shards, tmp_path, transport):
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
        *("-s", f"transport={transport}"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    if transport == "fsspec":
        assert "botocore" in r.stderr and "Authorization': ***" in r.stderr  # logs were there
    for s in (key, secret):
        assert s not in r.stdout + r.stderr
    assert "Signature=" not in r.stderr.replace("Signature=***", "")


# ----------------------------------------------------------------- where the index goes


def _so_flags(options: dict, prefix: str = "") -> list[str]:
    flags: list[str] = []
    for k, v in options.items():
        if isinstance(v, dict):
            flags += _so_flags(v, f"{prefix}{k}.")
        else:
            flags += ["-s", f"{prefix}{k}={v}"]
    return flags


def _raw_samples(url: str, storage_options: dict | None = None) -> list[dict]:
    from wids import ShardListDataset

    ds = ShardListDataset(url, transformations=[], storage_options=storage_options)
    try:
        return [
            {k: v for k, v in ds[i].items() if k.startswith(".") or k == "__key__"}
            for i in range(len(ds))
        ]
    finally:
        ds.close()


def test_index_create_and_convert_write_to_s3(s3_server, shards, tmp_path):
    """-o s3://... uploads the index (sidecars, then description); it reads back right."""
    for p in shards:
        s3_server.put(p, f"out/{os.path.basename(p)}")
    pattern = s3_server.url("out/synth-{000000..000002}.tar")
    so = _so_flags(s3_server.storage_options)
    out = s3_server.url("out/train.json")
    r = run("index", "create", pattern, "-o", out, "-q", *so, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(out) and "3 shards, 60 samples" in r.stdout
    assert os.listdir(tmp_path) == []  # no local folder named "s3:"
    fs = s3_server.fs
    fs.invalidate_cache()
    desc = json.loads(fs.cat_file(out))
    assert [s["url"] for s in desc["shardlist"]] == [os.path.basename(p) for p in shards]
    assert len(fs.ls(s3_server.url("out/train.members"))) == 3
    assert not [p for p in fs.find(s3_server.url("out")) if p.endswith((".tmp", ".lock"))]

    local = str(tmp_path / "local.json")
    assert run("index", "create", *shards, "-o", local, "-q").returncode == 0
    expected = _raw_samples(local)
    assert _raw_samples(out, s3_server.storage_options) == expected

    again = run("index", "create", pattern, "-o", out, "-q", *so)
    assert again.returncode == 0 and "(0 scanned, 3 unchanged)" in again.stdout, again.stdout

    db = s3_server.url("out/train.sqlite")
    r = run("index", "create", pattern, "-o", db, "-q", *so)
    assert r.returncode == 0, r.stderr
    assert _raw_samples(db, s3_server.storage_options) == expected
    conv = s3_server.url("out/conv.sqlite")
    r = run("index", "convert", out, conv, *so)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wrote {conv}"
    assert _raw_samples(conv, s3_server.storage_options) == expected


@pytest.mark.parametrize("scheme", ["http", "https", "zip"])
def test_a_read_only_output_scheme_is_one_line_before_any_scanning(tmp_path, scheme):
    missing = str(tmp_path / "missing.tar")  # scanning it would fail with "no such file"
    out = f"{scheme}://u:secretpw@127.0.0.1:9/data/train.json"
    for args in (("index", "create", missing, "-o", out), ("index", "convert", missing, out)):
        r = run(*args, cwd=str(tmp_path))
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "read-only" in r.stderr and "secretpw" not in r.stderr, r.stderr
        assert os.listdir(tmp_path) == []


def test_an_output_that_is_a_shard_or_a_users_file_is_refused(shards, tmp_path):
    import shutil
    import sqlite3

    shard_named_json = tmp_path / "weird.json"
    shutil.copy(shards[0], shard_named_json)
    notes = tmp_path / "notes.json"
    notes.write_text("[1, 2, 3]\n")
    db = tmp_path / "mine.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x)")
    (tmp_path / "dir.json").mkdir()
    before = {p: p.read_bytes() for p in (shard_named_json, notes, db)}
    cases = [
        ([str(shard_named_json)], shard_named_json, "one of the shards"),
        (shards, notes, "not a wids index"),
        (shards, db, "not a wids index"),
        (shards, tmp_path / "dir.json", "is a directory"),
    ]
    for inputs, out, why in cases:
        r = run("index", "create", *inputs, "-o", str(out), "-q")
        assert r.returncode == 2 and why in r.stderr, r.stderr
    for p, data in before.items():
        assert p.read_bytes() == data
    r = run("index", "convert", str(notes), str(notes))
    assert r.returncode == 2 and notes.read_bytes() == before[notes]
    # An index (ours or a reference description) is rebuilt in place, as before.
    idx = tmp_path / "idx.json"
    ref = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": []}
    idx.write_text(json.dumps(ref))
    assert run("index", "create", *shards, "-o", str(idx), "-q").returncode == 0
    assert run("index", "create", *shards, "-o", str(idx), "-q").returncode == 0


# ---------------------------------------------------------------------- plain-spoken errors


def test_a_directory_or_a_glob_matching_nothing_is_named_and_explained(shards, tmp_path):
    from wids import ShardListDataset, ShardNotFoundError

    d = os.path.dirname(shards[0])
    with pytest.raises(ShardNotFoundError, match="is a directory") as e:
        len(ShardListDataset(d))
    assert e.value.shard == d and isinstance(e.value, FileNotFoundError)
    assert f"name them, as in '{d}/*.tar', or give their index" in str(e.value)  # what to do
    assert len(ShardListDataset(os.path.join(d, "synth-*.tar"))) == 60  # quoted globs expand
    glob = os.path.join(d, "nothing-*.tar")
    with pytest.raises(ShardNotFoundError, match="no file matches"):
        len(ShardListDataset(glob))
    r = run("index", "create", glob, "-o", str(tmp_path / "g.json"))
    assert r.returncode == 2 and "no file matches" in r.stderr and glob in r.stderr
    assert "matches" not in run("index", "info", str(tmp_path / "none.json")).stderr


def test_remote_errors_say_what_failed_in_plain_words(s3_server):
    url = s3_server.url("no-such-dir/missing.json")
    r = run("index", "info", url, *_so_flags(s3_server.storage_options))
    assert r.returncode == 2
    assert r.stderr.startswith(f"wids: error: {url}: could not "), r.stderr
    assert "not found" in r.stderr and "read 0-" not in r.stderr and ": stat:" not in r.stderr


def test_debug_turns_on_the_library_logging(tmp_path):
    """``--debug`` shows wids's own log records (here: a member with no sample, skipped)."""
    from tarfixtures import write_tar

    shard = write_tar(tmp_path / "odd.tar", [("README", b"no key.field name"), ("k.txt", b"x")])
    args = ("index", "create", str(shard), "-o", str(tmp_path / "odd.json"), "-q")
    quiet, debug = run(*args), run("--debug", *args[:-2], str(tmp_path / "odd2.json"), "-q")
    assert quiet.returncode == debug.returncode == 0, debug.stderr
    assert "skipped" not in quiet.stderr
    assert "wids: INFO: wids.samples: " in debug.stderr and "'README'" in debug.stderr


# ------------------------------------------------------------------ the first ten minutes


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """``wids show ... | head -1``: no 'Broken pipe' error, the shell's SIGPIPE status."""
    shards = write_dataset(str(tmp_path), shards=1, samples_per_shard=3000, real_images=False,
                           jpg_bytes=10)  # fmt: skip
    cmd = [sys.executable, "-m", "wids", "show", shards[0], "-n", "3000"]  # > a pipe's 64 KB
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().startswith(b"index")
    proc.stdout.close()  # the reader goes away, as head does, long before the 3000 rows
    _, err = proc.communicate(timeout=60)
    assert err == b"" and proc.returncode == 141


def test_cache_dir_before_or_after_the_cache_subcommand(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    for args in (
        ["cache", "--cache-dir", str(before), "du"],
        ["cache", "du", "--cache-dir", str(after)],
        ["cache", "ls", "--json", "--cache-dir", str(after)],
        ["cache", "--cache-dir", str(before), "clean", "--cache-dir", str(after)],
    ):
        r = run(*args)
        assert r.returncode == 0, (args, r.stderr)
        where = after if str(after) in args else before
        assert f"no cache: {where} does not exist" in r.stdout + r.stderr, args


def test_duplicate_keys_are_explained_in_the_commands_terms(tmp_path):
    from tarfixtures import write_shard

    from wids import SampleLayoutError, build_index

    shard = write_shard(tmp_path / "d.tar", [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    r = run("index", "create", str(shard), "-o", str(tmp_path / "d.json"))
    assert r.returncode == 2 and "key 'a' reappears after other samples" in r.stderr
    assert "wids index create --duplicates split" in r.stderr and "tar --sort=name" in r.stderr
    assert "duplicates='split'" not in r.stderr
    twice = write_shard(tmp_path / "t.tar", [("a.jpg", b"1"), ("a.jpg", b"2")])
    r = run("show", str(twice))
    assert "--duplicates split or --duplicates keep_first" in r.stderr
    assert "tar --sort" not in r.stderr  # sorting would not help a repeated name
    with pytest.raises(SampleLayoutError, match="pass duplicates='split' to accept") as e:
        build_index([str(shard)], str(tmp_path / "p.json"))  # Python users get Python terms
    assert e.value.policies == ("split",) and e.value.sortable


def test_a_failed_index_create_leaves_no_member_tables(shards, tmp_path):
    from tarfixtures import write_shard

    bad = write_shard(tmp_path / "bad.tar", [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    out = tmp_path / "x.json"
    r = run("index", "create", *shards, str(bad), "-o", str(out))
    assert r.returncode == 2
    assert sorted(os.listdir(tmp_path)) == ["bad.tar"]  # no x.json, no x.members/
    r = run("index", "create", *shards, str(tmp_path / "missing.tar"), "-o", str(out))
    assert r.returncode == 2 and sorted(os.listdir(tmp_path)) == ["bad.tar"]
    # an index that was there keeps its member tables when a rebuild fails
    assert run("index", "create", *shards, "-o", str(out), "-q").returncode == 0
    tables = sorted(os.listdir(tmp_path / "x.members"))
    assert run("index", "create", *shards, str(bad), "-o", str(out)).returncode == 2
    assert sorted(os.listdir(tmp_path / "x.members")) == tables and out.exists()


def test_verify_names_a_missing_shard_missing_and_says_how_to_repair(shards, tmp_path):
    """A shard that is gone is MISSING, with what to do about it (put it back, or index the
    shards there are); it was CHANGED, with a hint to rebuild from shards that are not there."""
    import shutil

    local = [shutil.copy(p, tmp_path) for p in shards]
    out = str(tmp_path / "i.json")
    assert main(["index", "create", *local, "-o", out, "-q"]) == 0
    os.remove(local[1])
    r = run("index", "verify", out)
    assert r.returncode == 1
    assert f"MISSING {local[1]}: " in r.stdout and "CHANGED" not in r.stdout
    assert "put the missing shards back" in r.stdout and "--full" not in r.stdout
