"""A server that ignores ``Range`` (``python -m http.server``): index, read, show.

``python -m http.server`` answers every GET with 200 and the whole file. wids builds the
index by streaming each shard once, and ``range``/``auto`` read whole shards (into the cache
when the dataset has one, else into memory), with one warning naming the server.
"""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
import tarfile
import threading
import urllib.request
import warnings
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from serverfixtures import python_http_server
from tarfixtures import make_samples, write_shard

from wids import NotAnIndexError, RangeNotSupportedError, ShardListDataset, build_index
from wids.errors import PermanentRemoteError
from wids.storage import RangeFallbackWarning, Store

NAMES = ["a-0.tar", "a-1.tar", "a-2.tar"]
TABLE = ("nsamples", "size", "fields", "keys", "sample_start", "member_field", "member_offset")
TABLE += ("member_size",)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("norange")
    for i, name in enumerate(NAMES):
        write_shard(d / name, make_samples(5, start=10 * i))
    return d


@pytest.fixture(scope="module")
def plain_server(folder: Path):
    """``python -m http.server`` over the folder: 200 and the whole file for any Range."""
    with python_http_server(folder) as base:
        yield base


def _expected(folder: Path) -> list[dict[str, bytes]]:
    """Every sample's bytes, as tarfile reads them, in shard order."""
    out: list[dict[str, bytes]] = []
    for name in NAMES:
        with tarfile.open(folder / name) as tf:
            sample: dict[str, bytes] = {}
            key = None
            for m in tf.getmembers():
                k, ext = m.name.split(".", 1)
                if k != key and sample:
                    out.append(sample)
                    sample = {}
                key = k
                data = tf.extractfile(m)
                assert data is not None
                sample["." + ext] = data.read()
            out.append(sample)
    return out


def test_the_server_really_ignores_range(plain_server):
    req = urllib.request.Request(f"{plain_server}/{NAMES[0]}", headers={"Range": "bytes=0-9"})
    with urllib.request.urlopen(req) as r:
        assert r.status == 200 and len(r.read()) > 10


def test_a_range_read_raises_the_typed_error(plain_server):
    src = Store().source(f"{plain_server}/{NAMES[0]}")
    with pytest.raises(RangeNotSupportedError, match="ignores Range") as e:
        src.read_range(0, 10)
    assert isinstance(e.value, PermanentRemoteError) and isinstance(e.value, OSError)
    assert plain_server.split("//")[1] in str(e.value)


def _index(path: Path) -> tuple[list[dict], list[object]]:
    """An index's shard records (remote ones have no md5sum) and each shard's member table."""
    d = json.loads(path.read_text())
    shards, tables = [], []
    for rec in d["shardlist"]:
        table = json.loads((path.parent / rec["members"]).read_text())
        tables.append({k: v for k, v in table.items() if k in TABLE})
        shards.append({k: rec.get(k) for k in ("nsamples", "filesize")})
    return shards, tables


def test_index_create_equals_the_local_index(plain_server, folder, tmp_path):
    build_index([f"{plain_server}/{n}" for n in NAMES], str(tmp_path / "r.json"))
    build_index([str(folder / n) for n in NAMES], str(tmp_path / "l.json"))
    remote, local = _index(tmp_path / "r.json"), _index(tmp_path / "l.json")
    assert remote == local
    assert sum(s["nsamples"] for s in remote[0]) == 15


def test_cli_index_create_and_show(plain_server, folder, tmp_path):
    urls = [f"{plain_server}/{n}" for n in NAMES]
    out = tmp_path / "cli.json"
    run = _wids("index", "create", *urls, "-o", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    shown = _wids("show", str(out), "-n", "15", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    keys = [line.split()[1] for line in shown.stdout.splitlines()[1:]]
    assert keys == [f"{10 * s + i:06d}" for s in range(3) for i in range(5)]


def _wids(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wids", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def remote_index(plain_server, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("norange-index") / "r.json"
    build_index([f"{plain_server}/{n}" for n in NAMES], str(out))
    return str(out)


def _fresh_process_state() -> None:
    """Nothing to forget: each dataset keeps the servers it saw (its LocalCache's ranges)."""


@pytest.mark.parametrize("access", ["range", "auto"])
@pytest.mark.parametrize("cached", [False, True], ids=["memory", "cache_dir"])
def test_every_sample_reads_right_with_one_warning(
    access, cached, remote_index, plain_server, folder, tmp_path
):
    _fresh_process_state()
    cache_dir = str(tmp_path / "cache") if cached else None
    ds = ShardListDataset(remote_index, access=access, cache_dir=cache_dir, transformations=None)
    expected = _expected(folder)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [ds[i] for i in range(len(ds))]
        got_batch = ds.__getitems__(list(range(len(ds) - 1, -1, -1)))
    ds.close()
    for sample, want in zip(got, expected, strict=True):
        assert {k: sample[k] for k in want} == want
    for sample, want in zip(reversed(got_batch), expected, strict=True):
        assert {k: sample[k] for k in want} == want
    ours = [w for w in seen if issubclass(w.category, RangeFallbackWarning)]
    assert len(ours) == 1, [str(w.message) for w in seen]
    assert plain_server in str(ours[0].message) and "ignores Range" in str(ours[0].message)
    if cached:  # read through the shard cache: one copy per shard there
        assert len(list((tmp_path / "cache").rglob("*a-*.tar*"))) >= len(NAMES)


def test_batches_alone_fall_back(remote_index, folder):
    _fresh_process_state()
    ds = ShardListDataset(remote_index, access="range", transformations=None)
    with pytest.warns(RangeFallbackWarning):
        got = ds.__getitems__([0, 5, 10, 14])
    expected = _expected(folder)
    for sample, j in zip(got, [0, 5, 10, 14], strict=True):
        assert {k: sample[k] for k in expected[j]} == expected[j]


def test_a_shard_over_the_memory_bound_is_refused_naming_the_fix(remote_index):
    _fresh_process_state()
    ds = ShardListDataset(
        remote_index, access="range", transformations=None, max_sample_bytes=10_000
    )
    with (
        pytest.warns(RangeFallbackWarning),
        pytest.raises(RangeNotSupportedError, match="cache_dir"),
    ):
        ds[0]


def _identity(batch):
    return batch


@pytest.mark.parametrize("access", ["range", "auto"])
def test_dataloader_workers_with_a_chunked_plan(access, remote_index, folder, tmp_path):
    """Forked workers, batches that carry a plan (the lookahead prefetches): every sample right."""
    from torch.utils.data import DataLoader

    from wids import ChunkedSampler

    _fresh_process_state()
    cache_dir = str(tmp_path / "cache") if access == "auto" else None
    ds = ShardListDataset(remote_index, access=access, cache_dir=cache_dir, transformations=None)
    sampler = ChunkedSampler(ds, chunksize=4, seed=3, num_workers=2, batch_size=3)
    loader = DataLoader(
        ds,
        sampler=sampler,
        batch_size=3,
        num_workers=2,
        collate_fn=_identity,
        multiprocessing_context="fork",
        timeout=120,
    )
    expected = _expected(folder)
    seen = []
    for batch in loader:
        for sample in batch:
            want = expected[sample["__index__"]]
            assert {k: sample[k] for k in want} == want
            seen.append(sample["__index__"])
    assert sorted(seen) == list(range(len(expected)))


@pytest.mark.parametrize("access", ["range", "auto"])
@pytest.mark.parametrize("cached", [False, True], ids=["memory", "cache_dir"])
def test_member_handles_read_whole_shards_with_one_warning(
    access, cached, remote_index, plain_server, folder, tmp_path
):
    """``ds.open(i, field)`` and ``stream_over`` handles read their members by range, which
    such a server refuses (RangeNotSupportedError on the first read, also after ``ds[i]``
    had read the shard whole). They now read the shard whole as ``ds[i]`` does: into the
    cache when there is one, else into memory, with one warning naming the server per
    dataset (two here; Python's default filter shows the same warning once)."""
    _fresh_process_state()
    cache_dir = str(tmp_path / "cache") if cached else None
    expected = _expected(folder)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = ShardListDataset(remote_index, access=access, cache_dir=cache_dir)
        for i, want in enumerate(expected):  # the first reads of each shard are handles
            for field, data in want.items():
                with ds.open(i, field) as f:
                    assert f.read() == data
        ds.close()
        streamed = ShardListDataset(
            remote_index, access=access, cache_dir=cache_dir, transformations=None, stream_over=0
        )
        for i, want in enumerate(expected):
            sample = streamed[i]
            assert {k: sample[k].read() for k in want} == want
        streamed.close()
    ours = [w for w in seen if issubclass(w.category, RangeFallbackWarning)]
    # at most one per dataset (the second may find every shard cached and never ask the server)
    assert 1 <= len(ours) <= 2, [str(w.message) for w in seen]
    assert plain_server in str(ours[0].message)
    if cached:
        assert len(list((tmp_path / "cache").rglob("*a-*.tar*"))) >= len(NAMES)


def test_index_verify_streams_to_the_member_it_checks(folder, tmp_path):
    """``wids index verify`` read one recorded member header per shard by range and reported
    every shard of such a server CHANGED ("the server ignores Range"). It now streams each
    shard up to that header (one warning naming the server) and still catches a same-size
    replacement whose modification time was set back."""
    import os
    import shutil

    served = tmp_path / "served"
    shutil.copytree(folder, served)
    with python_http_server(served) as base:
        index = tmp_path / "r.json"
        build_index([f"{base}/{n}" for n in NAMES], str(index))
        run = _wids("index", "verify", str(index), cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"{len(NAMES)} of {len(NAMES)} shards match" in run.stdout
        assert run.stderr.count("RangeFallbackWarning") == 1 and base in run.stderr
        target = served / NAMES[1]
        st = target.stat()
        write_shard(target, make_samples(5, start=90))  # other keys, the same size
        assert target.stat().st_size == st.st_size
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        run = _wids("index", "verify", str(index), cwd=tmp_path)
        assert run.returncode == 1, run.stdout + run.stderr
        changed = [ln for ln in run.stdout.splitlines() if ln.startswith("CHANGED")]
        assert len(changed) == 1 and NAMES[1] in changed[0] and "ignores Range" not in changed[0]


class _Switchable(SimpleHTTPRequestHandler):
    """``http.server``'s handler (ignores Range) until ``honour`` is set: then 206 for a Range."""

    honour = False
    answers: list[int] = []

    def send_head(self):  # type: ignore[no-untyped-def]
        spec = self.headers.get("Range")
        if not (type(self).honour and spec and self.command == "GET"):
            type(self).answers.append(200)
            return super().send_head()
        data = Path(self.translate_path(self.path)).read_bytes()
        first, _, last = spec.split("=", 1)[1].partition("-")
        start, end = int(first), min(int(last or len(data) - 1), len(data) - 1)
        part = data[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header(
            "Last-Modified",
            self.date_time_string(int(Path(self.translate_path(self.path)).stat().st_mtime)),
        )
        self.end_headers()
        type(self).answers.append(206)
        return io.BytesIO(part)

    def log_message(self, *args: Any) -> None:
        pass


def test_what_one_dataset_learned_of_a_server_does_not_steer_the_next(folder, tmp_path):
    """A server seen ignoring Range is remembered by the dataset that saw it, not the process:
    replaced on the same port by one that honours Range (http.server swapped for nginx in a
    notebook), the next dataset reads by range again. Main kept the server in module-level
    state and read every shard of every later dataset whole."""
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Switchable, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Switchable.honour, _Switchable.answers = False, []
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        index = str(tmp_path / "switch.json")
        build_index([f"{base}/{n}" for n in NAMES], index)
        first = ShardListDataset(index, access="range", transformations=None)
        with pytest.warns(RangeFallbackWarning):
            first[0]
        first.close()
        _Switchable.honour, _Switchable.answers = True, []
        second = ShardListDataset(index, access="range", transformations=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RangeFallbackWarning)
            got = [second[i] for i in range(len(second))]
        second.close()
        for sample, want in zip(got, _expected(folder), strict=True):
            assert {k: sample[k] for k in want} == want
        assert _Switchable.answers and set(_Switchable.answers) == {206}, _Switchable.answers
    finally:
        server.shutdown()
        server.server_close()


def test_what_a_url_holds_is_recognised_without_range(tmp_path):
    """A description under a name without ``.json`` opens; a picture or a directory page is
    ``NotAnIndexError``, not a server fault (it was ``RangeNotSupportedError``)."""
    members = make_samples(3)
    write_shard(tmp_path / "a-0.tar", members)
    desc = {"wids_version": 1, "shardlist": [{"url": "a-0.tar", "nsamples": 3}]}
    (tmp_path / "train-index").write_text(json.dumps(desc))
    (tmp_path / "notes.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64)
    with python_http_server(tmp_path) as base, warnings.catch_warnings():
        warnings.simplefilter("ignore", RangeFallbackWarning)
        ds = ShardListDataset(f"{base}/train-index", transformations=None)
        assert len(ds) == 3
        assert {k: v for k, v in ds[2].items() if k[0] == "."} == {
            name[len("000002") :]: data for name, data in members if name.startswith("000002")
        }
        for url in (f"{base}/notes.png", f"{base}/"):
            with pytest.raises(NotAnIndexError, match="not a wids or reference index") as e:
                len(ShardListDataset(url))
            assert e.value.shard == url
        # an SQLite index is read whole too; a shard table is read by range: refused
        for name in ("i.sqlite", "i.widx"):
            build_index([f"{base}/a-0.tar"], str(tmp_path / name))
        assert len(ShardListDataset(f"{base}/i.sqlite", transformations=None)) == 3
        with pytest.raises(RangeNotSupportedError, match="ignores Range"):
            len(ShardListDataset(f"{base}/i.widx"))
