"""wids.storage.urls: local or remote, stored URLs, the one URL -> file name function."""

from __future__ import annotations

import hashlib
import os

import pytest

from wids.storage import (
    is_local,
    is_remote,
    local_file,
    local_path,
    output_dir,
    redact_url,
    stored_url,
    url_name,
)


def test_is_local() -> None:
    assert is_local("/a/b.tar") and is_local("b.tar") and is_local("file:///a/b.tar")
    for url in ("s3://b/k", "https://h/x", "memory://x", "simplecache::s3://b/k", "gs://b/k"):
        assert not is_local(url), url
        assert is_remote(url), url
    assert not is_remote("file:///a/b.tar") and not is_remote("b.tar")


def test_local_paths() -> None:
    assert local_file("file:///tmp/x.tar") == "/tmp/x.tar"
    assert local_file("~/x.tar") == os.path.expanduser("~/x.tar")
    assert local_file("rel.tar") == os.path.abspath("rel.tar")
    assert local_path("file:///tmp/x.json") == "/tmp/x.json"
    assert output_dir("s3://b/data/train.json") == "s3://b/data"
    assert output_dir("file:///tmp/d/train.json") == "/tmp/d"


@pytest.mark.parametrize(
    ("url", "out_dir", "expected"),
    [
        ("s3://b/data/train-0.tar", "s3://b/data", "train-0.tar"),
        ("s3://b/other/train-0.tar", "s3://b/data", "s3://b/other/train-0.tar"),
        ("s3://b/data/x.tar?versionId=3", "s3://b/data", "s3://b/data/x.tar?versionId=3"),
        ("/d/x.tar", "/d", "x.tar"),
        ("/e/x.tar", "/d", "/e/x.tar"),
        ("/d/x.tar", "s3://b/data", "file:///d/x.tar"),
    ],
)
def test_stored_url(url: str, out_dir: str, expected: str) -> None:
    assert stored_url(url, out_dir) == expected


def test_url_name_is_hash_of_the_url_without_credentials_and_a_readable_tail() -> None:
    url = "https://host/data/train-000001.tar"
    name = url_name(url, ".json")
    digest = hashlib.sha256(url.encode()).hexdigest()[:24]
    assert name == f"{digest}-train-000001.tar.json"
    # re-signed and user:password URLs name the same file; no secret reaches a file name
    for signed in (
        "https://host/data/train-000001.tar?X-Amz-Signature=SECRET1&X-Amz-Credential=SECRET2",
        "https://user:SECRET1@host/data/train-000001.tar",
    ):
        assert url_name(signed, ".json") == name
        assert "SECRET" not in url_name(signed)
    # other query parameters are part of the identity (another version), not of the tail
    versioned = url_name("https://host/data/train-000001.tar?versionId=7")
    assert versioned != url_name(url) and versioned.endswith("-train-000001.tar")


@pytest.mark.parametrize(
    ("url", "tail"),
    [
        ("s3://b/k/a b&c.tar", "a_b_c.tar"),  # only A-Za-z0-9._- in a file name
        ("memory://x/.hidden", "hidden"),  # never a hidden file
        ("https://host/", "host"),
        ("s3://b/dir/", "dir"),
        ("/abs/path/x.tar", "x.tar"),
        ("simplecache::s3://b/k/y.tar", "y.tar"),
        ("https://host/" + "n" * 200 + ".tar", "n" * 76 + ".tar"),  # at most 80 characters
        ("..", "file"),
    ],
)
def test_url_name_tail(url: str, tail: str) -> None:
    name = url_name(url)
    assert name == f"{hashlib.sha256(redact_url(url).encode()).hexdigest()[:24]}-{tail}"
    assert "/" not in name and len(name) <= 24 + 1 + 80


def test_url_name_differs_for_different_urls() -> None:
    urls = [f"s3://bucket/dir{i}/shard.tar" for i in range(1000)]
    assert len({url_name(u) for u in urls}) == len(urls)
