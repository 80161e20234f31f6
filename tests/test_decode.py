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


# -- decompression bombs (issue 21, item 9) ----------------------------------------------------


def _gzip_zeros(mib: int) -> bytes:
    import zlib

    c = zlib.compressobj(9, wbits=31)
    block = b"\0" * 2**20
    return b"".join([c.compress(block) for _ in range(mib)] + [c.flush()])


def _png_of(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("1", (width, height)).save(out, "PNG")  # 1 bit per pixel: small to make
    return out.getvalue()


def _npy_header_only(shape: tuple[int, ...]) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    return out.getvalue()


def _peak_mib(fn) -> float:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
    except DecodeError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 2**20


def test_a_gzip_bomb_is_refused_at_256_mib_by_default():
    bomb = _gzip_zeros(257)  # 257 MiB of text from 250 KB
    assert len(bomb) < 300_000
    sample = {"__key__": "k/1", "__shard__": "s.tar", ".txt.gz": bomb}
    peak = _peak_mib(lambda: Decoder()(sample))
    assert peak < 256 + 64  # the limit and a step, not twice the limit
    small = Decoder(max_decompressed=2**20)
    for field in (".txt.gz", ".json.gz", ".bin.gz"):
        sample = {"__key__": "k/1", "__shard__": "s.tar", field: _gzip_zeros(2)}
        with pytest.raises(DecodeError) as e:
            small(sample)
        assert "k/1" in str(e.value) and field in str(e.value) and e.value.shard == "s.tar"
        assert "max_decompressed" in str(e.value)


def test_the_decompressed_bound_is_configurable_and_exact():
    data = b"abc" * 1000
    small = Decoder(max_decompressed=3000)
    assert small({"__key__": "k", ".txt.gz": gzip.compress(data)})[".txt.gz"] == data.decode()
    with pytest.raises(DecodeError, match="more than 2,999 bytes"):
        Decoder(max_decompressed=2999)({"__key__": "k", ".txt.gz": gzip.compress(data)})
    two = gzip.compress(b"ab") + gzip.compress(b"cd") + b"\0" * 8  # members, padding
    assert small({"__key__": "k", ".txt.gz": two})[".txt.gz"] == "abcd"
    unbounded = Decoder(max_decompressed=None)
    assert unbounded({"__key__": "k", ".x.gz": gzip.compress(data)})[".x.gz"] == data
    with pytest.raises(ValueError, match="max_decompressed"):
        Decoder(max_decompressed=0)


def test_an_image_over_the_pixel_bound_is_refused_before_decoding():
    png = _png_of(13000, 13000)  # 169 megapixels: Pillow only warns
    with pytest.raises(DecodeError) as e:
        Decoder()({"__key__": "big", ".png": png})
    assert "big" in str(e.value) and ".png" in str(e.value) and "max_pixels" in str(e.value)
    assert _peak_mib(lambda: Decoder()({"__key__": "big", ".png": png})) < 8
    assert Decoder(max_pixels=None)({"__key__": "big", ".png": png})[".png"].size == (13000, 13000)
    small = _png_of(40, 30)
    assert Decoder(max_pixels=1200)({"__key__": "k", ".png": small})[".png"].size == (40, 30)
    with pytest.raises(DecodeError, match="1,200 pixels"):
        Decoder(max_pixels=1199)({"__key__": "k", ".png": small})


def test_a_npy_header_declaring_more_than_its_bytes_allocates_nothing():
    fake = _npy_header_only((2**27,))  # 1 GiB of float64 declared, none present
    with pytest.raises(DecodeError, match="declares"):
        Decoder()({"__key__": "k", ".npy": fake})
    assert _peak_mib(lambda: Decoder()({"__key__": "k", ".npy": fake})) < 8
    arr = np.arange(5.0)
    buf = io.BytesIO()
    np.save(buf, arr)
    assert (Decoder()({"__key__": "k", ".npy": buf.getvalue()})[".npy"] == arr).all()


def test_a_bomb_in_a_real_shard_is_a_decode_error_of_that_sample_only(tmp_path):
    from tarfixtures import write_shard

    from wids import ShardListDataset, build_index

    members = [
        ("000000.txt.gz", gzip.compress(b"fine")),
        ("000001.txt.gz", _gzip_zeros(300)),
        ("000002.png", _png_of(13000, 13000)),
        ("000003.txt", b"after"),
    ]
    shard = write_shard(tmp_path / "s.tar", members)
    build_index([str(shard)], str(tmp_path / "i.json"))
    ds = ShardListDataset(str(tmp_path / "i.json"))
    assert ds[0][".txt.gz"] == "fine" and ds[3][".txt"] == "after"
    for i, field in ((1, ".txt.gz"), (2, ".png")):
        with pytest.raises(DecodeError) as e:
            ds[i]
        assert f"{i:06d}" in str(e.value) and field in str(e.value) and "s.tar" in str(e.value)
