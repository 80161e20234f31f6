from __future__ import annotations

import gzip
import io
import json
import pickle

import numpy as np
import pytest
from PIL import Image

from wids import DecodeError, Decoder, UnsafeDecodeError, default_decoders
from wids.decode import IMAGE_MODES, interpret_transformations


def _png(mode: str = "RGB", size: tuple[int, int] = (5, 3)) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 200).save(buf, format="PNG")
    return buf.getvalue()


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_basic_types_and_keys_unchanged():
    sample = {
        "__key__": "k",
        "__shard__": "s.tar",
        ".txt": b"hello",
        ".text": "caf\u00e9".encode(),
        ".cls": b" 7\n",
        ".json": b'{"a": [1, 2]}',
        ".npy": _npy(np.arange(4)),
        ".bin": b"\x00\x01",
    }
    out = Decoder()(sample)
    assert out[".txt"] == "hello" and out[".text"] == "caf\u00e9"
    assert out[".cls"] == 7
    assert out[".json"] == {"a": [1, 2]}
    assert np.array_equal(out[".npy"], np.arange(4))
    assert out[".bin"] == b"\x00\x01"
    assert out["__key__"] == "k" and set(out) == set(sample)
    assert sample[".txt"] == b"hello"  # the input is not modified


def test_accepts_bytesio_like_the_reference():
    out = Decoder()({".txt": io.BytesIO(b"x"), ".cls": io.BytesIO(b"3")})
    assert out == {".txt": "x", ".cls": 3}


def test_gz_decoded_by_inner_extension_and_key_kept():
    out = Decoder()(
        {
            ".txt.gz": gzip.compress(b"zipped"),
            ".json.gz": gzip.compress(b"[1]"),
            ".gz": gzip.compress(b"raw"),
            ".seg.bin.gz": gzip.compress(b"\x01"),
        }
    )
    assert out == {".txt.gz": "zipped", ".json.gz": [1], ".gz": b"raw", ".seg.bin.gz": b"\x01"}


@pytest.mark.parametrize("ext", ["pyd", "pickle", "pkl", "pth", "pt"])
def test_pickle_refused_by_default(ext):
    with pytest.raises(UnsafeDecodeError, match="allow_pickle=True") as e:
        Decoder()({"__key__": "k1", "__shard__": "s.tar", f".{ext}": pickle.dumps([1])})
    assert e.value.shard == "s.tar" and "k1" in str(e.value) and ext in str(e.value)
    with pytest.raises(UnsafeDecodeError):
        Decoder()({f".{ext}.gz": gzip.compress(pickle.dumps([1]))})


def test_pickle_when_allowed():
    out = Decoder(allow_pickle=True)({".pyd": pickle.dumps({"a": 1}), ".pkl": pickle.dumps(2)})
    assert out == {".pyd": {"a": 1}, ".pkl": 2}


def test_torch_pth_when_allowed():
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(torch.arange(3), buf)
    out = Decoder(allow_pickle=True)({".pth": buf.getvalue()})
    assert torch.equal(out[".pth"], torch.arange(3))


def test_msgpack():
    msgpack = pytest.importorskip("msgpack")
    data = msgpack.packb({"a": [1, "b"]})
    assert Decoder()({".mp": data, ".msgpack": data}) == {
        ".mp": {"a": [1, "b"]},
        ".msgpack": {"a": [1, "b"]},
    }


def test_errors_name_shard_key_and_field():
    with pytest.raises(DecodeError) as e:
        Decoder()({"__key__": "s/0001", "__shard__": "x.tar", ".json": b"{nope"})
    msg = str(e.value)
    assert e.value.shard == "x.tar" and "s/0001" in msg and ".json" in msg
    assert isinstance(e.value, ValueError)
    with pytest.raises(DecodeError, match=r"\.png"):
        Decoder()({"__key__": "k", ".png": b"not an image"})


def test_images_pil_and_numpy():
    png = _png("RGB")
    img = Decoder()({".png": png})[".png"]
    assert isinstance(img, Image.Image) and img.size == (5, 3)
    arr = Decoder("numpy")({".seg.png": _png("L")})[".seg.png"]
    assert arr.shape == (3, 5) and arr.dtype == np.uint8  # "numpy" keeps the image's mode


@pytest.mark.parametrize(
    "mode,shape,dtype",
    [
        ("rgb8", (3, 5, 3), np.uint8),
        ("l8", (3, 5), np.uint8),
        ("rgba8", (3, 5, 4), np.uint8),
        ("rgb", (3, 5, 3), np.float32),
        ("l", (3, 5), np.float32),
    ],
)
def test_numpy_image_modes(mode, shape, dtype):
    arr = Decoder(mode)({".jpg": _png("L")})[".jpg"]
    assert arr.shape == shape and arr.dtype == dtype
    if dtype == np.float32:
        assert 0.0 <= arr.min() <= arr.max() <= 1.0


@pytest.mark.parametrize(
    "mode,shape", [("torchrgb", (3, 3, 5)), ("torchl", (3, 5)), ("torchrgb8", (3, 3, 5))]
)
def test_torch_image_modes(mode, shape):
    torch = pytest.importorskip("torch")
    t = Decoder(mode)({".png": _png("RGB")})[".png"]
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == shape
    assert t.dtype == (torch.uint8 if mode.endswith("8") else torch.float32)


def test_pil_modes_convert():
    img = Decoder("pilrgba")({".png": _png("L")})[".png"]
    assert img.mode == "RGBA"


def test_register_by_full_and_last_extension():
    dec = Decoder().register("seg.png", lambda b: "seg").register(".bin", len)
    out = dec({".seg.png": b"x", ".png": _png(), ".bin": b"abc", ".txt": None or b"t"})
    assert out[".seg.png"] == "seg" and isinstance(out[".png"], Image.Image)
    assert out[".bin"] == 3 and out[".txt"] == "t"
    assert Decoder(decoders={"txt": None})({".txt": b"raw"}) == {".txt": b"raw"}
    with pytest.raises(TypeError):
        Decoder().register("x", 3)  # type: ignore[arg-type]


def test_extension_case_insensitive():
    assert Decoder()({".TXT": b"a"}) == {".TXT": "a"}


def test_default_decoders_table():
    t = default_decoders()
    assert t["pkl"] is None and callable(t["jpg"])
    assert callable(default_decoders(allow_pickle=True)["pkl"])
    with pytest.raises(ValueError):
        default_decoders("bogus")


def test_interpret_transformations():
    assert interpret_transformations([]) == []
    assert interpret_transformations(None) == []
    (d,) = interpret_transformations("numpy", allow_pickle=True)
    assert isinstance(d, Decoder) and d.image == "numpy" and d.allow_pickle
    f = lambda s: s  # noqa: E731
    assert interpret_transformations(["PIL", f])[1] is f
    with pytest.raises(ValueError):
        interpret_transformations("bogus")
    with pytest.raises(TypeError):
        interpret_transformations([3])
    assert {"PIL", "numpy", "rgb8", "torchrgb", "l"} <= set(IMAGE_MODES)


def test_json_of_decoded_sample_is_plain():
    out = Decoder()({"__key__": "k", ".json": json.dumps({"x": 1}).encode()})
    assert out == {"__key__": "k", ".json": {"x": 1}}


def test_decoder_pickles():
    dec = pickle.loads(pickle.dumps(Decoder("rgb8", allow_pickle=True).register("bin", len)))
    assert dec.image == "rgb8" and dec.allow_pickle
    assert dec({".png": _png(), ".bin": b"ab"})[".png"].shape == (3, 5, 3)
    assert dec({".bin": b"ab"})[".bin"] == 2
