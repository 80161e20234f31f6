"""The dataset description: loading, validation, sub-datasets (``wids.index.spec``)."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest

from wids import Component, load_spec
from wids.errors import IndexFormatError, ShardNotFoundError


def write_json(path: Path, obj: object) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def desc(*shards: dict, **top: object) -> dict:
    return {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": list(shards), **top}


def shard(url: str, n: int = 10, **kw: object) -> dict:
    return {"url": url, "nsamples": n, **kw}


# -- loading -----------------------------------------------------------------------------------


def test_relative_urls_resolve_against_the_files_directory(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "d" / "ds.json",
        desc(shard("a.tar", 3, filesize=10240, md5sum="ab"), shard("sub/b.tar", 4), name="ds"),
    )
    spec = load_spec(path)
    assert spec.name == "ds"
    assert [s.url for s in spec.shards] == [
        str(tmp_path / "d/a.tar"),
        str(tmp_path / "d/sub/b.tar"),
    ]
    assert [s.nsamples for s in spec.shards] == [3, 4]
    assert spec.shards[0].size == 10240 and spec.shards[0].md5sum == "ab"
    assert spec.components == [Component("ds", None, 0, 2)]
    assert spec.url == path


def test_top_level_base_is_honoured(tmp_path: Path) -> None:
    path = write_json(tmp_path / "ds.json", desc(shard("a.tar"), base="s3://bucket/prefix"))
    assert load_spec(path).shards[0].url == "s3://bucket/prefix/a.tar"
    path = write_json(tmp_path / "ds2.json", desc(shard("a.tar"), base="shards"))
    assert load_spec(path).shards[0].url == str(tmp_path / "shards" / "a.tar")


def test_base_argument_overrides_file_and_its_base(tmp_path: Path) -> None:
    path = write_json(tmp_path / "ds.json", desc(shard("a.tar"), base="s3://ignored"))
    assert load_spec(path, base="gs://b/p").shards[0].url == "gs://b/p/a.tar"


def test_stream_list_and_dict_sources(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    d = desc(shard("a.tar", 2), shard("/abs/b.tar", 3), name="s")
    from_stream = load_spec(io.StringIO(json.dumps(d)))
    from_bytes = load_spec(io.BytesIO(json.dumps(d).encode()))
    from_dict = load_spec(d)
    from_list = load_spec(d["shardlist"])
    for spec in (from_stream, from_bytes, from_dict, from_list):
        assert [s.url for s in spec.shards] == [str(tmp_path / "a.tar"), "/abs/b.tar"]
        assert spec.url is None
    assert from_stream.name == "s" and from_list.name == ""
    assert from_list.components == [Component("", None, 0, 2)]
    assert load_spec(d["shardlist"], base="s3://x").shards[0].url == "s3://x/a.tar"


def test_unknown_keys_are_kept(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "ds.json",
        desc(shard("a.tar", members="m/a.json", colour="red"), future={"x": 1}),
    )
    spec = load_spec(path)
    assert spec.extras[0]["members"] == "m/a.json"
    assert spec.extras[0]["colour"] == "red"
    assert spec.top["future"] == {"x": 1}
    assert spec.origins == [path]


def test_sub_datasets(tmp_path: Path) -> None:
    write_json(tmp_path / "other" / "o.json", desc(shard("o1.tar", 5), name="other-file"))
    write_json(tmp_path / "named" / "n.json", desc(shard("n1.tar", 6)))
    path = write_json(
        tmp_path / "main.json",
        desc(
            shard("m1.tar", 1),
            shard("m2.tar", 2),
            name="main",
            weight=2,
            datasets=[
                {"source_url": "other/o.json", "weight": 0.5},
                {"source_url": "named/n.json", "name": "renamed"},
                {"name": "inline", "base": "s3://b/p", "shardlist": [shard("i1.tar", 7)]},
                {"shardlist": [shard("rel/i2.tar", 8)]},
            ],
        ),
    )
    spec = load_spec(path)
    assert [s.url for s in spec.shards] == [
        str(tmp_path / "m1.tar"),
        str(tmp_path / "m2.tar"),
        str(tmp_path / "other/o1.tar"),
        str(tmp_path / "named/n1.tar"),
        "s3://b/p/i1.tar",
        str(tmp_path / "rel/i2.tar"),
    ]
    assert spec.components == [
        Component("main", 2.0, 0, 2),
        Component("other-file", 0.5, 2, 3),
        Component("renamed", None, 3, 4),
        Component("inline", None, 4, 5),
        Component("", None, 5, 6),
    ]
    assert all(isinstance(c.name, str) for c in spec.components)
    assert spec.origins[2] == str(tmp_path / "other" / "o.json")


def test_empty_main_shardlist_is_no_component(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "ds.json",
        {"wids_version": 1, "datasets": [{"name": "a", "shardlist": [shard("a.tar")]}]},
    )
    assert load_spec(path).components == [Component("a", None, 0, 1)]


def test_source_url_cycle_is_an_error(tmp_path: Path) -> None:
    write_json(tmp_path / "a.json", desc(shard("a.tar"), datasets=[{"source_url": "b.json"}]))
    write_json(tmp_path / "b.json", desc(shard("b.tar"), datasets=[{"source_url": "a.json"}]))
    with pytest.raises(IndexFormatError, match="cycle"):
        load_spec(tmp_path / "a.json")


def test_remote_description(tmp_path: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/spec-{uuid.uuid4().hex}"
    fs.pipe(f"{root}/ds.json", json.dumps(desc(shard("a.tar"), shard("../up/b.tar"))).encode())
    spec = load_spec(f"memory://{root}/ds.json")
    assert [s.url for s in spec.shards] == [f"memory://{root}/a.tar", "memory:///up/b.tar"]


# -- malformed descriptions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"__kind__": "something-else", "wids_version": 1, "shardlist": []}, "__kind__"),
        ({"shardlist": [shard("a.tar")]}, "wids_version missing"),
        ({"wids_version": 2, "shardlist": []}, "wids_version 2"),
        ({"wids_version": "1", "shardlist": []}, "wids_version"),
        (desc({"nsamples": 3}), r"shardlist\[0\]: 'url'"),
        (desc(shard("a.tar"), {"url": "b.tar"}), r"shardlist\[1\]: 'nsamples'"),
        (desc({"url": "a.tar", "nsamples": "3"}), "nsamples"),
        (desc({"url": "a.tar", "nsamples": -1}), "nsamples"),
        (desc({"url": "a.tar", "nsamples": True}), "nsamples"),
        (desc({"url": 3, "nsamples": 1}), "url"),
        (desc(shard("a.tar", filesize="12")), "filesize"),
        (desc(shard("a.tar", md5sum=5)), "md5sum"),
        (desc(shard("a.tar", mtime="yesterday")), "mtime"),
        ({"wids_version": 1, "shardlist": {"url": "a"}}, "'shardlist' must be a list"),
        ({"wids_version": 1, "datasets": {}}, "'datasets' must be a list"),
        (desc(datasets=[{"source_url": 5}]), "source_url"),
        (desc(datasets=[{"shardlist": [{"url": "x"}]}]), r"datasets\[0\].*nsamples"),
        (desc(shard("a"), name=5), "name"),
        (desc(shard("a"), weight=-1), "weight"),
        (desc(shard("a"), base=3), "base"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_malformed_descriptions_name_the_file(tmp_path: Path, obj: object, message: str) -> None:
    path = write_json(tmp_path / "bad-desc.json", obj)
    with pytest.raises(IndexFormatError, match=message) as info:
        load_spec(path)
    assert "bad-desc.json" in str(info.value)
    assert info.value.shard == path


def test_invalid_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"wids_version": 1, "shardlist": [')
    with pytest.raises(IndexFormatError, match="not valid JSON") as info:
        load_spec(bad)
    assert "broken.json" in str(info.value)
    with pytest.raises(ShardNotFoundError):
        load_spec(tmp_path / "missing.json")
    with pytest.raises(ShardNotFoundError):
        load_spec(write_json(tmp_path / "d.json", desc(datasets=[{"source_url": "nope.json"}])))


def test_errors_are_valueerrors_too() -> None:
    with pytest.raises(ValueError):
        load_spec([{"url": "a.tar"}])
