"""Shard URLs: resolving, mirrors, remote-only checks, braces (``wids.index.urls``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wids import ShardInfo, expand_braces
from wids.index.urls import (
    apply_url_map,
    check_remote_ref,
    check_url_map,
    is_remote_url,
    map_url,
    resolve_url,
    url_dir,
)

# -- braces ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("plain.tar", ["plain.tar"]),
        ("s-{000000..000002}.tar", ["s-000000.tar", "s-000001.tar", "s-000002.tar"]),
        ("s-{8..11}", ["s-8", "s-9", "s-10", "s-11"]),
        ("s-{08..11}", ["s-08", "s-09", "s-10", "s-11"]),
        ("{3..1}", ["3", "2", "1"]),
        ("{a,b,c}.tar", ["a.tar", "b.tar", "c.tar"]),
        ("{a,b}/{0..1}", ["a/0", "a/1", "b/0", "b/1"]),
        ("x{y}z", ["x{y}z"]),
        ("{a,}", ["a", ""]),
        ("s3://b/train-{000..001}.tar", ["s3://b/train-000.tar", "s3://b/train-001.tar"]),
    ],
)
def test_expand_braces(pattern: str, expected: list[str]) -> None:
    assert expand_braces(pattern) == expected


@given(st.integers(0, 5000), st.integers(0, 300), st.integers(1, 8))
def test_expand_braces_ranges_are_padded_and_complete(lo: int, count: int, width: int) -> None:
    hi = lo + count
    width = max(width, len(str(hi)))
    out = expand_braces("p{" + f"{lo:0{width}d}..{hi:0{width}d}" + "}s")
    assert len(out) == count + 1
    assert [int(x[1:-1]) for x in out] == list(range(lo, hi + 1))
    if width > 1:
        assert all(len(x) == width + 2 for x in out)


# -- URLs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, base, expected",
    [
        ("x.tar", "s3://bucket/a", "s3://bucket/a/x.tar"),
        ("x.tar", "s3://bucket/a/", "s3://bucket/a/x.tar"),
        ("../b/x.tar", "s3://bucket/a", "s3://bucket/b/x.tar"),
        ("x.tar", "s3://bucket", "s3://bucket/x.tar"),
        ("/p/x.tar", "https://host:8000/a/b", "https://host:8000/p/x.tar"),
        ("gs://other/x.tar", "s3://bucket/a", "gs://other/x.tar"),
        ("x.tar", "simplecache::s3://b/c", "simplecache::s3://b/c/x.tar"),
        ("x.tar", "/data/set", "/data/set/x.tar"),
        ("sub/../x.tar", "/data/set", "/data/set/x.tar"),
        ("/abs/x.tar", "/data/set", "/abs/x.tar"),
        ("x.tar", "file:///data/set", "/data/set/x.tar"),
    ],
)
def test_resolve_url(url: str, base: str, expected: str) -> None:
    assert resolve_url(url, base) == expected


def test_resolve_url_without_base_is_relative_to_cwd(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_url("a/x.tar", None) == str(tmp_path / "a" / "x.tar")
    assert resolve_url("x.tar", "rel") == str(tmp_path / "rel" / "x.tar")


def test_url_dir() -> None:
    assert url_dir("s3://b/p/d.json") == "s3://b/p"
    assert url_dir("/a/b/d.json") == "/a/b"


# -- mirrors and remote-only checks -----------------------------------------------------------


def test_url_map_longest_prefix_wins_and_forgets_the_old_stores_identity() -> None:
    checked = check_url_map(
        {"/data/": "s3://b/d/", "/data/x": "https://cdn/y", "file:///z/": "/w/"}
    )
    assert checked[0] == ("/data/x", "https://cdn/y")  # longest first; file:// stripped
    assert map_url("/data/x-1.tar", checked) == "https://cdn/y-1.tar"
    assert map_url("/data/a.tar", checked) == "s3://b/d/a.tar"
    assert map_url("/z/a.tar", checked) == "/w/a.tar"
    assert map_url("/other/a.tar", checked) == "/other/a.tar"
    info = ShardInfo("/data/a.tar", 3, 100, etag="e", mtime=1.0, md5sum="ff")
    assert apply_url_map([info], checked) == [ShardInfo("s3://b/d/a.tar", 3, 100, md5sum="ff")]
    assert check_url_map(None) == () and check_url_map({}) == ()


@pytest.mark.parametrize(
    "url_map, error",
    [
        ({"data/": "s3://b/"}, ValueError),  # relative
        ({"/data/": "s3://b"}, ValueError),  # one ends in "/", the other not
        ({"/d/": "/e/", "file:///d/": "/f/"}, ValueError),  # the same prefix twice
        ({"/d/": 3}, TypeError),
        (["/d/", "/e/"], TypeError),
    ],
)
def test_bad_url_maps_are_refused(url_map: object, error: type) -> None:
    with pytest.raises(error):
        check_url_map(url_map)  # type: ignore[arg-type]


def test_a_remote_index_may_name_only_remote_locations() -> None:
    assert is_remote_url("https://h/a.tar") and is_remote_url("simplecache::s3://b/a.tar")
    assert not is_remote_url("/data/a.tar") and not is_remote_url("file:///a.tar")
    assert not is_remote_url("memory://x/a.tar") and not is_remote_url("tar://x::/d/a.tar")
    refused = check_remote_ref("/etc/passwd", "https://h/i.json", False)
    assert refused is not None and "allow_local_shards" in refused
    assert check_remote_ref("/etc/passwd", "https://h/i.json", True) is None  # the user trusts it
    assert check_remote_ref("/etc/passwd", "/local/i.json", False) is None  # a local index
    assert check_remote_ref("s3://b/a.tar", "https://h/i.json", False) is None
