"""Encoding the fields of a sample by their extension: the mirror of :mod:`wids.decode`.

An :class:`Encoder` takes a sample dict as a writer receives it (``"__key__"`` plus fields
named by extension, ``"jpg"`` or ``".jpg"``) and returns a dict whose fields are ``bytes``.
A field is looked up by its whole extension first (``"seg.png"``), then by its last part
(``"png"``), case-insensitively. Each extension accepts only the types it can store
faithfully; anything else is an :class:`~wids.errors.EncodeError` naming the key and field.

- ``bytes``, ``bytearray``, ``memoryview``: stored as they are, for every extension;
- images (``jpg jpeg png webp ppm pgm pbm pnm tif tiff bmp gif``): a ``PIL.Image.Image``, a
  numpy array (``H×W`` or ``H×W×C``, C in 1, 3, 4) or a torch tensor (``H×W`` or ``C×H×W``),
  ``uint8``, or float in ``[0, 1]`` (scaled to ``uint8``); JPEG and WebP at ``quality``;
- ``txt text`` and extensions with no encoder of their own: ``str`` as UTF-8;
- ``cls cls2 index class id count``: an ``int`` (not ``bool``) or a ``str``;
- ``json jsn``: a dict, list, number, bool or ``None`` (``json.dumps``), or a ``str``, taken
  to be JSON text already;
- ``npy``: a numpy array or torch tensor (``numpy.save``; object arrays refused, as they would
  be pickled);
- ``msgpack mp``: anything msgpack packs (needs ``msgpack``);
- ``*.gz``: the inner extension's encoding, gzipped with a zero timestamp (deterministic);
- ``pyd pickle pkl`` (``pickle.dumps``) and ``pt pth`` (``torch.save``): only with
  ``allow_pickle=True``, since whoever decodes them runs the pickle.

Keys starting with ``_`` (``__key__``, ``__url__`` ...) are metadata and pass through unchanged.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable, Mapping
from typing import Any

from .errors import EncodeError, WidsError

__all__ = ["IMAGE_FORMATS", "Encoder", "default_encoders"]

FieldEncoder = Callable[[Any], bytes]

IMAGE_FORMATS: dict[str, str] = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "ppm": "PPM",
    "pgm": "PPM",
    "pbm": "PPM",
    "pnm": "PPM",
    "tif": "TIFF",
    "tiff": "TIFF",
    "bmp": "BMP",
    "gif": "GIF",
}
"""Image extensions and the Pillow format each is saved in."""

_PICKLE = frozenset(("pyd", "pickle", "pkl", "pt", "pth"))
_CLASS = ("cls", "cls2", "index", "class", "id", "count")
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _to_array(value: Any, channels_first: bool) -> Any:
    """A torch tensor as a numpy array (``C×H×W`` moved to ``H×W×C`` for images)."""
    arr = value.detach().cpu().numpy()
    if channels_first and arr.ndim == 3:
        arr = arr.transpose(1, 2, 0)
    return arr


def _image_encoder(fmt: str, quality: int) -> FieldEncoder:
    options = {"quality": quality} if fmt in ("JPEG", "WEBP") else {}

    def encode(value: Any) -> bytes:
        try:
            from PIL import Image
        except ImportError as e:
            from .extras import missing

            raise missing("PIL", f"encoding {fmt} images", e) from None

        if _is_torch(value):
            value = _to_array(value, channels_first=True)
        if not isinstance(value, Image.Image):
            value = Image.fromarray(_image_array(value))
        buf = io.BytesIO()
        try:
            value.save(buf, format=fmt, **options)
        except (OSError, ValueError, KeyError) as e:  # e.g. "cannot write mode RGBA as JPEG"
            raise EncodeError(f"cannot save a {value.mode} image as {fmt}: {e}") from None
        return buf.getvalue()

    return encode


def _image_array(value: Any) -> Any:
    import numpy as np

    if not isinstance(value, np.ndarray):
        raise EncodeError(
            f"an image field takes a PIL image, numpy array or torch tensor, not "
            f"{type(value).__name__}"
        )
    if value.ndim == 3 and value.shape[2] == 1:
        value = value[:, :, 0]
    if value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (3, 4)):
        raise EncodeError(f"an image array must be H×W or H×W×C (C in 1, 3, 4), not {value.shape}")
    if value.dtype == np.uint8:
        return value
    if value.dtype.kind == "f":
        lo, hi = (float(value.min()), float(value.max())) if value.size else (0.0, 0.0)
        if not (lo >= 0.0 and hi <= 1.0):
            raise EncodeError(f"a float image must lie in [0, 1], found {lo} .. {hi}")
        return (value * 255.0 + 0.5).astype(np.uint8)
    raise EncodeError(f"an image array must be uint8 or float in [0, 1], not {value.dtype}")


def _text(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    raise EncodeError(f"a text field takes a str, not {type(value).__name__}")


def _class(value: Any) -> bytes:
    import numpy as np

    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value)).encode("ascii")
    raise EncodeError(f"a class field takes an int or str, not {type(value).__name__}")


def _json(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if not isinstance(value, (dict, list, tuple, int, float, bool, type(None))):
        raise EncodeError(f"a JSON field takes a dict, list or number, not {type(value).__name__}")
    try:
        return json.dumps(value, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:
        raise EncodeError(f"not JSON-serialisable: {e}") from None


def _npy(value: Any) -> bytes:
    import numpy as np

    if _is_torch(value):
        value = _to_array(value, channels_first=False)
    if not isinstance(value, (np.ndarray, np.generic)):
        raise EncodeError(f"an npy field takes a numpy array, not {type(value).__name__}")
    arr = np.asarray(value)
    if arr.dtype.hasobject:
        raise EncodeError("an object array would be pickled; npy fields hold plain dtypes only")
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _msgpack(value: Any) -> bytes:
    try:
        import msgpack
    except ImportError as e:
        from .extras import missing

        raise missing("msgpack", "encoding msgpack", e) from None
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise EncodeError(f"msgpack cannot pack it: {e}") from None
    return packed


def _pickle(value: Any) -> bytes:
    import pickle

    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _torch_save(value: Any) -> bytes:
    try:
        import torch
    except ImportError as e:
        from .extras import missing

        raise missing("torch", "encoding .pt/.pth fields", e) from None

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def default_encoders(
    *, quality: int = 95, allow_pickle: bool = False
) -> dict[str, FieldEncoder | None]:
    """The built-in encoders by extension (lower case, no leading dot).

    Args:
        quality: JPEG and WebP quality (1..100).
        allow_pickle: Include the pickling encoders (``pyd pickle pkl pt pth``); when off those
            extensions map to ``None``, which :class:`Encoder` refuses for non-bytes values.

    Returns:
        A new dict; change it freely.

    Raises:
        ValueError: ``quality`` is outside 1..100.
    """
    if not (isinstance(quality, int) and 1 <= quality <= 100):
        raise ValueError(f"quality must be an int in 1..100, not {quality!r}")
    table: dict[str, FieldEncoder | None] = {
        ext: _image_encoder(fmt, quality) for ext, fmt in IMAGE_FORMATS.items()
    }
    table.update(dict.fromkeys(("txt", "text"), _text))
    table.update(dict.fromkeys(_CLASS, _class))
    table.update(dict.fromkeys(("json", "jsn"), _json))
    table["npy"] = _npy
    table.update(dict.fromkeys(("msgpack", "mp"), _msgpack))
    if allow_pickle:
        table.update(dict.fromkeys(("pyd", "pickle", "pkl"), _pickle))
        table.update(dict.fromkeys(("pt", "pth"), _torch_save))
    else:
        table.update(dict.fromkeys(_PICKLE, None))
    return table


class Encoder:
    """Encode a sample's fields by extension, for :class:`~wids.TarWriter` and ShardWriter.

    Args:
        quality: JPEG and WebP quality (1..100).
        allow_pickle: Pickle values of ``.pyd/.pickle/.pkl`` fields and ``torch.save`` those of
            ``.pt/.pth``. Off by default: whoever reads such fields must unpickle them.
        encoders: Extra or replacement encoders by extension without the leading dot
            (``"seg.png"`` or ``"png"``), each ``fn(value) -> bytes``.

    Example:
        >>> enc = Encoder()
        >>> enc({"__key__": "a", "cls": 3, "txt": "hi"})
        {'__key__': 'a', 'cls': b'3', 'txt': b'hi'}
    """

    def __init__(
        self,
        *,
        quality: int = 95,
        allow_pickle: bool = False,
        encoders: Mapping[str, FieldEncoder] | None = None,
    ) -> None:
        self.quality = quality
        self.allow_pickle = bool(allow_pickle)
        self._table = default_encoders(quality=quality, allow_pickle=self.allow_pickle)
        self._user: dict[str, FieldEncoder] = {}
        for ext, fn in (encoders or {}).items():
            self.register(ext, fn)

    def __getstate__(self) -> dict[str, Any]:
        # the built-in table holds closures; rebuild it on the other side
        return {"quality": self.quality, "allow_pickle": self.allow_pickle, "_user": self._user}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table = default_encoders(quality=self.quality, allow_pickle=self.allow_pickle)

    def __repr__(self) -> str:
        return f"Encoder(quality={self.quality}, allow_pickle={self.allow_pickle})"

    def register(self, extension: str, fn: FieldEncoder) -> Encoder:
        """Encode fields with this extension by ``fn(value) -> bytes``.

        Returns:
            ``self``, so calls chain.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        if not callable(fn):
            raise TypeError(f"encoder for {extension!r} must be callable")
        self._user[extension.lstrip(".").lower()] = fn
        return self

    def _lookup(self, ext: str) -> tuple[bool, FieldEncoder | None]:
        last = ext.rsplit(".", 1)[-1]
        for table in (self._user, self._table):
            for candidate in (ext, last):
                if candidate in table:
                    return True, table[candidate]
        return False, None

    def encode_field(self, field: str, value: Any) -> bytes:
        """Encode one value given its field name (``"jpg"``, ``".seg.png"``, ``"txt.gz"`` ...).

        Raises:
            EncodeError: The extension takes no value of this type (or pickling is off).
        """
        if isinstance(value, bytes):
            return value
        if isinstance(value, _BYTES_LIKE):
            return bytes(memoryview(value).cast("B"))
        ext = field.lstrip(".").lower()
        found, fn = self._lookup(ext)
        if not found and (ext == "gz" or ext.endswith(".gz")):
            inner = ext[:-3]
            data = self.encode_field(inner, value) if inner else self._plain(value)
            return gzip.compress(data, compresslevel=6, mtime=0)
        if fn is None and found:
            raise EncodeError(
                "this field would be pickled, and whoever reads it unpickles it; pass "
                "allow_pickle=True to the Encoder if that is intended"
            )
        if fn is None:
            return self._plain(value)
        out = fn(value)
        if not isinstance(out, bytes):
            if isinstance(out, _BYTES_LIKE):
                return bytes(memoryview(out).cast("B"))
            raise EncodeError(f"the encoder for {ext!r} returned {type(out).__name__}, not bytes")
        return out

    @staticmethod
    def _plain(value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode("utf-8")
        raise EncodeError(
            f"no encoder for this extension takes {type(value).__name__}; give bytes or str, "
            "or register an encoder"
        )

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """Return a copy of ``sample`` with every non-metadata field encoded to ``bytes``.

        Raises:
            EncodeError: A field could not be encoded; names the key and field.
        """
        out: dict[str, Any] = {}
        for field, value in sample.items():
            if not isinstance(field, str) or field.startswith("_") or isinstance(value, bytes):
                out[field] = value
                continue
            try:
                out[field] = self.encode_field(field, value)
            except Exception as e:
                why = e.message if isinstance(e, WidsError) else f"{type(e).__name__}: {e}"
                where = f"sample {sample.get('__key__')!r} field {field!r}"
                raise EncodeError(f"{where}: {why}") from None if isinstance(e, WidsError) else e
        return out
