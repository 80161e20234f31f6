"""TarWriter: every shard it writes reads the same through tarfile, GNU tar, wids and webdataset."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from tar_oracle import tar_samples
from tarfixtures import require_gnu_tar, tarfile_members

from wids.errors import EncodeError, SampleLayoutError
from wids.index import scan_shard
from wids.storage import Source
from wids.tar import scan_local_rows
from wids.tarwrite import DEFAULT_MTIME, HeaderMaker
from wids.writer import TarWriter

NAME_100 = "k" * 96  # with ".bin": exactly 100 bytes, still plain ustar


def mixed_samples() -> list[dict]:
    """Samples covering every case of the header writer."""
    rng = np.random.default_rng(0)
    return [
        {"__key__": "000000", "jpg": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "cls": 3},
        {"__key__": "000001", "txt": "", "bin": b"x" * 512, "json": {"a": [1, 2]}},
        {"__key__": "dir/sub/000002", "seg.png": np.zeros((4, 4), np.uint8), "txt.gz": "hi"},
        {"__key__": NAME_100, "bin": b"exactly one hundred"},
        {"__key__": "long/" + "d" * 150, "bin": b"long name"},
        {"__key__": "ünïcödé/ключ", "txt": "non-ASCII key", "cls": 7},
        {"__key__": "000003", ".npy": np.arange(10), "__url__": "ignored metadata"},
    ]


def write(path, samples, **kw) -> TarWriter:
    with TarWriter(str(path), **kw) as w:
        for s in samples:
            w.write(s)
    return w


def test_tarfile_and_wids_agree_with_the_recorded_members(tmp_path):
    path = tmp_path / "a.tar"
    w = write(path, mixed_samples())
    recorded = w.members()
    rows = tarfile_members(str(path))
    assert [r[:3] for r in rows] == [
        (key + field, off, size)
        for i in range(len(recorded))
        for key in [recorded.key(i)]
        for field, off, size in recorded.members(i)
    ]
    assert [r[:3] for r in scan_local_rows(str(path))] == [r[:3] for r in rows]
    stat, scanned, skipped = scan_shard(Source(str(path)))
    assert scanned == recorded and skipped == 0
    assert w.stat.size == stat.size == os.path.getsize(path) and w.stat.mtime == stat.mtime
    with tarfile.open(path) as tf:
        for m in tf:
            assert (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "")
            assert (m.mode, m.mtime, m.type) == (0o444, DEFAULT_MTIME, tarfile.REGTYPE)
    samples = tar_samples(str(path))
    assert [s["__key__"] for s in samples] == [s["__key__"] for s in mixed_samples()]
    assert samples[1][".txt"] == b"" and samples[1][".bin"] == b"x" * 512
    assert ".__url__" not in samples[6] and len(samples[6]) == 2


def test_pax_records_only_when_ustar_cannot_hold_the_name(tmp_path):
    path = tmp_path / "a.tar"
    write(path, mixed_samples())
    with tarfile.open(path) as tf:
        pax = {m.name for m in tf if m.pax_headers}
    assert pax == {"long/" + "d" * 150 + ".bin", "ünïcödé/ключ.cls", "ünïcödé/ключ.txt"}
    raw = path.read_bytes()
    assert raw.count(b"././@PaxHeader") == 3
    assert (NAME_100 + ".bin").encode() in raw  # the 100-byte name sits in a plain header


def test_gnu_tar_lists_and_extracts_the_same(tmp_path):
    exe = require_gnu_tar()
    path = tmp_path / "a.tar"
    write(path, mixed_samples())
    out = subprocess.run([exe, "-tvf", str(path)], capture_output=True, text=True, check=True)
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    names = [m[0] for m in tarfile_members(str(path))]
    assert len(lines) == len(names)
    for line, name in zip(lines, names, strict=True):
        assert line.startswith("-r--r--r-- 0/0 ") and line.endswith(" 2000-01-01 00:00 " + name)
    dest = tmp_path / "x"
    dest.mkdir()
    subprocess.run([exe, "-xf", str(path), "-C", str(dest)], check=True, capture_output=True)
    for sample in tar_samples(str(path)):
        for field, data in sample.items():
            if field != "__key__":
                assert (dest / (sample["__key__"] + field)).read_bytes() == data


def test_sizes_of_8_gib_and_more_use_a_pax_size_record(tmp_path):
    """The header of a member too big for ustar, checked on a sparse file by three readers."""
    size = (1 << 33) + 5
    head = HeaderMaker(0o444, DEFAULT_MTIME, "", "").member(b"big/000000.bin", size)
    assert len(head) == 3 * 512  # pax header, its records, the member's header
    path = tmp_path / "big.tar"
    with open(path, "wb") as f:
        f.write(head)
        end = len(head) + size + (-size % 512)
        f.truncate(end + 1024)  # a sparse file: data and end blocks are zeros
    assert tarfile_members(str(path))[0][:3] == ("big/000000.bin", 1536, size)
    assert scan_local_rows(str(path))[0][:3] == ("big/000000.bin", 1536, size)
    exe = require_gnu_tar()
    out = subprocess.run([exe, "-tvf", str(path)], capture_output=True, text=True, check=True)
    assert f" {size} " in out.stdout


def test_same_samples_give_byte_identical_shards(tmp_path):
    write(tmp_path / "a.tar", mixed_samples())
    write(tmp_path / "b.tar", mixed_samples())
    write(tmp_path / "c.tar", mixed_samples(), mtime=1_700_000_000)
    a, b, c = ((tmp_path / n).read_bytes() for n in ("a.tar", "b.tar", "c.tar"))
    assert a == b
    assert len(a) == len(c) and a != c


def test_a_file_object_destination_is_written_not_closed():
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        w.write({"__key__": "a", "txt": "x"})
    assert not buf.closed and w.stat is None
    data = buf.getvalue()
    assert len(data) == w.offset == 4 * 512  # header, data, two end blocks
    assert tarfile_members(data)[0][:3] == ("a.txt", 512, 1)


@pytest.mark.parametrize(
    "sample,words",
    [
        ({"txt": "no key"}, "no '__key__'"),
        ({"__key__": "a.b", "txt": "x"}, "has a dot"),
        ({"__key__": "x/../y", "txt": "x"}, "'..'"),
        ({"__key__": "/abs", "txt": "x"}, "starts with '/'"),
        ({"__key__": "", "txt": "x"}, "non-empty"),
        ({"__key__": 5, "txt": "x"}, "non-empty str"),
        ({"__key__": "a", "sub/field": b""}, "field 'sub/field'"),
        ({"__key__": "a", "txt": "x", ".txt": "y"}, "given twice"),
        ({"__key__": "a"}, "no fields"),
        ({"__key__": "a", "__meta__": "x"}, "no fields"),
    ],
)
def test_bad_samples_are_refused_before_anything_is_written(sample, words):
    buf = io.BytesIO()
    w = TarWriter(buf)
    with pytest.raises(SampleLayoutError, match=words.replace("(", r"\(")):
        w.write(sample)
    assert buf.getvalue() == b"" and w.count == 0


def test_duplicate_keys_in_one_tar_are_an_error(tmp_path):
    w = TarWriter(str(tmp_path / "a.tar"))
    w.write({"__key__": "a", "txt": "1"})
    with pytest.raises(SampleLayoutError, match="already written"):
        w.write({"__key__": "a", "cls": 2})
    w.close()
    assert tarfile_members(str(tmp_path / "a.tar"))[0][0] == "a.txt"


def test_an_error_leaves_no_file_and_no_temporary(tmp_path):
    with pytest.raises(EncodeError), TarWriter(str(tmp_path / "a.tar")) as w:
        w.write({"__key__": "a", "txt": "fine"})
        w.write({"__key__": "b", "jpg": "not an image"})
    assert os.listdir(tmp_path) == []


def test_options_are_checked():
    with pytest.raises(ValueError, match="compress must be None or .zstd."):
        TarWriter(io.BytesIO(), compress=True)
    with pytest.raises(ValueError, match="mtime"):
        TarWriter(io.BytesIO(), mtime=-1)
    with pytest.raises(ValueError, match="31 bytes"):
        TarWriter(io.BytesIO(), user="u" * 40)


def webdataset_read(paths: list[str]) -> list[dict]:
    """Samples as webdataset 1.x's iterable pipeline yields them (in a process of its own).

    webdataset 1.x (the test extra; it no longer ships a ``wids`` module) needs no venv of its
    own: its import does not collide with ours.
    """
    pytest.importorskip("webdataset", minversion="1.0")
    python = sys.executable
    script = (
        "import hashlib, json, sys, webdataset as wds\n"
        "out = []\n"
        "for s in wds.WebDataset(sys.argv[1:], shardshuffle=False):\n"
        "    out.append({k: v if k == '__key__' else hashlib.sha1(v).hexdigest()\n"
        "                for k, v in s.items() if k == '__key__' or not k.startswith('__')})\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [python, "-c", script, *paths], capture_output=True, text=True, cwd="/", check=True
    )
    return json.loads(proc.stdout)


def test_webdataset_reads_the_same_samples(tmp_path):
    path = str(tmp_path / "a.tar")
    write(path, mixed_samples())
    expected = [
        {
            k if k == "__key__" else k[1:]: v if k == "__key__" else hashlib.sha1(v).hexdigest()
            for k, v in s.items()
        }
        for s in tar_samples(path)
    ]
    assert webdataset_read([path]) == expected
