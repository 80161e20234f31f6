"""ShardWriter: shards plus the index `wids index create` would write, crash safety, remote."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from tar_oracle import tar_samples

from wids import ShardListDataset, build_index, open_index
from wids.errors import OutputExistsError, SampleLayoutError
from wids.index import scan_shard
from wids.shardwriter import ShardWriter, default_index
from wids.storage import Source, Store
from wids.tar import scan_local_rows

REPO = Path(__file__).resolve().parents[1]


def sample(i: int) -> dict:
    return {
        "__key__": f"{i:06d}",
        "bin": hashlib.sha256(str(i).encode()).digest() * (1 + i % 50),
        "cls": i % 10,
        "json": {"i": i},
    }


def write_all(pattern, n, **kw) -> ShardWriter:
    with ShardWriter(pattern, **kw) as w:
        for i in range(n):
            w.write(sample(i))
    return w


def index_files(directory: Path) -> dict[str, bytes]:
    """Every file of the index (description, sidecars) under ``directory``, by relative path."""
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and not p.name.endswith(".tar"):
            out[str(p.relative_to(directory))] = p.read_bytes()
    return out


def shards_in(directory: Path) -> list[str]:
    return sorted(str(p) for p in directory.glob("train-*.tar"))


def test_json_index_is_byte_identical_to_index_create(tmp_path):
    w = write_all(str(tmp_path / "train-%06d.tar"), 175, maxcount=50)
    assert w.written == shards_in(tmp_path) and len(w.written) == 4
    ours = index_files(tmp_path)
    for name in ours:
        (tmp_path / name).unlink()
    build_index(shards_in(tmp_path), str(tmp_path / "train.json"), incremental=False)
    assert index_files(tmp_path) == ours


def sqlite_rows(path: Path) -> dict[str, list]:
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY rowid').fetchall() for t in tables}
    finally:
        conn.close()


def test_sqlite_index_equals_index_create(tmp_path):
    write_all(str(tmp_path / "train-%06d.tar"), 120, maxcount=25, index=str(tmp_path / "t.sqlite"))
    ours = tmp_path / "t.sqlite"
    theirs = tmp_path / "built.sqlite"
    build_index(shards_in(tmp_path), str(theirs))
    assert sqlite_rows(ours) == sqlite_rows(theirs)
    assert ours.read_bytes() == theirs.read_bytes()


def test_shard_table_index_equals_index_create(tmp_path):
    write_all(str(tmp_path / "train-%06d.tar"), 120, maxcount=25, index=str(tmp_path / "t.widx"))
    ours = tmp_path / "t.widx"
    theirs = tmp_path / "built.widx"
    build_index(shards_in(tmp_path), str(theirs))
    assert ours.read_bytes()[:8] == b"WIDSTBL\x00"
    assert not (tmp_path / "t.widx.members").exists()
    a, b = open_index(str(ours)), open_index(str(theirs))
    assert a.shards == b.shards and a.components == b.components
    assert [a.members(i) for i in range(len(a.shards))] == [
        b.members(i) for i in range(len(b.shards))
    ]


def test_rotation_by_count_and_by_size(tmp_path):
    w = write_all(str(tmp_path / "a-%03d.tar"), 23, maxcount=7, index=None)
    assert [len(tar_samples(p)) for p in w.written] == [7, 7, 7, 2]
    assert not list(tmp_path.glob("*.json"))
    sizes = tmp_path / "s"
    with ShardWriter(str(sizes / "b-%03d.tar"), maxsize=20_000) as w:
        for i in range(40):
            w.write(sample(i))
        w.write({"__key__": "huge", "bin": b"x" * 50_000})
        w.write(sample(40))
    lengths = [os.path.getsize(p) for p in w.written]
    assert all(n <= 20_000 for n in lengths[:-2]) and lengths[-2] > 50_000
    assert [s["__key__"] for s in tar_samples(w.written[-2])] == ["huge"]
    keys = [s["__key__"] for p in w.written for s in tar_samples(p)]
    assert keys == [f"{i:06d}" for i in range(40)] + ["huge", "000040"]


def test_default_index_name():
    assert default_index("out/train-%06d.tar") == "out/train.json"
    assert default_index("s3://b/x/shard_%d.tar") == "s3://b/x/shard.json"
    assert default_index("%05d.tar") == "index.json"
    with pytest.raises(ValueError, match="number field"):
        ShardWriter("out/train.tar")


def test_the_dataset_reads_back_every_sample(tmp_path):
    write_all(str(tmp_path / "train-%06d.tar"), 60, maxcount=16)
    ds = ShardListDataset(str(tmp_path / "train.json"), transformations=[])
    assert len(ds) == 60
    for i in (0, 15, 16, 59):
        got = ds[i]
        assert got["__key__"] == f"{i:06d}" and got[".bin"] == sample(i)["bin"]
        assert got[".cls"] == str(i % 10).encode() and got[".json"] == b'{"i": %d}' % i


def test_existing_shards_are_not_overwritten(tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    first = write_all(pattern, 30, maxcount=10)
    before = Path(first.written[0]).read_bytes()
    with pytest.raises(OutputExistsError, match="resume=True"):
        write_all(pattern, 5, maxcount=10)
    assert Path(first.written[0]).read_bytes() == before
    write_all(pattern, 5, maxcount=10, overwrite=True)
    assert len(tar_samples(first.written[0])) == 5


def test_keys_repeat_only_across_shards(tmp_path):
    with ShardWriter(str(tmp_path / "t-%d.tar"), maxcount=2) as w:
        w.write({"__key__": "a", "txt": "1"})
        w.write({"__key__": "b", "txt": "2"})
        w.write({"__key__": "a", "txt": "3"})  # a new shard
        with pytest.raises(SampleLayoutError, match="already written"):
            w.write({"__key__": "a", "txt": "4"})
    assert [len(tar_samples(p)) for p in w.written] == [2, 1]


def test_an_error_publishes_whole_shards_only(tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    with pytest.raises(RuntimeError), ShardWriter(pattern, maxcount=10) as w:
        for i in range(25):
            w.write(sample(i))
        raise RuntimeError("the caller's loop failed")
    assert shards_in(tmp_path) == w.written and len(w.written) == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    index = open_index(str(tmp_path / "train.json"))
    assert [s.nsamples for s in index.shards] == [10, 10]


CHILD = """
import hashlib, sys, time
sys.path.insert(0, sys.argv[5])
from test_shardwriter import sample
from wids.shardwriter import ShardWriter
pattern, index, resume, stop = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
w = ShardWriter(pattern, maxcount=10, index=index, resume=resume,
                post=lambda url: print("published", url, flush=True))
w.open()
print("start", w.total, flush=True)
for i in range(w.total, stop):
    w.write(sample(i))
    if i % 10 == 5:
        print("mid", i, flush=True)
        time.sleep(0.02)
w.close()
print("done", flush=True)
"""


def run_child(tmp_path, index, *, resume, stop, kill_after=None):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    argv = [sys.executable, str(script), str(tmp_path / "d" / "train-%06d.tar"), index]
    argv += ["1" if resume else "0", str(stop), str(REPO / "tests")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    lines, published = [], 0
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.split())
        published += line.startswith("published")
        if kill_after is not None and published >= kill_after and line.startswith("mid"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    return proc.returncode, lines


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_sigkill_mid_shard_leaves_whole_shards_and_their_index_then_resume(tmp_path, suffix):
    index = str(tmp_path / "d" / f"train{suffix}")
    code, lines = run_child(tmp_path, index, resume=False, stop=10**6, kill_after=3)
    assert code == -signal.SIGKILL and lines[-1][0] == "mid"
    d = tmp_path / "d"
    shards = shards_in(d)
    assert [Path(s).name for s in shards] == [f"train-{i:06d}.tar" for i in range(3)]
    for k, s in enumerate(shards):
        scan_local_rows(s)  # a whole tar, end blocks included
        assert [x["__key__"] for x in tar_samples(s)] == [
            f"{i:06d}" for i in range(10 * k, 10 * k + 10)
        ]
    leftovers = {p.name for p in d.iterdir() if p.name.startswith(".")}
    assert all(n.endswith(".tmp") for n in leftovers) and len(leftovers) == 1
    reader = open_index(index)
    indexed = [s.url for s in reader.shards]
    if suffix == ".json":
        assert indexed == shards  # exactly the whole shards
    else:
        assert indexed == shards[: len(indexed)] and indexed  # the last checkpoint's prefix
    for i, info in enumerate(reader.shards):
        stat, scanned, _ = scan_shard(Source(info.url))
        assert reader.members(i) == scanned and (info.size, info.mtime) == (stat.size, stat.mtime)
    reader.close()

    code, lines = run_child(tmp_path, index, resume=True, stop=55)
    assert code == 0 and lines[0] == ["start", "30"] and lines[-1] == ["done"]
    assert not [p for p in d.iterdir() if p.name.startswith(".")]  # temp and lock removed
    shards = shards_in(d)
    keys = [x["__key__"] for s in shards for x in tar_samples(s)]
    assert keys == [f"{i:06d}" for i in range(55)]
    built = tmp_path / "built"
    built.mkdir()
    build_index(shards, str(built / f"train{suffix}"))
    ours, theirs = open_index(index), open_index(str(built / f"train{suffix}"))
    assert [s.url for s in ours.shards] == [s.url for s in theirs.shards] == shards
    for i in range(len(shards)):
        assert ours.shards[i] == theirs.shards[i] and ours.members(i) == theirs.members(i)


def test_resume_scans_shards_the_index_lacks(tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    write_all(pattern, 30, maxcount=10, index=None)
    with ShardWriter(pattern, maxcount=10, resume=True) as w:
        assert (w.total, w.shard) == (30, 3)
        for i in range(w.total, 42):
            w.write(sample(i))
    ds = ShardListDataset(str(tmp_path / "train.json"), transformations=[])
    assert [ds[i]["__key__"] for i in range(len(ds))] == [f"{i:06d}" for i in range(42)]


# -- remote -----------------------------------------------------------------------------------


@pytest.fixture(params=["s3", "gcs"])
def bucket(request):
    return request.getfixturevalue(f"{request.param}_server")


def test_remote_shards_and_index_equal_index_create(bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where upload buffers live
    prefix = f"w-{uuid.uuid4().hex[:8]}"
    pattern = bucket.url(f"{prefix}/train-%06d.tar")
    buffers: list[int] = []

    def post(url):
        buffers.append(len([p for p in tmp_path.iterdir() if p.name.startswith("wids-write-")]))

    so = bucket.storage_options
    w = write_all(pattern, 70, maxcount=8, storage_options=so, max_uploads=2, post=post)
    assert w.written == [bucket.url(f"{prefix}/train-{i:06d}.tar") for i in range(9)]
    assert max(buffers) <= 2 + 1  # uploads in flight plus the shard being written
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("wids-")]
    index = bucket.url(f"{prefix}/train.json")
    ours = open_index(index, so)
    assert [s.url for s in ours.shards] == w.written
    for info in ours.shards:
        stat = Store(so).source(info.url).info()
        assert (info.size, info.etag, info.mtime) == (stat.size, stat.etag, stat.mtime)
        assert info.etag
    built = bucket.url(f"{prefix}/built/train.json")
    build_index(w.written, built, storage_options=so)
    theirs = open_index(built, so)
    for i in range(len(w.written)):
        assert ours.shards[i] == theirs.shards[i] and ours.members(i) == theirs.members(i)
    ds = ShardListDataset(index, storage_options=so, transformations=[])
    assert [ds[i][".bin"] for i in (0, 69)] == [sample(0)["bin"], sample(69)["bin"]]


def test_remote_resume(s3_server):
    prefix = f"r-{uuid.uuid4().hex[:8]}"
    pattern = s3_server.url(f"{prefix}/train-%06d.tar")
    so = s3_server.storage_options
    write_all(pattern, 20, maxcount=10, storage_options=so)
    with pytest.raises(OutputExistsError):
        write_all(pattern, 1, maxcount=10, storage_options=so)
    with ShardWriter(pattern, maxcount=10, storage_options=so, resume=True) as w:
        assert w.total == 20
        for i in range(20, 25):
            w.write(sample(i))
    ds = ShardListDataset(s3_server.url(f"{prefix}/train.json"), storage_options=so)
    assert len(ds) == 25 and ds[24]["__key__"] == "000024"


def test_webdataset_reads_every_shard_the_same(tmp_path):
    from test_writer import webdataset_read

    w = write_all(str(tmp_path / "train-%06d.tar"), 25, maxcount=10)
    expected = [
        {k: v if k == "__key__" else hashlib.sha1(v).hexdigest() for k, v in s.items()}
        for p in w.written
        for s in tar_samples(p)
    ]
    expected = [{k.removeprefix("."): v for k, v in s.items()} for s in expected]
    assert webdataset_read(w.written) == expected


# -- an existing index (issue 21, item 2) -------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_start_shard_extends_the_index_with_the_shards_listed_below_it(tmp_path, suffix):
    pattern, index = str(tmp_path / "train-%06d.tar"), str(tmp_path / f"train{suffix}")
    write_all(pattern, 30, maxcount=10, index=index)
    with ShardWriter(pattern, maxcount=10, start_shard=3, index=index) as w:
        assert (w.total, w.written) == (0, [])  # total counts this writer's samples
        for i in range(30, 50):
            w.write(sample(i))
    ds = ShardListDataset(index, transformations=[])
    assert [ds[i]["__key__"] for i in range(len(ds))] == [f"{i:06d}" for i in range(50)]
    assert ds[49][".bin"] == sample(49)["bin"] and ds[0][".bin"] == sample(0)["bin"]


def test_a_second_pattern_does_not_replace_another_writers_index(tmp_path):
    write_all(str(tmp_path / "train-%06d.tar"), 30, maxcount=10)
    before = index_files(tmp_path)
    with pytest.raises(OutputExistsError, match="not one of this writer's shards"):
        write_all(str(tmp_path / "train_%04d.tar"), 20, maxcount=10)
    assert index_files(tmp_path) == before and not list(tmp_path.glob("train_*.tar"))
    assert len(ShardListDataset(str(tmp_path / "train.json"))) == 30
    write_all(str(tmp_path / "train_%04d.tar"), 20, maxcount=10, overwrite=True)  # on purpose
    assert len(ShardListDataset(str(tmp_path / "train.json"))) == 20


def test_an_index_listing_shards_the_writer_would_write_again_is_refused(tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    write_all(pattern, 30, maxcount=10)
    before = index_files(tmp_path)
    with pytest.raises(OutputExistsError, match="resume=True"):
        ShardWriter(pattern, maxcount=10, start_shard=1).open()
    os.unlink(tmp_path / "train-000002.tar")  # listed, missing: still the index's shard
    with pytest.raises(OutputExistsError, match="resume=True"):
        ShardWriter(pattern, maxcount=10, start_shard=2).open()
    assert index_files(tmp_path) == before


def test_a_missing_shard_listed_below_start_shard_is_refused(tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    write_all(pattern, 30, maxcount=10)
    os.unlink(tmp_path / "train-000001.tar")
    with pytest.raises(FileNotFoundError, match="train-000001.tar.*missing"):
        ShardWriter(pattern, maxcount=10, start_shard=3).open()
    assert len(ShardListDataset(str(tmp_path / "train.json"))) == 30


def test_a_changed_shard_listed_below_start_shard_is_indexed_again(tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    write_all(pattern, 30, maxcount=10)
    write_all(str(tmp_path / "other-%06d.tar"), 4, maxcount=10, index=None)
    os.replace(tmp_path / "other-000000.tar", tmp_path / "train-000001.tar")
    write_all(pattern, 0, maxcount=10, start_shard=3)
    ds = ShardListDataset(str(tmp_path / "train.json"), transformations=[])
    assert len(ds) == 24 and ds[13]["__key__"] == "000003"


def test_a_writer_that_failed_before_its_first_shard_leaves_no_index(tmp_path):
    """An empty train.json would look like a finished dataset of no samples."""
    from wids.errors import EncodeError

    pattern = str(tmp_path / "train-%06d.tar")
    with pytest.raises(EncodeError), ShardWriter(pattern, maxcount=10) as w:
        w.write({"__key__": "a", "jpg": object()})
    assert os.listdir(tmp_path) == []
    with ShardWriter(pattern, maxcount=2) as w:  # one shard done, then the failure: indexed
        for i in range(3):
            w.write(sample(i))
        with pytest.raises(EncodeError):
            w.write({"__key__": "b", "jpg": object()})
        w.abort()
    assert len(ShardListDataset(str(tmp_path / "train.json"))) == 2


def test_a_description_with_a_missing_source_url_is_not_replaced(tmp_path):
    """A sub-dataset that is unreachable now does not make the description "no index"."""
    desc = tmp_path / "train.json"
    text = (
        '{"__kind__": "wids-shard-index-v1", "wids_version": 1, '
        f'"datasets": [{{"source_url": "{tmp_path / "gone.json"}"}}]}}'
    )
    desc.write_text(text)
    with pytest.raises(OutputExistsError, match="cannot be read.*overwrite=True"):
        write_all(str(tmp_path / "train-%06d.tar"), 3, maxcount=2)
    assert desc.read_text() == text and not list(tmp_path.glob("train-*.tar"))


def test_resume_refuses_an_index_it_cannot_read(tmp_path):
    """The shards it lists below start_shard would silently drop out of the rewritten index."""
    pattern = str(tmp_path / "train-%06d.tar")
    write_all(pattern, 30, maxcount=10)
    index = tmp_path / "train.json"
    damaged = index.read_bytes()[:-40]
    index.write_bytes(damaged)
    with pytest.raises(OutputExistsError, match="cannot be read"):
        ShardWriter(pattern, maxcount=10, start_shard=2, resume=True).open()
    assert index.read_bytes() == damaged
    write_all(pattern, 0, maxcount=10, resume=True, overwrite=True)  # on purpose: scanned again
    assert len(ShardListDataset(str(index))) == 30


def test_another_programs_temporary_files_beside_the_shards_are_left_alone(tmp_path):
    """A writer removes the temporary files a killed writer of its own names left, no others.

    Before, opening a ShardWriter deleted every unlocked ``.*.tmp`` in the output folder: a
    user's ``.notes.tmp``, another program's download in progress.
    """
    from wids.atomic import TempFile

    theirs = {".notes.tmp": b"mine", ".other.tar.0123456789ab.tmp": b"theirs", "a.tmp": b"x"}
    for name, data in theirs.items():
        (tmp_path / name).write_bytes(data)
    for stem in ("train-000007.tar", "train.json"):  # as a killed writer leaves them: unlocked
        tmp = TempFile(tmp_path, stem)
        assert tmp.fd is not None
        os.close(tmp.fd)
        tmp.fd = None
    assert len(os.listdir(tmp_path)) == 5
    with ShardWriter(str(tmp_path / "train-%06d.tar"), maxcount=10) as w:
        w.write(sample(0))
    left = sorted(n for n in os.listdir(tmp_path) if n.endswith(".tmp"))
    assert left == sorted(theirs)
    assert all((tmp_path / n).read_bytes() == d for n, d in theirs.items())
