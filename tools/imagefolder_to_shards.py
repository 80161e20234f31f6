#!/usr/bin/env python
"""Convert an image folder (ImageFolder layout) into WebDataset shards plus their wids index.

The layout torchvision's ``ImageFolder`` reads: one directory per class, images inside::

    ROOT/cat/0001.jpg
    ROOT/cat/0002.png
    ROOT/dog/x.jpeg
    ...

Every image becomes one sample: its file's bytes as they are (``.jpg``, ``.png`` ...; nothing
is decoded unless ``--max-side`` asks to shrink), ``.cls`` the class number (classes numbered
in sorted order, as ImageFolder does) and ``.json`` the class name and the file's path under
ROOT. Keys are the sample's position (``%08d``) in the conversion order: sorted paths, or a
seeded shuffle with ``--shuffle``, so a training set's shards are already mixed.

Shards go to OUTPUT (``out/train-%06d.tar`` or ``s3://bucket/train-%06d.tar``); the index is
written alongside as they are (default ``out/train.json``). A conversion that was killed
continues with ``--resume``: the whole shards are kept and the images they hold skipped (the
order is the same again, so that is a prefix of it).

Usage::

    python tools/imagefolder_to_shards.py ~/data/imagenet/train out/train-%06d.tar \\
        --maxcount 5000 --shuffle --seed 0
    python tools/imagefolder_to_shards.py ROOT out/train-%06d.tar --resume
    python tools/imagefolder_to_shards.py ROOT s3://bucket/train-%06d.tar --index out.sqlite
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
from pathlib import Path

EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""What ImageFolder counts as an image."""


def find_images(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """The classes (sorted directory names) and every image with its class number, sorted."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise SystemExit(f"{root}: no class directories (expected ROOT/CLASS/IMAGE)")
    images = []
    for label, name in enumerate(classes):
        for path in sorted((root / name).rglob("*")):
            if path.suffix.lower() in EXTENSIONS and path.is_file():
                images.append((path, label))
    return classes, images


def sample_of(key: str, path: Path, label: int, classes: list[str], root: Path, max_side: int):
    """One sample: the image file's bytes (or a shrunk JPEG), its label and where it came from."""
    ext = path.suffix.lower().lstrip(".")
    ext = "jpg" if ext == "jpeg" else ext
    data: object = path.read_bytes()
    if max_side:
        from PIL import Image

        img = Image.open(io.BytesIO(data))  # type: ignore[arg-type]
        if max(img.size) > max_side:
            img.thumbnail((max_side, max_side))
            data, ext = img.convert("RGB"), "jpg"  # the writer's Encoder makes the JPEG
    meta = {"class": classes[label], "path": str(path.relative_to(root))}
    return {"__key__": key, ext: data, "cls": label, "json": meta}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("root", type=Path, help="the image folder: ROOT/CLASS/IMAGE")
    p.add_argument("output", help="shard pattern, e.g. out/train-%%06d.tar or s3://b/t-%%06d.tar")
    p.add_argument("--index", help="index file (.json or .sqlite; default beside the shards)")
    p.add_argument("--maxcount", type=int, default=10000, help="samples per shard, at most")
    p.add_argument("--maxsize", type=float, default=1e9, help="bytes per shard, at most")
    p.add_argument("--shuffle", action="store_true", help="shuffle the images (seeded)")
    p.add_argument("--seed", type=int, default=0, help="seed of --shuffle")
    p.add_argument("--max-side", type=int, default=0, help="shrink larger images to this side")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality with --max-side")
    p.add_argument("--resume", action="store_true", help="keep whole shards, continue after")
    p.add_argument(
        "--storage-options", default="{}", help="fsspec options for a remote output (JSON)"
    )
    args = p.parse_args(argv)

    from tqdm import tqdm

    import wids

    classes, images = find_images(args.root)
    if args.shuffle:
        random.Random(args.seed).shuffle(images)
    writer = wids.ShardWriter(
        args.output,
        maxcount=args.maxcount,
        maxsize=args.maxsize,
        index=args.index or True,
        resume=args.resume,
        storage_options=json.loads(args.storage_options),
        encoder=wids.Encoder(quality=args.quality),
    )
    with writer:
        done = writer.total  # with --resume: the images already in whole shards
        bar = tqdm(total=len(images), initial=done, unit="img", desc="writing", file=sys.stderr)
        for i in range(done, len(images)):
            path, label = images[i]
            writer.write(sample_of(f"{i:08d}", path, label, classes, args.root, args.max_side))
            bar.update(1)
            bar.set_postfix(shard=writer.shard - 1, refresh=False)
        bar.close()
    index = writer.index or "(no index)"
    print(f"{len(images)} images in {len(classes)} classes -> {len(writer.written)} shards")
    print(f"index: {index}")
    print(f"read it with: wids.ShardListDataset({index!r})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # never look off this machine
    sys.exit(main())
