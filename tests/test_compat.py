"""Reference-compatibility tests: the contract written down in docs/compat.md.

Where the reference wids (webdataset==0.2.111) is installed in its own venv
(``$WIDS_REFERENCE_PYTHON``, see ``tests/reference.py``; ``tools/test.sh`` makes it), the same
description is also read by it in a subprocess and the samples are compared; otherwise those
tests are skipped.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from reference import reference_python
from tar_oracle import dataset_samples, strip_meta

import wids
from wids import ShardListDataset
from wids.synth import write_shard


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (4, 2), 7).save(buf, format="PNG")
    return buf.getvalue()


META = {"__key__", "__index__", "__shard__", "__shardindex__", "__dataset__"}


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("compat")
    lengths = [3, 5, 2]
    paths = []
    for s, n in enumerate(lengths):
        members = []
        for i in range(n):
            key = f"compressed/{s:02d}{i:02d}"
            members += [
                (f"{key}.txt", f"text {s} {i}".encode()),
                (f"{key}.cls", str(i).encode()),
                (f"{key}.seg.png", _png()),
                (f"{key}.txt.gz", gzip.compress(f"gz {s} {i}".encode(), mtime=0)),
                (f"{key}.json", json.dumps({"s": s, "i": i}).encode()),
            ]
        path = str(d / f"shard-{s:06d}.tar")
        write_shard(path, members)
        paths.append(path)
    desc = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "compat",
        "shardlist": [
            {"url": os.path.basename(p), "nsamples": n, "filesize": os.path.getsize(p)}
            for p, n in zip(paths, lengths, strict=True)
        ],
    }
    (d / "desc.json").write_text(json.dumps(desc))
    return d, paths, lengths


def _ds(dataset_dir, **kw):
    d, _, _ = dataset_dir
    kw.setdefault("transformations", [])
    return ShardListDataset(str(d / "desc.json"), **kw)


def test_names_users_import():
    from wids import ChunkedSampler, DistributedChunkedSampler, ShardedSampler  # noqa: F401

    assert "ShardListDataset" in wids.__all__


def test_lengths_and_cum_lengths(dataset_dir):
    ds = _ds(dataset_dir)
    assert ds.lengths == [3, 5, 2]
    assert list(ds.cum_lengths) == [3, 8, 10]
    assert isinstance(ds.cum_lengths, np.ndarray)
    assert ds.total_length == 10 == len(ds)
    assert [s["nsamples"] for s in ds.shards] == [3, 5, 2]
    assert ds.shards[1]["url"] == os.path.join(str(dataset_dir[0]), "shard-000001.tar")


def test_sample_keys(dataset_dir):
    ds = _ds(dataset_dir)
    s = ds[4]
    fields = {".txt", ".cls", ".seg.png", ".txt.gz", ".json"}
    assert set(s) == fields | META
    assert s["__key__"] == "compressed/0101"
    assert s["__index__"] == 4 and s["__shardindex__"] == 1
    assert s["__shard__"] == ds.shards[1]["url"]
    assert s["__dataset__"] == "compat"
    assert isinstance(s[".txt"], bytes)


def test_matches_tarfile(dataset_dir):
    _, paths, _ = dataset_dir
    ds = _ds(dataset_dir)
    assert [strip_meta(ds[i]) for i in range(len(ds))] == dataset_samples(paths)


def test_default_decoding_and_gz(dataset_dir):
    ds = _ds(dataset_dir, transformations="PIL")
    s = ds[4]
    assert s[".txt"] == "text 1 1" and s[".cls"] == 1 and s[".json"] == {"s": 1, "i": 1}
    assert s[".txt.gz"] == "gz 1 1"  # gunzipped, decoded by inner extension, key kept
    assert ".txt" in s and ".gz" not in s
    assert s[".seg.png"].size == (4, 2)


def test_transformations_forms(dataset_dir):
    def upper(sample):
        return {**sample, ".txt": sample[".txt"].upper()}

    assert _ds(dataset_dir, transformations=["PIL", upper])[0][".txt"] == "TEXT 0 0"
    assert _ds(dataset_dir, transformations="numpy")[0][".cls"] == 0
    ds = _ds(dataset_dir, transformations="PIL")
    assert ds.add_transform(upper) is ds
    assert ds[0][".txt"] == "TEXT 0 0"
    assert _ds(dataset_dir, transformations=lambda s: s["__key__"])[0] == "compressed/0000"


def test_index_errors_and_negative(dataset_dir):
    ds = _ds(dataset_dir)
    with pytest.raises(IndexError):
        ds[10]
    with pytest.raises(IndexError):
        ds[-11]
    assert ds[-1]["__key__"] == "compressed/0201"  # the dataset's last, not shard 0's
    assert ds[-10]["__key__"] == "compressed/0000"


def test_stream_input(dataset_dir):
    d, paths, _ = dataset_dir
    with open(d / "desc.json") as f:
        ds = ShardListDataset(f, transformations=[], base=str(d))
        assert len(ds) == 10
    assert strip_meta(ds[7]) == dataset_samples(paths)[7]


def test_a_stream_may_be_closed_once_the_dataset_is_made(dataset_dir):
    """``with open(p) as f: ds = ShardListDataset(f)``, then ``ds`` used: the reference read
    the stream in the constructor; ours read it on first use, from a closed file."""
    import pickle

    d, paths, _ = dataset_dir
    with open(d / "desc.json") as f:
        ds = ShardListDataset(f, transformations=[], base=str(d))
        copy = pickle.loads(pickle.dumps(ds))  # a worker's copy, made before anything was read
    assert len(ds) == 10 and strip_meta(ds[7]) == dataset_samples(paths)[7]
    assert len(copy) == 10 and strip_meta(copy[9]) == dataset_samples(paths)[9]
    with open(d / "desc.json", "rb") as f:
        binary = ShardListDataset(f, transformations=[], base=str(d))
    assert binary.lengths == [3, 5, 2]


def test_a_relative_path_names_what_it_named_when_made(dataset_dir, tmp_path, monkeypatch):
    """The reference read its description when made: an ``os.chdir`` after that (or a copy
    unpickled elsewhere) read ours from the new directory (ShardNotFoundError)."""
    import pickle

    d, paths, _ = dataset_dir
    monkeypatch.chdir(d.parent)
    made = [
        ShardListDataset(f"{d.name}/desc.json", transformations=[]),
        ShardListDataset(f"{d.name}/shard-{{000000..000002}}.tar", transformations=[]),
        ShardListDataset([f"{d.name}/shard-000001.tar"], transformations=[]),
    ]
    copies = [pickle.dumps(ds) for ds in made]
    monkeypatch.chdir(tmp_path)
    oracle = dataset_samples(paths)
    for ds in made + [pickle.loads(c) for c in copies]:
        assert strip_meta(ds[-1]) == oracle[-1 if len(ds) == 10 else 7]


def test_list_of_dicts(dataset_dir):
    _, paths, lengths = dataset_dir
    ds = ShardListDataset(
        [{"url": p, "nsamples": n} for p, n in zip(paths, lengths, strict=True)], transformations=[]
    )
    assert ds.lengths == lengths and ds[3]["__key__"] == "compressed/0100"


def test_dataset_key_is_collate_safe(dataset_dir):
    from torch.utils.data import default_collate

    ds = _ds(dataset_dir)
    batch = default_collate([ds[i] for i in range(3)])
    assert batch["__dataset__"] == ["compat"] * 3
    d, paths, lengths = dataset_dir
    plain = ShardListDataset([{"url": paths[0], "nsamples": 3}], transformations=[])
    assert plain[0]["__dataset__"] == ""
    default_collate([plain[0], plain[1]])


def test_get_stats_close_get_shard(dataset_dir):
    ds = _ds(dataset_dir)
    ds[0]
    ds[1]
    ds[5]
    accesses, misses = ds.get_stats()
    assert (accesses, misses) == (3, 2)
    shard, inner, desc = ds.get_shard(6)
    assert inner == 3 and desc["nsamples"] == 5 and len(shard) == 5
    assert shard[inner]["__key__"] == "compressed/0103"
    ds.close()
    assert ds[9]["__key__"] == "compressed/0201"  # usable after close


def test_relative_urls_and_base(dataset_dir, tmp_path):
    d, paths, lengths = dataset_dir
    desc = {
        "wids_version": 1,
        "base": str(d),
        "shardlist": [{"url": os.path.basename(paths[0]), "nsamples": 3}],
    }
    (tmp_path / "elsewhere.json").write_text(json.dumps(desc))
    ds = ShardListDataset(str(tmp_path / "elsewhere.json"), transformations=[])
    assert ds[0]["__shard__"] == paths[0]


def test_reference_constructor_signature(dataset_dir):
    d, _, _ = dataset_dir
    ds = ShardListDataset(
        str(d / "desc.json"),
        cache_dir=str(d / "cache"),
        lru_size=10,
        transformations="PIL",
        base=None,
        options=None,
    )
    assert len(ds) == 10


# -- side by side with the reference, when its venv exists -------------------------------------

_REF_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    from wids import ShardListDataset
    ds = ShardListDataset(sys.argv[1], cache_dir=sys.argv[2], transformations=[])
    out = {"len": int(len(ds)), "lengths": [int(x) for x in ds.lengths],
           "cum": [int(x) for x in ds.cum_lengths], "samples": []}
    for i in range(len(ds)):
        s = ds[i]
        out["samples"].append({k: (hashlib.sha1(v.read()).hexdigest() if hasattr(v, "read")
                                   else (v if isinstance(v, (str, int, type(None))) else int(v)))
                               for k, v in s.items()})
    print(json.dumps(out))
    """
)


def test_same_as_reference(dataset_dir, tmp_path):
    d, _, _ = dataset_dir
    proc = subprocess.run(
        [reference_python(), "-I", "-c", _REF_SCRIPT, str(d / "desc.json"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),  # -I and a directory of its own: the reference's "wids", not ours
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ref = json.loads(proc.stdout.strip().splitlines()[-1])
    ds = _ds(dataset_dir)
    assert ref["len"] == len(ds) and ref["lengths"] == ds.lengths
    assert ref["cum"] == [int(x) for x in ds.cum_lengths]
    for i, rs in enumerate(ref["samples"]):
        ours = ds[i]
        assert set(rs) == set(ours), i
        for k, v in rs.items():
            if k.startswith("."):
                assert hashlib.sha1(ours[k]).hexdigest() == v, (i, k)
            elif k == "__dataset__":
                assert v is None and ours[k] == "compat"  # ours is collate-safe
            elif k == "__shard__":
                assert os.path.basename(v) == os.path.basename(ours[k])
            else:
                assert ours[k] == v, (i, k)


def test_bytesio_transform_difference_documented():
    doc = ShardListDataset.__doc__ or ""
    assert "BytesIO" in doc and "bytes" in doc


def test_decoders_accept_reference_bytesio():
    dec = wids.Decoder()
    assert dec({".txt": io.BytesIO(b"a"), ".cls": io.BytesIO(b"1")}) == {".txt": "a", ".cls": 1}


def test_no_import_side_effects():
    code = "import sys, os, wids; print('torch' in sys.modules, os.path.exists('/tmp/_wids_cache'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "False"


def test_concatenation_like_a_torch_dataset(dataset_dir):
    ds = _ds(dataset_dir)
    both = ds + _ds(dataset_dir)
    assert len(both) == 20 and both[12]["__key__"] == ds[2]["__key__"]


def _weighted(dataset_dir, tmp_path) -> str:
    """A description with a weighted top level, a weighted ``source_url`` and an inline part."""
    d, paths, lengths = dataset_dir
    pairs = zip(paths, lengths, strict=True)
    entry = [{"url": os.path.basename(p), "nsamples": n} for p, n in pairs]
    sub = {"wids_version": 1, "name": "sub", "base": str(d), "shardlist": [entry[1]]}
    (tmp_path / "sub.json").write_text(json.dumps(sub))
    top = {
        "wids_version": 1,
        "name": "top",
        "weight": 2,
        "base": str(d),
        "shardlist": [entry[0]],
        "datasets": [
            {"source_url": str(tmp_path / "sub.json"), "weight": 0.5},
            {"name": "inline", "base": str(d), "shardlist": [entry[2]]},
        ],
    }
    (tmp_path / "top.json").write_text(json.dumps(top))
    return str(tmp_path / "top.json")


def _in_reference(script: str, index: str, tmp_path) -> str:
    """What ``script`` prints run by the reference on ``index`` (``sys.argv[2]``: a cache)."""
    proc = subprocess.run(
        [reference_python(), "-I", "-c", script, index, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _listed(shards: list[dict]) -> list[tuple]:
    return [(os.path.basename(s["url"]), s["nsamples"], s.get("weight")) for s in shards]


def test_shards_carry_their_datasets_weight(dataset_dir, tmp_path):
    """``ds.shards[i]["weight"]``: the weight of the shard's (sub-)dataset, as the reference."""
    ds = ShardListDataset(_weighted(dataset_dir, tmp_path), transformations=[])
    assert _listed(ds.shards) == [
        ("shard-000000.tar", 3, 2),
        ("shard-000001.tar", 5, 0.5),
        ("shard-000002.tar", 2, None),
    ]
    assert [s["dataset"] for s in ds.shards] == ["top", "sub", "inline"]
    assert [ds[i]["__dataset__"] for i in (0, 3, 8)] == ["top", "sub", "inline"]


def test_shards_listed_as_the_reference_lists_them(dataset_dir, tmp_path):
    script = (
        "import json, sys; from wids import ShardListDataset\n"
        "ds = ShardListDataset(sys.argv[1], cache_dir=sys.argv[2], transformations=[])\n"
        "print(json.dumps(ds.shards))\n"
    )
    top = _weighted(dataset_dir, tmp_path)
    ref = json.loads(_in_reference(script, top, tmp_path).strip().splitlines()[-1])
    ours = ShardListDataset(top, transformations=[]).shards
    assert _listed(ours) == _listed(ref)
    # the reference names sub-datasets only (None for the top level's shards: not collate-safe)
    assert [s.get("dataset") for s in ref] == [None, "sub", "inline"]


# The same sampler calls in the reference's process and in ours: each prints, per call, its
# ranges and three passes. `FIXED` is the reference's cut of a dataset with shard lengths.
_SAMPLERS = textwrap.dedent(
    """
    import json, sys, warnings
    from unittest import mock
    import torch.distributed as dist
    from wids import ChunkedSampler, DistributedChunkedSampler, ShardedSampler
    warnings.simplefilter("ignore")
    FIXED = json.loads(sys.argv[1])

    class Shards:
        def __init__(self, lengths):
            self.lengths = lengths
        def __len__(self):
            return sum(self.lengths)

    ds = Shards([3, 7, 2, 6, 5, 1, 6])
    out = []
    def rec(s):
        out.append([[list(r) for r in s.ranges], [[int(i) for i in s] for _ in range(3)]])
    for kw in [{}, {"chunksize": 5, "seed": 3}, {"chunksize": 4, "shuffle": False},
               {"chunksize": 4, "shufflefirst": True, "seed": 9},
               {"num_samples": 11, "chunksize": 3}, {"num_samples": [4, 17], "chunksize": 5}]:
        if isinstance(kw.get("num_samples"), list):
            kw["num_samples"] = tuple(kw["num_samples"])
        rec(ChunkedSampler(ds, **kw, **FIXED))
        rec(ChunkedSampler(list(range(29)), **kw))
    s = ChunkedSampler(ds, chunksize=6, seed=2, **FIXED)
    s.set_epoch(5)
    rec(s)
    for lo, hi, said in ((4, 17, 13), (8, 10, 4)):  # what len() says, as the reference's keyword
        s = ChunkedSampler(list(range(29)), num_samples=(lo, hi), chunksize=5,
                           dslength_per_replica=said)
        rec(s)
        out.append(len(s))
    rec(ShardedSampler(ds))
    rec(ShardedSampler(ds, seed=4, shufflefirst=True))
    rec(ShardedSampler(ds, lengths=[4, 4, 2], seed=1))
    for size in (2, 3):
        for rank in range(size):
            with mock.patch.object(dist, "is_initialized", lambda: True), \\
                 mock.patch.object(dist, "get_world_size", lambda: size), \\
                 mock.patch.object(dist, "get_rank", lambda: rank):
                rec(DistributedChunkedSampler(Shards([6] * 5), chunksize=4, seed=7, **FIXED))
    print(json.dumps(out))
    """
)


def test_sampler_orders_equal_the_reference(tmp_path):
    """Every order of the samplers, side by side: ours with ``chunking="fixed"`` where the
    dataset has shard lengths (by default our chunks also end at shard boundaries)."""
    ref = subprocess.run(
        [reference_python(), "-I", "-c", _SAMPLERS, "{}"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    ours = subprocess.run(
        [sys.executable, "-c", _SAMPLERS, json.dumps({"chunking": "fixed"})],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ours.returncode == 0, ours.stderr[-2000:]
    expected, got = json.loads(ref.stdout), json.loads(ours.stdout)
    assert len(got) == len(expected) == 25
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, i


# One sample of every extension either default decoder knows, as a shard holds it; each
# process prints, per mode, what its default decoders made of each field (None: left raw).
_DECODED = textwrap.dedent(
    """
    import gzip, io, json, sys, warnings
    import numpy as np
    from PIL import Image
    warnings.simplefilter("ignore")
    if sys.argv[1] == "ours":
        from wids.decode import interpret_transformations
    else:
        from wids.wids import interpret_transformations

    def image(fmt):
        buf = io.BytesIO()
        Image.new("RGB", (5, 3), (10, 20, 30)).save(buf, format=fmt)
        return buf.getvalue()

    npy = io.BytesIO()
    np.save(npy, np.arange(6, dtype=np.int16).reshape(2, 3))
    fields = {".txt": b"t", ".text": b"u", ".cls": b"7", ".cls2": b"8", ".index": b"12",
              ".json": b'{"a": 1}', ".jsn": b'{"b": 2}', ".npy": npy.getvalue(),
              ".mp": b"\\x81\\xa1a\\x01", ".msgpack": b"\\x81\\xa1b\\x02",
              ".txt.gz": gzip.compress(b"hello"), ".bin": b"\\x00"}
    fields.update({f".{e}": image(f) for e, f in [("jpg", "JPEG"), ("jpeg", "JPEG"),
        ("png", "PNG"), ("webp", "WEBP"), ("tif", "TIFF"), ("tiff", "TIFF"), ("bmp", "BMP"),
        ("gif", "GIF"), ("ppm", "PPM")]})

    def shown(v):
        if isinstance(v, (bytes, io.BytesIO)):
            return None
        if hasattr(v, "mode") and hasattr(v, "size"):
            return f"PIL {v.mode} {v.size}"
        if hasattr(v, "dtype"):
            return f"{v.dtype} {v.shape} {v.tolist()}"
        return repr(v)

    out = {}
    for mode in ("PIL", "numpy"):
        sample = {"__key__": "k", **{k: io.BytesIO(v) for k, v in fields.items()}}
        for t in interpret_transformations(mode):
            sample = t(sample)
        out[mode] = {k: shown(v) for k, v in sample.items() if k.startswith(".")}
    print(json.dumps(out))
    """
)


def test_default_decoders_next_to_the_reference(tmp_path):
    """Every field the reference's default decoders decode, ours decode to the same value; the
    ones it left raw and ours decode are exactly those docs/migrating.md lists."""
    runs = {}
    for who, python in (("reference", reference_python()), ("ours", sys.executable)):
        r = subprocess.run(
            [python, *(["-I"] if who == "reference" else []), "-c", _DECODED, who],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            timeout=300,
        )
        assert r.returncode == 0, (who, r.stderr[-2000:])
        runs[who] = json.loads(r.stdout.strip().splitlines()[-1])
    for mode in ("PIL", "numpy"):
        ref, ours = runs["reference"][mode], runs["ours"][mode]
        assert {k: v for k, v in ours.items() if ref[k] is not None} == {
            k: v for k, v in ref.items() if v is not None
        }, mode
        more = {k for k, v in ours.items() if v is not None and ref[k] is None}
        assert more == {".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif", ".index", ".jsn"} | {
            ".msgpack"
        }, mode
        assert ours[".bin"] is None


def test_a_subclass_getitem_makes_the_dataloader_batches(dataset_dir):
    """Reference code subclasses the dataset to shape its samples; the DataLoader's batched
    read (``__getitems__``) went around that ``__getitem__`` and batched the raw dicts."""
    from torch.utils.data import DataLoader

    class Pairs(ShardListDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return s["__key__"], s[".cls"]

    d, _, _ = dataset_dir
    ds = Pairs(str(d / "desc.json"))
    keys, labels = next(iter(DataLoader(ds, batch_size=4)))
    assert (
        list(keys)
        == [ds[i][0] for i in range(4)]
        == [ShardListDataset(ds.shards)[i]["__key__"] for i in range(4)]
    )
    assert labels.tolist() == [0, 1, 2, 0]
    both = next(iter(DataLoader(ds + ds, batch_size=12, collate_fn=list)))
    assert both[10:] == [ds[0], ds[1]]


def test_localname_warns_with_the_way_to_read_local_copies(dataset_dir):
    """The reference's ``localname`` pointed remote shard URLs at local files; its warning
    names ``url_map``, which does that: every sample from the local copies."""
    from serverfixtures import python_http_server

    d, paths, _ = dataset_dir
    with python_http_server(d) as base:
        with pytest.warns(UserWarning, match=r"url_map=\{'https://host/dir/': '/local/dir/'\}"):
            ShardListDataset(f"{base}/desc.json", localname=lambda url: url)
        ds = ShardListDataset(
            f"{base}/desc.json", url_map={f"{base}/": f"{d}/"}, transformations=[]
        )
        assert [s["__shard__"] for s in ds.__getitems__([0, 9])] == [paths[0], paths[2]]
        assert [strip_meta(ds[i]) for i in range(len(ds))] == dataset_samples(paths)


def test_dataset_name_is_the_index_name_as_the_reference_gives_it(dataset_dir, tmp_path):
    """``ds.dataset_name`` of a description is its ``name``, side by side with the reference
    (it was ``None`` unless given); a name given wins."""
    top = _weighted(dataset_dir, tmp_path)
    script = (
        "import sys; from wids import ShardListDataset\n"
        "print(ShardListDataset(sys.argv[1], cache_dir=sys.argv[2]).dataset_name)\n"
    )
    assert ShardListDataset(top).dataset_name == _in_reference(script, top, tmp_path).strip()
    assert ShardListDataset(top).dataset_name == "top"
    assert ShardListDataset(top, dataset_name="mine").dataset_name == "mine"
    ds = ShardListDataset(top)
    ds.dataset_name = "renamed"
    assert ds.dataset_name == "renamed"
