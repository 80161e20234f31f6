"""Encoders by extension: every value comes back through the Decoder; wrong types are errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from wids.decode import Decoder
from wids.encode import Encoder, default_encoders
from wids.errors import EncodeError, WidsError


def roundtrip(field, value, *, image="numpy", **kw):
    data = Encoder(**kw).encode_field(field, value)
    assert isinstance(data, bytes)
    return Decoder(image, allow_pickle=kw.get("allow_pickle", False)).decode_field(field, data)


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 3), (5, 7, 4), (5, 7, 1)])
def test_png_from_uint8_arrays_is_exact(shape):
    arr = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    out = roundtrip(".png", arr)
    assert np.array_equal(out, arr.reshape(shape[:2]) if shape[-1:] == (1,) else arr)


def test_float_images_in_unit_range_are_scaled():
    arr = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(roundtrip("png", arr), (arr * 255 + 0.5).astype(np.uint8))


def test_torch_tensors_are_channels_first():
    torch = pytest.importorskip("torch")
    arr = np.random.default_rng(1).integers(0, 256, (3, 6, 5), dtype=np.uint8)
    out = roundtrip("seg.png", torch.from_numpy(arr))
    assert np.array_equal(out, arr.transpose(1, 2, 0))
    npy = roundtrip("npy", torch.arange(6, dtype=torch.int16).reshape(2, 3))
    assert npy.dtype == np.int16 and npy.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_jpeg_from_pil_and_arrays_decodes_to_the_same_size():
    from PIL import Image

    arr = np.full((16, 24, 3), 128, np.uint8)
    assert roundtrip("jpg", arr).shape == (16, 24, 3)
    img = Image.fromarray(arr)
    assert roundtrip("JPEG", img, image="PIL").size == (24, 16)
    noise = np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    small = Encoder(quality=10).encode_field("jpg", noise)
    assert len(small) < len(Encoder(quality=100).encode_field("jpg", noise))


def test_plain_types():
    assert roundtrip("cls", 7) == 7
    assert roundtrip("cls", np.int64(3)) == 3
    assert roundtrip("txt", "héllo") == "héllo"
    assert roundtrip("json", {"a": [1, 2.5, None, True]}) == {"a": [1, 2.5, None, True]}
    assert roundtrip("json", '{"already": "json"}') == {"already": "json"}
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = roundtrip("npy", arr)
    assert out.dtype == arr.dtype and np.array_equal(out, arr)
    assert roundtrip("txt.gz", "zipped") == "zipped"
    assert roundtrip("unknown", "text") == b"text"
    assert (
        roundtrip("bin", memoryview(np.arange(3, dtype=np.int32)))
        == np.arange(3, dtype=np.int32).tobytes()
    )


def test_msgpack():
    pytest.importorskip("msgpack")
    assert roundtrip("msgpack", {"a": [1, "x"]}) == {"a": [1, "x"]}


def test_gzip_is_deterministic():
    enc = Encoder()
    assert enc.encode_field("json.gz", {"a": 1}) == enc.encode_field("json.gz", {"a": 1})


def test_bytes_pass_through_for_every_extension():
    for field in ("jpg", "npy", "pkl", "cls", "weird.ext"):
        assert Encoder().encode_field(field, b"\x00raw") == b"\x00raw"


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("jpg", 3, "PIL image"),
        ("png", np.zeros((2, 2), np.int32), "uint8"),
        ("png", np.full((2, 2), 1.5), "[0, 1]"),
        ("png", np.zeros((2, 2, 2), np.uint8), "H×W×C"),
        ("jpg", np.zeros((4, 4, 4), np.uint8), "RGBA"),
        ("npy", "text", "numpy array"),
        ("npy", np.array([object()]), "pickled"),
        ("cls", True, "int or str"),
        ("cls", 1.5, "int or str"),
        ("txt", 5, "str"),
        ("json", {1, 2}, "JSON"),
        ("json", {"x": float("nan")}, "JSON"),
        ("weird", 5, "register an encoder"),
        ("pkl", {"a": 1}, "allow_pickle"),
        ("pth", {"a": 1}, "allow_pickle"),
    ],
)
def test_wrong_types_are_errors_naming_key_and_field(field, value, words):
    with pytest.raises(EncodeError) as e:
        Encoder()({"__key__": "k17", field: value})
    assert isinstance(e.value, WidsError) and isinstance(e.value, ValueError)
    assert "'k17'" in str(e.value) and repr(field) in str(e.value)
    assert words in str(e.value)


def test_pickle_only_when_allowed():
    data = Encoder(allow_pickle=True).encode_field("pyd", {"a": (1, 2)})
    assert pickle.loads(data) == {"a": (1, 2)}
    torch = pytest.importorskip("torch")
    out = roundtrip("pth", {"t": torch.arange(3)}, allow_pickle=True)
    assert out["t"].tolist() == [0, 1, 2]


def test_metadata_and_registered_encoders():
    enc = Encoder(encoders={"seg.png": lambda v: b"custom"})
    out = enc({"__key__": "k", "__url__": "x", "seg.png": object(), "cls": 1})
    assert out == {"__key__": "k", "__url__": "x", "seg.png": b"custom", "cls": b"1"}
    bad = Encoder(encoders={"foo": lambda v: 123})
    with pytest.raises(EncodeError, match="returned int"):
        bad({"__key__": "k", "foo": 1})
    with pytest.raises(TypeError):
        Encoder().register("x", "not callable")  # type: ignore[arg-type]


def test_encoder_pickles_and_validates_quality():
    enc = pickle.loads(pickle.dumps(Encoder(quality=50, allow_pickle=True)))
    assert enc.quality == 50 and enc.allow_pickle
    assert enc.encode_field("cls", 2) == b"2"
    with pytest.raises(ValueError):
        default_encoders(quality=0)
