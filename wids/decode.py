"""Decoding the fields of a sample by their extension.

A :class:`Decoder` is a sample transformation: it takes the sample dict the dataset produced
(field values are ``bytes``; the reference's ``io.BytesIO`` values are accepted too) and returns
a new dict whose fields are decoded by extension. Keys never change: ``".txt.gz"`` stays
``".txt.gz"`` and holds the decoded text.

Extensions (case-insensitive; a field is looked up by its whole extension first, ``"seg.png"``,
then by its last part, ``"png"``):

- images (``jpg jpeg png webp ppm pgm pbm pnm tif tiff bmp gif``): per the image mode, see
  :data:`IMAGE_MODES`; ``"PIL"`` (the default) gives a loaded ``PIL.Image.Image``;
- ``txt text`` -> ``str``; ``cls cls2 index`` -> ``int``; ``json jsn`` -> object;
  ``npy`` -> ``numpy.ndarray`` (object arrays refused); ``msgpack mp`` -> object (needs
  ``msgpack``);
- ``*.gz`` is gunzipped, then decoded by its inner extension;
- ``pyd pickle pkl pt pth`` unpickle, which can run code: refused with
  :class:`~wids.errors.UnsafeDecodeError` unless ``allow_pickle=True``;
- anything else is left as ``bytes``.

Bounded work on crafted fields (each limit a :class:`Decoder` argument; ``None`` lifts it):

- ``max_decompressed`` (:data:`MAX_DECOMPRESSED`, 256 MiB): a ``*.gz`` field is inflated at
  most this far; a 1 MB ``.txt.gz`` that would inflate to 1 GiB stops at the limit.
- ``max_pixels`` (:data:`MAX_PIXELS`, 89,478,485: an 8-bit RGB image of 256 MiB, the size at
  which Pillow itself starts warning of a decompression bomb): checked from the image's header,
  before its pixels are decoded.
- a ``.npy`` header whose shape needs more bytes than the field holds is refused before numpy
  allocates the array.

A field over a limit is a :class:`~wids.errors.DecodeError` naming the sample's key, the field
and the limit; the sample's other fields and other samples are unaffected.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import DecodeError, UnsafeDecodeError, WidsError
from .extras import missing

__all__ = [
    "IMAGE_EXTENSIONS",
    "IMAGE_MODES",
    "MAX_DECOMPRESSED",
    "MAX_PIXELS",
    "PICKLE_EXTENSIONS",
    "Decoder",
    "default_decoders",
    "interpret_transformations",
]

FieldDecoder = Callable[[bytes], Any]

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    "jpg jpeg png webp ppm pgm pbm pnm tif tiff bmp gif".split()
)
PICKLE_EXTENSIONS: frozenset[str] = frozenset("pyd pickle pkl pt pth".split())

MAX_DECOMPRESSED = 256 * 2**20
"""Default bound on a gunzipped field (256 MiB): far above any text, JSON or array a sample
usually holds, far below what would take a training worker's memory."""
MAX_PIXELS = 2**30 // 4 // 3
"""Default bound on an image's pixels (89,478,485: 256 MiB as 8-bit RGB; Pillow's own
``Image.MAX_IMAGE_PIXELS``, where it only warns)."""

# mode -> (container, dtype, PIL mode); container "pil", "numpy" or "torch", dtype "uint8"
# (0..255) or "float" (float32 in 0..1). "PIL" and "numpy" keep the image's own mode, as the
# reference wids does.
IMAGE_MODES: dict[str, tuple[str, str | None, str | None]] = {
    "PIL": ("pil", None, None),
    "pil": ("pil", None, "RGB"),
    "pilrgb": ("pil", None, "RGB"),
    "pilrgba": ("pil", None, "RGBA"),
    "pill": ("pil", None, "L"),
    "numpy": ("numpy", None, None),
    "l8": ("numpy", "uint8", "L"),
    "rgb8": ("numpy", "uint8", "RGB"),
    "rgba8": ("numpy", "uint8", "RGBA"),
    "l": ("numpy", "float", "L"),
    "rgb": ("numpy", "float", "RGB"),
    "rgba": ("numpy", "float", "RGBA"),
    "torchl8": ("torch", "uint8", "L"),
    "torchrgb8": ("torch", "uint8", "RGB"),
    "torchrgba8": ("torch", "uint8", "RGBA"),
    "torchl": ("torch", "float", "L"),
    "torchrgb": ("torch", "float", "RGB"),
    "torchrgba": ("torch", "float", "RGBA"),
    "torch": ("torch", "float", "RGB"),
}


def _image_decoder(mode: str, max_pixels: int | None = MAX_PIXELS) -> FieldDecoder:
    container, dtype, pil_mode = IMAGE_MODES[mode]

    def decode(data: bytes) -> Any:
        try:
            from PIL import Image
        except ImportError as e:
            raise missing("PIL", "decoding images", e) from None
        img: Image.Image = Image.open(io.BytesIO(data))  # reads the header only
        width, height = img.size
        if max_pixels is not None and width * height > max_pixels:
            img.close()
            raise DecodeError(
                f"image of {width}x{height} = {width * height:,} pixels is over the limit of "
                f"{max_pixels:,} (max_pixels; pass Decoder(max_pixels=...) to raise it)"
            )
        img.load()
        if pil_mode is not None and img.mode != pil_mode:
            img = img.convert(pil_mode)
        if container == "pil":
            return img
        import numpy as np

        arr = np.asarray(img)
        if dtype == "float":
            arr = arr.astype(np.float32) / 255.0
        if container == "numpy":
            return arr
        try:
            import torch
        except ImportError as e:
            raise missing("torch", f"image mode {mode!r}", e) from None
        if arr.ndim == 3:
            arr = arr.transpose(2, 0, 1)
        return torch.from_numpy(np.ascontiguousarray(arr))

    return decode


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


def _json(data: bytes) -> Any:
    return json.loads(data)


def _npy(data: bytes) -> Any:
    import numpy as np

    stream = io.BytesIO(data)
    try:  # the header's shape, checked before numpy allocates the array for it
        fmt = np.lib.format
        version = fmt.read_magic(stream)
        header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = header(stream)  # version 3 differs only in the header's encoding
    except (ValueError, TypeError, SyntaxError) as e:
        raise DecodeError(f"not a .npy array: {e}") from None
    need = dtype.itemsize * int(np.prod(shape, dtype=object))
    if need > len(data) - stream.tell():
        raise DecodeError(
            f".npy header declares shape {shape} of {dtype} ({need:,} bytes); the field holds "
            f"{len(data) - stream.tell():,}"
        )
    return np.load(io.BytesIO(data), allow_pickle=False)


def _msgpack(data: bytes) -> Any:
    try:
        import msgpack
    except ImportError as e:
        raise missing("msgpack", "decoding msgpack", e) from None
    return msgpack.unpackb(data, raw=False)


def _unpickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


def _torch_load(data: bytes) -> Any:
    try:
        import torch
    except ImportError as e:
        raise missing("torch", "decoding .pt/.pth fields", e) from None

    return torch.load(io.BytesIO(data), weights_only=False)


def default_decoders(
    image: str = "PIL", *, allow_pickle: bool = False, max_pixels: int | None = MAX_PIXELS
) -> dict[str, FieldDecoder | None]:
    """The built-in decoders by extension (lower case, no leading dot).

    Args:
        image: How images are decoded; a key of :data:`IMAGE_MODES`.
        allow_pickle: Include decoders that unpickle (``pyd pickle pkl pt pth``). When off,
            those extensions map to ``None``, which :class:`Decoder` turns into an
            :class:`~wids.errors.UnsafeDecodeError`.
        max_pixels: Images with more pixels are a :class:`~wids.errors.DecodeError`
            (``None``: no bound of ours).

    Returns:
        A new dict; change it freely.

    Raises:
        ValueError: For an unknown image mode.
    """
    if image not in IMAGE_MODES:
        raise ValueError(f"unknown image mode {image!r}; one of {sorted(IMAGE_MODES)}")
    table: dict[str, FieldDecoder | None] = {}
    img = _image_decoder(image, max_pixels)
    table.update(dict.fromkeys(IMAGE_EXTENSIONS, img))
    table.update(dict.fromkeys(("txt", "text"), _text))
    table.update(dict.fromkeys(("cls", "cls2", "index"), _int))
    table.update(dict.fromkeys(("json", "jsn"), _json))
    table["npy"] = _npy
    table.update(dict.fromkeys(("msgpack", "mp"), _msgpack))
    if allow_pickle:
        table.update(dict.fromkeys(("pyd", "pickle", "pkl"), _unpickle))
        table.update(dict.fromkeys(("pt", "pth"), _torch_load))
    else:
        table.update(dict.fromkeys(PICKLE_EXTENSIONS, None))
    return table


def _as_bytes(value: Any) -> Any:
    """``bytes`` for bytes-like values and readable streams; anything else unchanged."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    read = getattr(value, "read", None)
    if callable(read):
        if callable(getattr(value, "seek", None)):
            value.seek(0)
        return read()
    return value


class Decoder:
    """Decode a sample's fields by extension; use it as a transformation.

    Args:
        image: How images are decoded: ``"PIL"`` (default), ``"numpy"``, or a webdataset-style
            mode (``"rgb8"``, ``"l"``, ``"torchrgb"`` ...; see :data:`IMAGE_MODES`).
        allow_pickle: Unpickle ``.pyd/.pickle/.pkl/.pt/.pth`` fields. Unpickling data runs
            code from the shard: enable it only for shards you trust.
        decoders: Extra or replacement decoders, by extension without the leading dot
            (``"seg.png"`` or ``"png"``); ``None`` as a value leaves that extension raw.
        max_decompressed: A ``*.gz`` field inflating to more bytes is a
            :class:`~wids.errors.DecodeError` (default :data:`MAX_DECOMPRESSED`, 256 MiB;
            ``None`` for no bound).
        max_pixels: An image with more pixels is a :class:`~wids.errors.DecodeError`, found
            from its header before decoding (default :data:`MAX_PIXELS`; ``None`` leaves only
            Pillow's own ``Image.MAX_IMAGE_PIXELS``).

    Example:
        >>> dec = Decoder("rgb8").register("seg.png", lambda b: b[:4])
        >>> dec({"__key__": "k", ".txt": b"hi"})[".txt"]
        'hi'
    """

    def __init__(
        self,
        image: str = "PIL",
        *,
        allow_pickle: bool = False,
        decoders: Mapping[str, FieldDecoder | None] | None = None,
        max_decompressed: int | None = MAX_DECOMPRESSED,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        for name, limit in (("max_decompressed", max_decompressed), ("max_pixels", max_pixels)):
            if limit is not None and (not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{name} must be a positive int or None, got {limit!r}")
        self.image = image
        self.allow_pickle = bool(allow_pickle)
        self.max_decompressed = max_decompressed
        self.max_pixels = max_pixels
        self._table = self._builtin()
        self._user: dict[str, FieldDecoder | None] = {}
        for ext, fn in (decoders or {}).items():
            self.register(ext, fn)

    def _builtin(self) -> dict[str, FieldDecoder | None]:
        return default_decoders(
            self.image, allow_pickle=self.allow_pickle, max_pixels=self.max_pixels
        )

    def __getstate__(self) -> dict[str, Any]:
        # the built-in table holds closures; rebuild it on the other side
        return {k: v for k, v in self.__dict__.items() if k != "_table"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("max_decompressed", MAX_DECOMPRESSED)
        state.setdefault("max_pixels", MAX_PIXELS)
        self.__dict__.update(state)
        self._table = self._builtin()

    def register(self, extension: str, fn: FieldDecoder | None) -> Decoder:
        """Decode fields with this extension by ``fn(bytes)``; ``None`` keeps them raw.

        Returns:
            ``self``, so calls chain.

        Raises:
            TypeError: ``fn`` is neither callable nor ``None``.
        """
        if fn is not None and not callable(fn):
            raise TypeError(f"decoder for {extension!r} must be callable or None")
        self._user[extension.lstrip(".").lower()] = fn
        return self

    def __repr__(self) -> str:
        return f"Decoder(image={self.image!r}, allow_pickle={self.allow_pickle})"

    def _lookup(self, ext: str) -> tuple[bool, FieldDecoder | None]:
        """``(found, decoder)`` for an extension like ``"seg.png"`` (lower case)."""
        last = ext.rsplit(".", 1)[-1]
        for table in (self._user, self._table):
            for candidate in (ext, last):
                if candidate in table:
                    return True, table[candidate]
        return False, None

    def decode_field(self, field: str, value: Any) -> Any:
        """Decode one field's value given its key (``".jpg"``, ``".txt.gz"`` ...).

        Raises:
            UnsafeDecodeError: The field would be unpickled and ``allow_pickle`` is off.
            Exception: Whatever the field's decoder raises.
        """
        ext = field.lstrip(".").lower()
        found, fn = self._lookup(ext)
        if isinstance(value, io.RawIOBase) and fn is None and not ext.endswith("gz"):
            pickled = found and ext.rsplit(".", 1)[-1] in PICKLE_EXTENSIONS
            if not pickled:  # a large member's file (stream_over) with no decoder stays a file
                return value
        data = _as_bytes(value)
        if not found and ext.endswith("gz") and (ext == "gz" or ext.endswith(".gz")):
            data = _gunzip(data, self.max_decompressed)
            ext = ext[:-3] if ext.endswith(".gz") else ""
            if not ext:
                return data
            found, fn = self._lookup(ext)
        if fn is None:
            if found and ext.rsplit(".", 1)[-1] in PICKLE_EXTENSIONS:
                raise UnsafeDecodeError(
                    "unpickling can run code from the shard; pass allow_pickle=True (to the "
                    "dataset or the Decoder) if you trust it, or transformations=[] for raw bytes"
                )
            return data
        return fn(data)

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """Return a copy of ``sample`` with its fields decoded.

        Raises:
            DecodeError: A field could not be decoded; names the shard, key and field.
            ImportError: Decoding a field needs an optional package that is not installed
                (the message names the ``image`` extra).
        """
        out = dict(sample)
        for field, value in sample.items():
            if not isinstance(field, str) or not field.startswith("."):
                continue
            try:
                out[field] = self.decode_field(field, value)
            except Exception as e:
                key, shard = sample.get("__key__"), sample.get("__shard__")
                where = f"sample {key!r} field {field!r}"
                if isinstance(e, ImportError):  # not the data's fault: what to install
                    raise ImportError(f"{where}: {e}", name=e.name) from None
                if isinstance(e, UnsafeDecodeError):
                    raise UnsafeDecodeError(f"{where}: {e.message}", shard=shard) from None
                why = e.message if isinstance(e, WidsError) else f"{type(e).__name__}: {e}"
                raise DecodeError(f"{where}: {why}", shard=shard) from e
        return out


def _gunzip(data: bytes, limit: int | None) -> bytes:
    """``gzip.decompress(data)``, stopping with a :class:`DecodeError` past ``limit`` bytes.

    Inflated in steps of at most :data:`_STEP` bytes, so a bomb costs about ``limit`` bytes of
    memory before it is refused (one call of unbounded output would cost twice that).
    """
    if limit is None or not data:
        return gzip.decompress(data)
    out: list[bytes] = []
    total, rest = 0, data
    while True:
        inflate = zlib.decompressobj(wbits=31)  # one gzip member
        pending = rest
        while not inflate.eof:
            try:
                chunk = inflate.decompress(pending, min(_STEP, limit + 1 - total))
            except zlib.error as e:
                raise DecodeError(f"not valid gzip data: {e}") from None
            total += len(chunk)
            out.append(chunk)
            if total > limit:
                raise DecodeError(
                    f"gzip data inflates to more than {limit:,} bytes (max_decompressed; pass "
                    "Decoder(max_decompressed=...) to raise it)"
                )
            pending = inflate.unconsumed_tail
            if not chunk and not pending:
                raise DecodeError("gzip data ends before its end-of-stream marker")
        rest = inflate.unused_data
        if not rest.strip(b"\0"):  # the end, or zero padding (as gzip.decompress allows)
            return b"".join(out)
        if not rest.startswith(b"\x1f\x8b"):
            raise DecodeError("not valid gzip data: garbage after a member")


_STEP = 16 * 2**20


def interpret_transformations(
    transformations: Any, *, allow_pickle: bool = False
) -> list[Callable[[dict[str, Any]], Any]]:
    """Turn the ``transformations`` argument into a list of callables.

    Args:
        transformations: An image mode string (``"PIL"``, ``"numpy"``, ``"rgb8"`` ...), a
            callable, or a list of those; ``[]`` (or ``None``) for raw samples.
        allow_pickle: Passed to the :class:`Decoder` built for mode strings.

    Raises:
        ValueError: An unknown mode string.
        TypeError: An entry that is neither a string nor callable.
    """
    if transformations is None:
        return []
    items: Iterable[Any] = (
        transformations if isinstance(transformations, (list, tuple)) else [transformations]
    )
    out: list[Callable[[dict[str, Any]], Any]] = []
    for t in items:
        if isinstance(t, str):
            if t not in IMAGE_MODES:
                raise ValueError(
                    f"unknown transformation {t!r}; a callable or one of {sorted(IMAGE_MODES)}"
                )
            out.append(Decoder(t, allow_pickle=allow_pickle))
        elif callable(t):
            out.append(t)
        else:
            raise TypeError(f"transformations must be strings or callables, not {t!r}")
    return out
