"""Synthetic WebDataset shards for the demo, the benchmarks and the tests.

Samples have a ``.jpg`` (a real JPEG when Pillow is installed and ``real_images`` is set,
otherwise random bytes of a similar size), a ``.cls`` label and a ``.json`` record; optional
extra fields exercise multi-part extensions.
"""

from __future__ import annotations

import io
import json
import os
import random
import tarfile
from collections.abc import Sequence

__all__ = ["CLASS_NAMES", "make_image", "write_dataset", "write_shard"]

CLASS_NAMES = ("red", "green", "blue", "yellow", "cyan", "magenta", "white", "black")
_COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 70, 220),
    "yellow": (230, 210, 40),
    "cyan": (40, 200, 210),
    "magenta": (200, 50, 200),
    "white": (235, 235, 235),
    "black": (25, 25, 25),
}


def make_image(label: int, size: int, rng: random.Random) -> bytes:
    """A JPEG of a shape in the label's colour on a noisy background (needs Pillow)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError as e:
        from .extras import missing

        raise missing("PIL", "drawing synthetic images", e) from None
    colour = _COLOURS[CLASS_NAMES[label % len(CLASS_NAMES)]]
    img = Image.effect_noise((size, size), 40).convert("RGB")
    draw = ImageDraw.Draw(img)
    a, b = sorted(rng.sample(range(2, size - 2), 2))
    c, d = sorted(rng.sample(range(2, size - 2), 2))
    if label % 2:
        draw.ellipse((a, c, max(b, a + size // 4), max(d, c + size // 4)), fill=colour)
    else:
        draw.rectangle((a, c, max(b, a + size // 4), max(d, c + size // 4)), fill=colour)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def write_shard(
    path: str, members: Sequence[tuple[str, bytes]], *, format: int = tarfile.USTAR_FORMAT
) -> None:
    """Write ``(name, data)`` pairs as a tar file, atomically (temp file, then rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with tarfile.open(tmp, "w", format=format) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1700000000
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)


def write_dataset(
    directory: str,
    *,
    shards: int = 4,
    samples_per_shard: int = 100,
    image_size: int = 64,
    real_images: bool = True,
    jpg_bytes: int = 20_000,
    extra_fields: bool = False,
    prefix: str = "synth",
    seed: int = 0,
) -> list[str]:
    """Write a dataset of WebDataset shards ``{prefix}-000000.tar ...`` into ``directory``.

    Args:
        directory: Where to write the shards (created if missing).
        shards: Number of shards.
        samples_per_shard: Samples per shard.
        image_size: Side of the square images, for real JPEGs.
        real_images: Encode real JPEGs with Pillow; otherwise random bytes of ``jpg_bytes``.
        jpg_bytes: Mean size of the random ``.jpg`` payloads when not real images.
        extra_fields: Add ``.seg.png``-style multi-part fields and a gzipped text field.
        prefix: Shard file name prefix.
        seed: Seed; the same arguments give byte-identical shards.

    Returns:
        The shard paths, in order.
    """
    import gzip

    os.makedirs(directory, exist_ok=True)
    paths = []
    for s in range(shards):
        rng = random.Random(seed * 1_000_003 + s)
        members: list[tuple[str, bytes]] = []
        for i in range(samples_per_shard):
            key = f"{prefix}/{s:06d}{i:06d}" if extra_fields else f"{s:06d}{i:06d}"
            label = rng.randrange(len(CLASS_NAMES))
            if real_images:
                jpg = make_image(label, image_size, rng)
            else:
                jpg = rng.randbytes(max(1, int(rng.uniform(0.5, 1.5) * jpg_bytes)))
            meta = {"key": key, "label": label, "name": CLASS_NAMES[label], "shard": s}
            members += [
                (f"{key}.cls", str(label).encode()),
                (f"{key}.jpg", jpg),
                (f"{key}.json", json.dumps(meta).encode()),
            ]
            if extra_fields:
                members += [
                    (f"{key}.seg.bin", rng.randbytes(rng.randrange(0, 700))),
                    (f"{key}.txt.gz", gzip.compress(f"sample {key}".encode(), mtime=0)),
                ]
        path = os.path.join(directory, f"{prefix}-{s:06d}.tar")
        write_shard(path, members)
        paths.append(path)
    return paths
