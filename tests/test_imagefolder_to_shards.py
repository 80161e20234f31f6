"""tools/imagefolder_to_shards.py: an ImageFolder tree becomes shards plus an index; --resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from wids import ShardListDataset

PIL = pytest.importorskip("PIL")
TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "imagefolder_to_shards.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_folder(root) -> dict[str, tuple[str, bytes]]:
    """3 classes of small images (JPEG, PNG, one in a subdirectory); path -> (class, bytes)."""
    from PIL import Image

    out = {}
    rng = np.random.default_rng(0)
    for c, name in enumerate(["cat", "dog", "eel"]):
        for i in range(5):
            fmt, ext = (("PNG", "png"), ("JPEG", "JPEG"))[i % 2]
            rel = f"{name}/{'sub/' if i == 4 else ''}img.{i}.{ext}"
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            arr = rng.integers(0, 256, (12 + c, 9, 3), dtype=np.uint8)
            Image.fromarray(arr).save(path, format=fmt)
            out[rel] = (name, path.read_bytes())
    (root / "dog" / "notes.txt").write_text("not an image")
    return out


def run(*args):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, TOOL, *map(str, args)], capture_output=True, text=True, env=env
    )


def test_imagefolder_becomes_shards_and_index_and_resumes(tmp_path):
    root = tmp_path / "images"
    images = make_folder(root)
    out = tmp_path / "out"
    r = run(root, out / "train-%06d.tar", "--maxcount", 4, "--shuffle", "--seed", 1)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "15 images in 3 classes -> 4 shards" in r.stdout and "writing" in r.stderr
    ds = ShardListDataset(str(out / "train.json"))
    assert len(ds) == 15
    seen = {}
    for i in range(len(ds)):
        s = ds[i]
        meta = s[".json"]
        assert s["__key__"] == f"{i:08d}"
        image = s.get(".png") or s.get(".jpg")
        assert image is not None and image.size == (9, 12 + s[".cls"])
        seen[meta["path"]] = (meta["class"], s[".cls"])
    assert {p: c for p, (c, _) in seen.items()} == {p: c for p, (c, _) in images.items()}
    assert {c: n for c, n in seen.values()} == {"cat": 0, "dog": 1, "eel": 2}
    raw = ShardListDataset(str(out / "train.json"), transformations=[])
    for i in range(len(raw)):
        s = raw[i]
        data = s.get(".png") or s.get(".jpg")
        assert data == images[json.loads(s[".json"])["path"]][1]  # the file's bytes as they are

    os.unlink(out / "train-000003.tar")  # as if killed before the last shard was published
    r = run(root, out / "train-%06d.tar", "--maxcount", 4, "--shuffle", "--seed", 1, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    after = ShardListDataset(str(out / "train.json"), transformations=[])
    assert "-> 4 shards" in r.stdout
    assert [after[i][".json"] for i in range(15)] == [raw[i][".json"] for i in range(15)]
