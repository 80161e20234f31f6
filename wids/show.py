"""Looking at samples: a text table of keys, fields and labels, or a grid image of them.

Used by ``wids show``. Samples are read raw, as ``ShardListDataset(..., transformations=[])``
reads them, through :class:`~wids.dataset.samplereader.SampleReader` (the same parts, without
torch: the command starts in a fraction of a second); only images and labels are decoded here.
Pillow is imported only when a grid is drawn.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .decode import IMAGE_EXTENSIONS
from .storage import escape_controls

__all__ = ["read_samples", "render_grid", "sample_label", "samples_table"]

_LABEL_FIELDS = (".cls", ".cls2", ".index", ".label")
_NAME_KEYS = ("name", "class_name", "classname", "label_name", "class")


def read_samples(
    index: str,
    *,
    start: int = 0,
    n: int = 16,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
    offline: bool = False,
    url_map: Mapping[str, str] | None = None,
    allow_local_shards: bool = False,
) -> list[dict[str, Any]]:
    """Raw samples ``start .. start + n - 1`` of a dataset (fewer at its end).

    Args:
        index: Path or URL of an index or description, as ``ShardListDataset`` takes it.
        start: First sample (negative counts from the end).
        n: How many samples.
        storage_options: fsspec options for the index and the shards.
        cache_dir: Local shard cache to read from (and fill), or ``None``.
        offline: Serve only from local files and ``cache_dir``; never touch the network.
        url_map: Read shards from a mirror (``{"https://old/": "s3://new/"}``), as
            ``ShardListDataset`` does.
        allow_local_shards: Let a remote index name local files, as ``ShardListDataset``.

    Returns:
        Sample dicts whose fields are ``bytes``.

    Raises:
        IndexError: ``start`` is outside the dataset.
        ValueError: ``n`` is not positive.
    """
    from .dataset import SampleReader

    if n < 1:
        raise ValueError(f"n must be >= 1, not {n}")
    ds = SampleReader(
        index,
        storage_options=storage_options,
        cache_dir=cache_dir,
        offline=offline,
        url_map=url_map,
        allow_local_shards=allow_local_shards,
    )
    try:
        total = len(ds)
        first = start + total if start < 0 else start
        if not 0 <= first < total:
            raise IndexError(f"start {start} is outside the dataset ({total} samples)")
        return ds.read(list(range(first, min(first + n, total))))
    finally:
        ds.close()


def _fields(sample: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in sample if k.startswith("."))


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8", "replace").strip()


def sample_label(sample: Mapping[str, Any]) -> str:
    """The sample's label as text: ``".cls"`` (or similar) and a class name from ``".json"``.

    Returns ``"3 (blue)"``, ``"3"``, ``"blue"`` or ``""`` when the sample has no label.
    """
    label = next((_text(sample[f]) for f in _LABEL_FIELDS if f in sample), "")
    name = ""
    if ".json" in sample:
        try:
            meta = json.loads(bytes(sample[".json"]))
        except ValueError:
            meta = None
        if isinstance(meta, dict):
            name = next((str(meta[k]) for k in _NAME_KEYS if isinstance(meta.get(k), str)), "")
            if not label and isinstance(meta.get("label"), int):
                label = str(meta["label"])
    if label and name:
        return f"{label} ({name})"
    return label or name


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1e3:.1f} KB"
    return f"{n / 1e6:.1f} MB"


def samples_table(samples: Sequence[Mapping[str, Any]]) -> str:
    """A text table: index, key, each field with its size, and the label.

    Keys, field names and labels come from the shards: control characters in them (ANSI or
    OSC escape sequences, carriage returns ...) are shown escaped, never sent to the terminal.
    """
    rows: list[tuple[str, ...]] = [("index", "key", "fields", "label")]
    for s in samples:
        fields = "  ".join(f"{f} {_size(len(s[f]))}" for f in _fields(s))
        row = (str(s.get("__index__", "")), str(s["__key__"]), fields, sample_label(s))
        rows.append(tuple(escape_controls(c) for c in row))
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    lines = [
        f"{r[0]:>{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip()
        for r in rows
    ]
    return "\n".join(lines)


def _image_field(sample: Mapping[str, Any]) -> str | None:
    for f in _fields(sample):
        if f.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS:
            return f
    return None


def _fit(text: str, font: Any, width: int, draw: Any) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def render_grid(
    samples: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    cell: int = 160,
    columns: int | None = None,
) -> tuple[int, int]:
    """Draw the samples' images in a grid with each key and label underneath; save as ``path``.

    The image is the first field with an image extension (``.jpg``, ``.seg.png`` ...);
    samples without one, or whose image does not decode, get a grey tile saying so.

    Args:
        samples: Raw samples (fields as ``bytes``), e.g. from :func:`read_samples`.
        path: Output file; Pillow picks the format from the suffix (``.png``, ``.jpg``).
            Published atomically: a symbolic link at ``path`` is replaced, never written
            through.
        cell: Side of each image tile in pixels.
        columns: Tiles per row (default: about square).

    Returns:
        The grid's ``(width, height)`` in pixels.

    Raises:
        ValueError: No samples, a bad ``cell``/``columns``, or a suffix Pillow does not know.
    """
    try:
        from PIL import Image, ImageDraw, ImageFont, ImageOps
    except ImportError as e:
        from .extras import missing

        raise missing("PIL", "drawing a grid (wids show --grid)", e) from None
    if not samples:
        raise ValueError("no samples to draw")
    if cell < 32 or (columns is not None and columns < 1):
        raise ValueError(f"cell must be >= 32 and columns >= 1, not {cell}, {columns}")
    cols = columns or math.ceil(math.sqrt(len(samples)))
    rows = math.ceil(len(samples) / cols)
    font_size = max(10, cell // 13)
    try:
        font: Any = ImageFont.load_default(size=font_size)
    except TypeError:  # Pillow < 10.1: one fixed-size bitmap font
        font = ImageFont.load_default()
    pad, text_h = 6, 2 * (font_size + 4)
    tile_w, tile_h = cell + 2 * pad, cell + text_h + 2 * pad
    grid = Image.new("RGB", (cols * tile_w, rows * tile_h), (250, 250, 250))
    draw = ImageDraw.Draw(grid)
    for k, sample in enumerate(samples):
        x, y = (k % cols) * tile_w + pad, (k // cols) * tile_h + pad
        field = _image_field(sample)
        img: Image.Image | None = None
        if field is not None:
            try:
                img = Image.open(io.BytesIO(bytes(sample[field]))).convert("RGB")
                img = ImageOps.contain(img, (cell, cell))  # small images are scaled up too
            except Exception:  # any undecodable payload becomes a grey tile
                img = None
        if img is None:
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=(200, 200, 200))
            msg = "no image" if field is None else f"bad {field}"
            draw.text((x + 4, y + cell // 2 - font_size), msg, fill=(80, 80, 80), font=font)
        else:
            grid.paste(img, (x + (cell - img.width) // 2, y + (cell - img.height) // 2))
        key = _fit(escape_controls(str(sample["__key__"])), font, cell, draw)
        label = _fit(escape_controls(sample_label(sample)) or "-", font, cell, draw)
        draw.text((x, y + cell + 2), key, fill=(0, 0, 0), font=font)
        draw.text((x, y + cell + font_size + 6), label, fill=(40, 40, 160), font=font)
    out = os.fspath(path)
    kind = Image.registered_extensions().get(os.path.splitext(out)[1].lower())
    if kind is None:
        raise ValueError(f"unknown file extension: {os.path.splitext(out)[1]!r} (use .png, .jpg)")
    data = io.BytesIO()
    grid.save(data, format=kind)
    # published whole under a temporary name: a link at ``out`` is replaced, not written
    # through (to whatever file it points at), and a failed save leaves ``out`` as it was
    from .atomic import atomic_write

    with atomic_write(out, "wb") as f:
        f.write(data.getbuffer())
    return grid.size
