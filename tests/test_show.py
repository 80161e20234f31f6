from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from wids import build_index
from wids.show import read_samples, render_grid, sample_label, samples_table
from wids.synth import CLASS_NAMES, write_dataset

PIL = pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("show")
    paths = write_dataset(str(d), shards=2, samples_per_shard=12, image_size=48)
    out = str(d / "idx.json")
    build_index(paths, out)
    return out


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wids", *args], capture_output=True, text=True, timeout=120
    )


def test_read_samples_crosses_shards_and_stops_at_the_end(index):
    got = read_samples(index, start=8, n=100)
    assert [s["__index__"] for s in got] == list(range(8, 24))
    assert isinstance(got[0][".jpg"], bytes)
    assert [s["__index__"] for s in read_samples(index, start=-2, n=5)] == [22, 23]
    with pytest.raises(IndexError):
        read_samples(index, start=24)
    with pytest.raises(ValueError):
        read_samples(index, n=0)


def test_label_from_cls_and_json_name(index):
    s = read_samples(index, n=1)[0]
    label = int(s[".cls"])
    assert sample_label(s) == f"{label} ({CLASS_NAMES[label]})"
    assert sample_label({".cls": b"7"}) == "7"
    assert sample_label({".json": json.dumps({"label": 2, "name": "dog"}).encode()}) == "2 (dog)"
    assert sample_label({".json": b"not json", ".jpg": b""}) == ""


def test_table_lists_key_fields_sizes_and_label(index):
    samples = read_samples(index, n=3)
    lines = samples_table(samples).splitlines()
    assert lines[0].split() == ["index", "key", "fields", "label"]
    assert len(lines) == 4
    for line, s in zip(lines[1:], samples, strict=True):
        assert s["__key__"] in line
        assert f".jpg {len(s['.jpg']) / 1e3:.1f} KB" in line
        assert ".cls 1 B" in line
        assert sample_label(s) in line


def test_render_grid_writes_a_png_of_the_expected_size(index, tmp_path):
    from PIL import Image

    samples = read_samples(index, n=10)
    out = tmp_path / "grid.png"
    size = render_grid(samples, out, cell=64)
    with Image.open(out) as img:
        assert img.format == "PNG"
        assert img.size == size
        img.load()
        # 10 samples -> 4 columns x 3 rows of (cell + padding) tiles, text under each image
        cols, rows = 4, 3
        assert img.width == cols * (64 + 12)
        assert img.height > rows * (64 + 12)
        # the tiles hold the decoded images, not just background
        assert len(img.getcolors(maxcolors=1 << 20) or []) > 50


def test_render_grid_marks_samples_without_an_image(tmp_path):
    from PIL import Image

    samples = [
        {"__key__": "a", ".txt": b"hello", ".cls": b"1"},
        {"__key__": "b", ".jpg": b"not a jpeg"},
    ]
    out = tmp_path / "g.png"
    render_grid(samples, out, cell=48, columns=2)
    with Image.open(out) as img:
        assert img.size[0] == 2 * (48 + 12)
    with pytest.raises(ValueError):
        render_grid([], out)


@pytest.mark.slow
def test_cli_show_table_and_grid(index, tmp_path):
    r = run("show", index, "-n", "4", "--start", "10")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 5
    assert "000000000010" in r.stdout and "000001000001" in r.stdout
    grid = str(tmp_path / "cli.png")
    r = run("show", index, "--grid", grid, "-n", "9")
    assert r.returncode == 0, r.stderr
    assert "9 samples" in r.stdout
    from PIL import Image

    with open(grid, "rb") as f:
        Image.open(io.BytesIO(f.read())).verify()
    assert os.path.getsize(grid) > 1000


def test_cli_show_grid_replaces_a_link_and_never_writes_through_it(index, tmp_path):
    """A symbolic link planted at the grid's name is replaced; the file it names is untouched.

    Before, Pillow opened the link and wrote the PNG over the user's file it pointed at.
    """
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    link = tmp_path / "grid.png"
    os.symlink(mine, link)
    r = run("show", index, "--grid", str(link), "-n", "2")
    assert r.returncode == 0, r.stderr
    assert mine.read_text() == "my notes"
    assert not os.path.islink(link) and link.read_bytes().startswith(b"\x89PNG")
    r = run("show", index, "--grid", str(tmp_path / "grid.txt"), "-n", "2")
    assert r.returncode != 0 and "unknown file extension" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["grid.png", "notes.txt"]  # no temporary left


def test_cli_show_errors_are_one_line(index):
    r = run("show", index, "--start", "999")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "outside the dataset" in r.stderr


def test_cli_show_escapes_control_characters_from_the_shard(tmp_path):
    """Member names, keys, field names and label values with ANSI/OSC/C1 controls are escaped."""
    import tarfile

    evil_key = "k\x1b]0;pwned\x07\x1b[2J\u202eX"  # OSC retitle, CSI clear, bidi override
    members = [
        (f"{evil_key}.cls", b"1\x1b[31m\r\n"),  # label value with CSI and a carriage return
        (f"{evil_key}.t\x9b1mxt", b"x"),  # a field name with the 8-bit CSI
        ("plain.cls", b"2"),
    ]
    shard = str(tmp_path / "evil.tar")
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    out = str(tmp_path / "evil.json")
    build_index([shard], out)
    r = run("show", out)
    assert r.returncode == 0, r.stderr
    for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
        assert raw not in r.stdout, repr(raw)
    assert "k\\x1b]0;pwned\\x07\\x1b[2J\\u202eX" in r.stdout
    assert ".t\\x9b1mxt" in r.stdout and "1\\x1b[31m" in r.stdout
    assert "plain" in r.stdout
