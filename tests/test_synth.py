"""wids.synth: synthetic shards are real tars, reproducible from their seed, as documented."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from wids.synth import CLASS_NAMES, write_dataset


def _members(path: str) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]


def test_shards_are_tars_with_cls_jpg_json_per_sample(tmp_path):
    paths = write_dataset(str(tmp_path), shards=2, samples_per_shard=5, real_images=False)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["synth-000000.tar", "synth-000001.tar"]
    for s, path in enumerate(paths):
        members = _members(path)
        assert len(members) == 15
        for i in range(5):
            key = f"{s:06d}{i:06d}"
            (n1, cls), (n2, jpg), (n3, meta) = members[3 * i : 3 * i + 3]
            assert (n1, n2, n3) == (f"{key}.cls", f"{key}.jpg", f"{key}.json")
            record = json.loads(meta)
            assert record == {
                "key": key,
                "label": int(cls),
                "name": CLASS_NAMES[int(cls)],
                "shard": s,
            }
            assert jpg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synth-000000.tar", "synth-000001.tar"]


def test_the_same_seed_gives_byte_identical_shards(tmp_path):
    kw = dict(shards=1, samples_per_shard=8, real_images=False, extra_fields=True)
    a = write_dataset(str(tmp_path / "a"), seed=7, **kw)
    b = write_dataset(str(tmp_path / "b"), seed=7, **kw)
    c = write_dataset(str(tmp_path / "c"), seed=8, **kw)
    data = [open(p[0], "rb").read() for p in (a, b, c)]
    assert data[0] == data[1] and data[0] != data[2]


def test_extra_fields_use_a_prefix_and_multi_part_extensions(tmp_path):
    (path,) = write_dataset(
        str(tmp_path), shards=1, samples_per_shard=2, real_images=False, extra_fields=True
    )
    names = [n for n, _ in _members(path)]
    assert names[:5] == [
        f"synth/000000000000.{ext}" for ext in ("cls", "jpg", "json", "seg.bin", "txt.gz")
    ]


def test_real_images_are_jpegs_of_the_requested_size(tmp_path):
    image = pytest.importorskip("PIL.Image")
    (path,) = write_dataset(str(tmp_path), shards=1, samples_per_shard=2, image_size=48)
    jpgs = [data for name, data in _members(path) if name.endswith(".jpg")]
    assert len(jpgs) == 2
    for data in jpgs:
        img = image.open(io.BytesIO(data))
        assert img.format == "JPEG" and img.size == (48, 48)
