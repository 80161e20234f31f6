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
    strip_credentials,
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
    signed = "https://host/data/train-000001.tar?X-Amz-Signature=SECRET1&X-Amz-Credential=SECRET2"
    assert url_name(signed, ".json") == name and "SECRET" not in url_name(signed)
    # a user's password is not part of it (the user name is: another user's file)
    user = url_name("https://user:SECRET1@host/data/train-000001.tar", ".json")
    assert user == url_name("https://user@host/data/train-000001.tar", ".json")
    assert "SECRET" not in user
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


# -- identity: the full URL minus known credentials, never a name heuristic --------------------


@pytest.mark.parametrize(
    "param", ["key", "object_key", "design", "author", "session", "token", "sig", "apikey"]
)
def test_urls_that_differ_in_any_ordinary_parameter_name_different_files(param: str) -> None:
    a = url_name(f"https://host/get?{param}=a", ".json")
    b = url_name(f"https://host/get?{param}=b", ".json")
    assert a != b
    assert strip_credentials(f"https://host/get?{param}=a") == f"https://host/get?{param}=a"


@pytest.mark.parametrize(
    ("signed", "plain"),
    [
        (  # S3 SigV4 presigned
            "https://b.s3.amazonaws.com/x.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIA%2F20260101&X-Amz-Date=20260101T000000Z&X-Amz-Expires=60"
            "&X-Amz-SignedHeaders=host&X-Amz-Security-Token=T&X-Amz-Signature=S&versionId=3",
            "https://b.s3.amazonaws.com/x.tar?versionId=3",
        ),
        (  # GCS V4
            "https://storage.googleapis.com/b/x.tar?X-Goog-Algorithm=GOOG4-RSA-SHA256"
            "&X-Goog-Credential=c&X-Goog-Date=d&X-Goog-Expires=60&X-Goog-SignedHeaders=host"
            "&X-Goog-Signature=S&generation=5",
            "https://storage.googleapis.com/b/x.tar?generation=5",
        ),
        (  # Azure SAS
            "https://acct.blob.core.windows.net/c/x.tar?sv=2022-11-02&ss=b&srt=o&sp=r"
            "&se=2026-01-01T00%3A00%3A00Z&st=2025-01-01&spr=https&sig=S%3D&snapshot=1",
            "https://acct.blob.core.windows.net/c/x.tar?snapshot=1",
        ),
        (  # S3 / GCS V2, CloudFront
            "https://h/x.tar?AWSAccessKeyId=AK&Expires=1&Signature=S&part=2",
            "https://h/x.tar?part=2",
        ),
        ("https://h/x.tar?GoogleAccessId=g&Expires=1&Signature=S", "https://h/x.tar"),
        ("https://h/x.tar?Expires=1&Signature=S&Key-Pair-Id=K&Policy=P", "https://h/x.tar"),
    ],
)
def test_known_signatures_and_userinfo_are_not_identity(signed: str, plain: str) -> None:
    assert strip_credentials(signed) == plain
    assert url_name(signed) == url_name(plain)
    assert "S" not in url_name(signed).split("-", 1)[1].replace("x.tar", "")


def test_identity_keeps_everything_else_verbatim() -> None:
    """Spellings a server may tell apart, and "#" or "?" in object keys, are not merged."""
    pairs = [
        ("https://h/get?a=1+2", "https://h/get?a=1%202"),
        ("https://h/get?a=1&b=2", "https://h/get?b=2&a=1"),
        ("s3://b/shard#1.tar", "s3://b/shard#2.tar"),
        ("https://h/get?download", "https://h/get?download="),
    ]
    for one, other in pairs:
        assert strip_credentials(one) == one and strip_credentials(other) == other
        assert url_name(one) != url_name(other), (one, other)
    assert strip_credentials("s3://AKIA:secret@b/x.tar") == "s3://b/x.tar"
    assert strip_credentials("http://h/x?X-Amz-Signature=1&v=1&X-Amz-Date=2&w=%2F") == (
        "http://h/x?v=1&w=%2F"
    )


def test_parameters_of_a_signing_scheme_are_kept_without_that_scheme() -> None:
    # "st" and "sp" are only an Azure SAS's when the query is one (sv and sig)
    assert strip_credentials("https://h/get?st=1&sp=2") == "https://h/get?st=1&sp=2"
    assert url_name("https://h/get?st=1") != url_name("https://h/get?st=2")
    assert strip_credentials("https://h/x?Signature=1&Expires=2") == (
        "https://h/x?Signature=1&Expires=2"
    )


def test_names_of_urls_without_query_or_credentials_are_unchanged() -> None:
    """Old cache entries, scan caches and snapshots are still found for ordinary URLs."""
    for url in ("https://host/a/b.tar", "s3://bucket/k/x.tar", "/local/x.tar", "gs://b/y.tar"):
        assert url_name(url) == (
            hashlib.sha256(url.encode()).hexdigest()[:24] + "-" + url.rsplit("/", 1)[1]
        )


@pytest.mark.servers
def test_shards_differing_only_in_a_query_parameter_stay_apart(tmp_path) -> None:
    """Same size, same Last-Modified, same layout: their own sidecars and cache entries."""
    from recordingserver import RecordingServer
    from tarfixtures import write_shard

    from wids import ShardListDataset, build_index

    root = tmp_path / "www"
    root.mkdir()
    for k in "ab":
        samples = [(f"{i:06d}.txt", f"from-{k}-{i:04d}".encode()) for i in range(4)]
        path = write_shard(root / f"get?key={k}", samples)
        os.utime(path, (1_700_000_000, 1_700_000_000))
    assert (root / "get?key=a").stat().st_size == (root / "get?key=b").stat().st_size
    server = RecordingServer(root)
    try:
        urls = [f"{server.base}/get?key=a", f"{server.base}/get?key=b"]
        build_index(urls, str(tmp_path / "i.json"))
        sidecars = [p for p in tmp_path.rglob("*.json") if p.name != "i.json"]
        assert len(sidecars) == 2
        for access in ("range", "shard"):
            ds = ShardListDataset(
                str(tmp_path / "i.json"), cache_dir=tmp_path / "cache", access=access
            )
            try:
                got = [(ds[i]["__shard__"], ds[i][".txt"]) for i in range(len(ds))]
            finally:
                ds.close()
            assert len(got) == 8
            assert sorted(text for _, text in got) == sorted(
                f"from-{k}-{i:04d}" for k in "ab" for i in range(4)
            )
            for shard, text in got:
                assert text.startswith(f"from-{shard[-1]}-"), (access, shard, text)
    finally:
        server.stop()


def test_two_users_urls_are_two_files_and_plain_urls_keep_their_names() -> None:
    """ftp://alice@h/x and ftp://bob@h/x: each path is in that user's home (review-1 #9)."""
    import hashlib

    for scheme in ("ftp", "sftp", "https"):
        alice, bob = f"{scheme}://alice@h/x.tar", f"{scheme}://bob@h/x.tar"
        assert url_name(alice) != url_name(bob)
        assert url_name(f"{scheme}://alice:pw1@h/x.tar") == url_name(alice)  # not the password
        assert url_name(f"{scheme}://alice:pw2@h/x.tar") == url_name(alice)
        assert url_name(f"{scheme}://alice:p)w'@h/x.tar") == url_name(alice)
        assert (
            strip_credentials(f"{scheme}://alice:p)w'@h/x.tar?k=1#f") == f"{scheme}://h/x.tar?k=1#f"
        )
        assert "alice" not in url_name(alice) and "pw1" not in url_name(
            f"{scheme}://alice:pw1@h/x.tar"
        )
    # no user name: the name is what it always was (existing cache entries are found)
    for url in ("https://h/x.tar", "https://h/get?key=a&X-Amz-Signature=s", "s3://b/x.tar"):
        old = hashlib.sha256(strip_credentials(url).encode()).hexdigest()[:24]
        assert url_name(url).startswith(old + "-")
    # an object store's key id is not a home: rotating keys keeps the cache
    assert url_name("s3://AKIA1:s@b/x.tar") == url_name("s3://AKIA2:t@b/x.tar")
