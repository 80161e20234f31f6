"""Credentials go only to the origins they were given for (wids.storage.origins).

Two real HTTP servers on 127.0.0.1 (different ports) record the headers of every request they
get; an index on one names shards on both. The options given for the index's origin must
reach that origin only; another origin gets its own entry, or nothing.
"""

from __future__ import annotations

import io
import pickle
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from recordingserver import RecordingServer
from tarfixtures import make_samples, write_shard

from wids import ShardListDataset, build_index, open_index
from wids.cli import main as wids_main
from wids.errors import PermanentRemoteError
from wids.index import verify_index
from wids.storage import Store
from wids.storage.origins import Scope, origin, without_credentials
from wids.storage.viaobstore import ObstoreFallbackWarning

SECRET_A = "Bearer SECRET-FOR-A-0123456789"
SECRET_B = "Bearer SECRET-FOR-B-9876543210"


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[RecordingServer, RecordingServer]]:
    """Server A holds the index and shard a; server B (another port) holds shard b."""
    root_a, root_b = tmp_path / "a", tmp_path / "b"
    root_a.mkdir()
    root_b.mkdir()
    write_shard(root_a / "a.tar", make_samples(6, prefix="a", fields=(".txt",)))
    write_shard(root_b / "b.tar", make_samples(6, prefix="b", fields=(".txt",)))
    a, b = RecordingServer(root_a), RecordingServer(root_b)
    try:
        build_index([f"{a.base}/a.tar", f"{b.base}/b.tar"], str(root_a / "train.json"))
        a.seen.clear()
        b.seen.clear()
        yield a, b
    finally:
        a.stop()
        b.stop()


def _read_all(ds: ShardListDataset) -> list[str]:
    try:
        return [ds[i]["__key__"] for i in range(len(ds))]
    finally:
        ds.close()


# -- origins and scopes (pure functions) -----------------------------------------------------


def test_origin_normalises_scheme_host_port_and_drops_userinfo() -> None:
    assert origin("HTTP://u:p@Host.Example/x") == "http://host.example:80"
    assert origin("https://host.example:443/x?y") == "https://host.example:443"
    assert origin("http://host.example:8080/x") != origin("http://host.example:8081/x")
    assert origin("http://[::1]:9/x") == "http://[::1]:9"
    assert origin("s3://bucket-a/x") == origin("s3a://bucket-b/y") == "s3://"
    assert origin("gs://b/x") == origin("gcs://b/x") == "gs://"
    assert origin("simplecache::https://h/x") == "https://h:443"
    assert origin("/data/x.tar") is None and origin("file:///x") is None
    # a userinfo that hides another host is not that host
    assert origin("http://a.example:80@b.example/x") == "http://b.example:80"


def test_without_credentials_drops_every_credential_bearing_option() -> None:
    options = {
        "headers": {"X-Api-Key": "k"},
        "client_kwargs": {"auth": "x", "timeout": 5, "headers": {"A": "b"}, "trust_env": True},
        "key": "AK",
        "secret": "S",
        "token": "T",
        "anon": False,
        "block_size": 1,
        "get_client": print,
        "ssl": False,
    }
    assert without_credentials(options) == {
        "client_kwargs": {"timeout": 5, "trust_env": True},
        "anon": False,
        "block_size": 1,
    }


def test_scope_gives_flat_options_to_named_origins_and_entries_to_their_origin() -> None:
    flat = {"headers": {"Authorization": SECRET_A}, "client_kwargs": {"trust_env": True}}
    scope = Scope({**flat, "http://b.example:8080": {"headers": {"X": "1"}}}, named="http://a/i")
    assert scope.options_for("http://a/x.tar") == flat
    assert scope.options_for("http://A:80/y.tar") == flat
    assert scope.options_for("http://c/x.tar") == {"client_kwargs": {"trust_env": True}}
    assert scope.options_for("http://b.example:8080/x.tar") == {
        "client_kwargs": {"trust_env": True},
        "headers": {"X": "1"},
    }
    assert "withheld" in scope.withheld("http://c/x.tar")
    assert scope.withheld("http://a/x.tar") == "" and scope.withheld("http://b.example:8080/") == ""
    # unscoped (named=None): everywhere, as a bare Store; local URLs only name no origin
    assert Scope(flat).options_for("http://c/x.tar") == flat
    local_only = Scope(flat, named={"source_url": "local.json", "name": "x"})
    assert local_only.named == frozenset() and local_only.options_for("http://c/x.tar") == {}
    with pytest.raises(TypeError, match="mapping of options"):
        Scope({"http://b": "nope"})


def test_store_keeps_its_origins_when_pickled_and_copied() -> None:
    store = Store({"headers": {"Authorization": SECRET_A}}, named="http://a/train.json")
    for copy in (pickle.loads(pickle.dumps(store)), store.with_stats(), Store.of(store)):
        assert copy.named == frozenset({"http://a:80"})
        assert "headers" not in copy.source("http://b/x.tar").storage_options
        assert "headers" in copy.source("http://a/x.tar").storage_options


# -- real servers ------------------------------------------------------------------------------


def test_index_on_a_naming_shards_on_b_sends_a_credentials_only_to_a(
    two_servers: tuple[RecordingServer, RecordingServer], tmp_path: Path
) -> None:
    a, b = two_servers
    opts = {"headers": {"Authorization": SECRET_A}}
    for access, cache in (("range", None), ("shard", tmp_path / "cache")):
        ds = ShardListDataset(
            f"{a.base}/train.json", storage_options=opts, access=access, cache_dir=cache
        )
        assert len(_read_all(ds)) == 12
    assert a.auth_seen() == {SECRET_A}
    assert b.seen, "shard b was read"
    assert b.auth_seen() == {None}
    assert "SECRET-FOR-A" not in b.all_header_values()


def test_per_origin_options_give_each_server_its_own_credentials(
    two_servers: tuple[RecordingServer, RecordingServer],
) -> None:
    a, b = two_servers
    b.require = SECRET_B
    opts = {
        "headers": {"Authorization": SECRET_A},
        b.base: {"headers": {"Authorization": SECRET_B}},
    }
    assert len(_read_all(ShardListDataset(f"{a.base}/train.json", storage_options=opts))) == 12
    assert a.auth_seen() == {SECRET_A}
    assert b.auth_seen() == {SECRET_B}


def test_a_refusal_from_another_origin_says_credentials_were_withheld(
    two_servers: tuple[RecordingServer, RecordingServer],
) -> None:
    a, b = two_servers
    b.require = SECRET_A  # B wants A's token: the user must say so
    ds = ShardListDataset(
        f"{a.base}/train.json", storage_options={"headers": {"Authorization": SECRET_A}}
    )
    with pytest.raises(PermanentRemoteError) as e:
        _read_all(ds)
    msg = str(e.value)
    assert "withheld" in msg and b.base in msg and "storage_options" in msg
    assert "SECRET-FOR-A" not in msg
    assert b.auth_seen() == {None}


def test_shards_the_user_names_all_get_the_options(
    two_servers: tuple[RecordingServer, RecordingServer],
) -> None:
    a, b = two_servers
    shards = [
        {"url": f"{a.base}/a.tar", "nsamples": 6},
        {"url": f"{b.base}/b.tar", "nsamples": 6},
    ]
    opts = {"headers": {"Authorization": SECRET_A}}
    assert len(_read_all(ShardListDataset(shards, storage_options=opts))) == 12
    assert a.auth_seen() == {SECRET_A} and b.auth_seen() == {SECRET_A}


def test_verify_and_open_index_keep_credentials_at_home(
    two_servers: tuple[RecordingServer, RecordingServer],
) -> None:
    a, b = two_servers
    opts = {"headers": {"Authorization": SECRET_A}}
    total, problems = verify_index(f"{a.base}/train.json", opts)
    assert (total, problems) == (2, [])
    idx = open_index(f"{a.base}/train.json", opts)
    idx.close()
    assert a.auth_seen() == {SECRET_A}
    assert b.seen and b.auth_seen() == {None}


def test_cli_takes_per_origin_options(
    two_servers: tuple[RecordingServer, RecordingServer], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_servers
    b.require = SECRET_B
    rc = wids_main(
        [
            "index",
            "verify",
            f"{a.base}/train.json",
            "-s",
            f"headers.Authorization={SECRET_A}",
            "-s",
            f"{b.base}/headers.Authorization={SECRET_B}",
        ]
    )
    assert rc == 0, capsys.readouterr()
    assert a.auth_seen() == {SECRET_A} and b.auth_seen() == {SECRET_B}
    assert "SECRET" not in "".join(capsys.readouterr())


def _basic_auth() -> object:
    import aiohttp

    with warnings.catch_warnings():  # deprecated in aiohttp 3.14, still what fsspec documents
        warnings.simplefilter("ignore", DeprecationWarning)
        return aiohttp.BasicAuth("user", SECRET_A)


@pytest.mark.parametrize("given", ["header", "request auth", "session auth"])
def test_a_redirect_to_another_origin_drops_authorization(tmp_path: Path, given: str) -> None:
    """aiohttp drops Authorization when a redirect leaves the origin; this holds it to that.

    A session's auth (``client_kwargs={"auth": ...}``, fsspec's documented way to log in) is
    one aiohttp sends again after the hop: before, B got it.
    """
    root = tmp_path / "b"
    root.mkdir()
    write_shard(root / "b.tar", make_samples(3, prefix="b", fields=(".txt",)))
    b = RecordingServer(root)

    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", b.base + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

    a = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=a.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{a.server_address[1]}/b.tar"
        options: dict[str, object] = {
            "header": {"headers": {"Authorization": SECRET_A}},
            "request auth": {"auth": _basic_auth()},
            "session auth": {"client_kwargs": {"auth": _basic_auth()}},
        }[given]
        ds = ShardListDataset([{"url": url, "nsamples": 3}], storage_options=options)
        assert len(_read_all(ds)) == 3
        assert b.seen and b.auth_seen() == {None}
    finally:
        a.shutdown()
        a.server_close()
        b.stop()


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
def test_a_redirect_to_another_origin_drops_every_header_of_the_options(
    tmp_path: Path, transport: str
) -> None:
    """A header given for one origin (an API key) must not reach the origin a redirect names.

    The redirect is followed (the shard is read from B), without the header: aiohttp's hop
    loses it (storage/redirects.py); obstore would keep it, so such options read through fsspec.
    """
    if transport == "obstore":
        pytest.importorskip("obstore")
    root = tmp_path / "b"
    root.mkdir()
    write_shard(root / "b.tar", make_samples(3, prefix="b", fields=(".txt",)))
    b = RecordingServer(root)
    at_a: list[str | None] = []

    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            at_a.append(self.headers.get("X-Api-Key"))
            self.send_response(302)
            self.send_header("Location", b.base + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

    a = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=a.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{a.server_address[1]}/b.tar"
        ds = ShardListDataset(
            [{"url": url, "nsamples": 3}],
            storage_options={"headers": {"X-Api-Key": "KEY-FOR-A"}, "transport": transport},
        )
        if transport == "obstore":
            with pytest.warns(ObstoreFallbackWarning, match="redirect to another origin"):
                assert len(_read_all(ds)) == 3
        else:
            assert len(_read_all(ds)) == 3
        assert b.seen and "KEY-FOR-A" not in b.all_header_values()
        assert at_a and set(at_a) == {"KEY-FOR-A"}  # given where it was meant for
    finally:
        a.shutdown()
        a.server_close()
        b.stop()


@pytest.mark.servers
def test_an_index_on_s3_naming_an_http_shard_sends_it_no_s3_options(s3_server, tmp_path: Path):
    """S3 keys, secret and endpoint stay with S3; the HTTP shard is opened with no options."""
    root = tmp_path / "www"
    root.mkdir()
    write_shard(root / "h.tar", make_samples(3, prefix="h", fields=(".txt",)))
    write_shard(tmp_path / "s.tar", make_samples(3, prefix="s", fields=(".txt",)))
    web = RecordingServer(root)
    try:
        s3_shard = s3_server.put(tmp_path / "s.tar", "origins/s.tar")
        index = s3_server.url("origins/train.json")
        s3 = dict(s3_server.storage_options)
        # per origin: the build names both shards, and S3's options are S3's only
        build_index([s3_shard, f"{web.base}/h.tar"], index, storage_options={"s3://": s3})
        web.seen.clear()
        ds = ShardListDataset(index, storage_options=s3)
        assert sorted(_read_all(ds)) == [f"h{i:06d}" for i in range(3)] + [
            f"s{i:06d}" for i in range(3)
        ]
        assert web.seen and web.auth_seen() == {None}
        assert s3["secret"] not in web.all_header_values()
    finally:
        web.stop()


def test_a_local_index_names_its_servers(two_servers, tmp_path: Path) -> None:
    """A local file is the user's own: the servers it names get the options."""
    a, b = two_servers
    local = tmp_path / "local"
    local.mkdir()
    build_index([f"{a.base}/a.tar", f"{b.base}/b.tar"], str(local / "train.json"))
    a.seen.clear()
    b.seen.clear()
    b.require = SECRET_A
    opts = {"headers": {"Authorization": SECRET_A}}
    assert len(_read_all(ShardListDataset(str(local / "train.json"), storage_options=opts))) == 12
    assert a.auth_seen() == {SECRET_A} == b.auth_seen()


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_dataloader_workers_keep_the_credentials_at_home(
    two_servers: tuple[RecordingServer, RecordingServer], context: str
) -> None:
    """The dataset pickled into workers keeps the origins its options are for."""
    torch_data = pytest.importorskip("torch.utils.data")
    a, b = two_servers
    ds = ShardListDataset(
        f"{a.base}/train.json", storage_options={"headers": {"Authorization": SECRET_A}}
    )
    loader = torch_data.DataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=_keys,
    )
    try:
        keys = sorted(k for batch in loader for k in batch)
    finally:
        ds.close()
    assert len(keys) == 12
    assert a.auth_seen() == {SECRET_A}
    assert b.seen and b.auth_seen() == {None}


def _keys(batch: list[dict]) -> list[str]:
    return [s["__key__"] for s in batch]


def test_a_remote_index_named_by_a_local_description_names_only_its_own_origin(
    two_servers: tuple[RecordingServer, RecordingServer], tmp_path: Path
) -> None:
    """A local file's ``source_url`` on A names A, not the servers A's file names (B)."""
    a, b = two_servers
    mine = tmp_path / "mine.json"
    mine.write_text(
        '{"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "mine",'
        f' "datasets": [{{"source_url": "{a.base}/train.json"}}]}}'
    )
    opts = {"headers": {"Authorization": SECRET_A}}
    assert len(_read_all(ShardListDataset(str(mine), storage_options=opts))) == 12
    assert a.auth_seen() == {SECRET_A}
    assert b.seen and b.auth_seen() == {None}
    assert SECRET_A not in b.all_header_values()


def test_a_stream_names_no_origin(two_servers: tuple[RecordingServer, RecordingServer]) -> None:
    """A description read from an open stream names no URL: no remote origin is trusted."""
    store = Store({"headers": {"Authorization": SECRET_A}}, named=(io.StringIO("{}"),))
    a, _ = two_servers
    assert store.named == frozenset()
    assert "headers" not in store.options_for(f"{a.base}/a.tar")


@pytest.mark.parametrize(
    ("transport", "header"), [("fsspec", "X-Api-Key"), ("obstore", "Authorization")]
)
def test_a_redirect_within_the_origin_keeps_the_headers(
    tmp_path: Path, transport: str, header: str
) -> None:
    """A hop to the same origin is followed with the options' headers (the server wants them).

    obstore keeps reading such a file itself when its only header is one reqwest drops on a
    hop to another origin (Authorization); an X-Api-Key file is read through fsspec.
    """
    if transport == "obstore":
        pytest.importorskip("obstore")
    write_shard(tmp_path / "m.tar", make_samples(3, prefix="m", fields=(".txt",)))
    data = (tmp_path / "m.tar").read_bytes()
    seen: list[tuple[str, str | None]] = []

    class Moved(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get(header)))
            if self.headers.get(header) != "KEY":
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path.startswith("/moved/"):
                self.send_response(302)
                self.send_header("Location", self.path.removeprefix("/moved"))
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                rng = self.headers.get("Range", "bytes=0-").removeprefix("bytes=")
                lo, _, hi = rng.partition("-")
                start, end = int(lo), min(len(data), int(hi) + 1 if hi else len(data))
                self.send_response(206)
                self.send_header("ETag", '"v1"')
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                self.send_header("Content-Length", str(end - start))
                self.end_headers()
                self.wfile.write(data[start:end])

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/moved/m.tar"
        options = {"headers": {header: "KEY"}, "transport": transport}
        if transport == "obstore":
            from wids.storage.viaobstore import ObstoreTransport

            assert isinstance(Store(options).source(url).transport(), ObstoreTransport)
        ds = ShardListDataset([{"url": url, "nsamples": 3}], storage_options=options)
        assert len(_read_all(ds)) == 3
        assert any(p == "/m.tar" for p, _ in seen) and {v for _, v in seen} == {"KEY"}
    finally:
        server.shutdown()
        server.server_close()


def test_the_hand_written_http_client_is_never_given_credentials() -> None:
    """storage/http1.py does not follow redirects (they go to aiohttp): it must carry nothing.

    It is chosen only for URLs without ``user:password@`` and options without headers, auth,
    cookies or anything but the client's timeout.
    """
    from wids.storage.backends import plain_options

    assert plain_options("http://127.0.0.1:9/a.tar", {"client_kwargs": {"timeout": 5}})
    for url, options in (
        ("http://u:pw@127.0.0.1:9/a.tar", {}),
        ("http://127.0.0.1:9/a.tar", {"headers": {"X-Api-Key": "k"}}),
        ("http://127.0.0.1:9/a.tar", {"client_kwargs": {"headers": {"X-Api-Key": "k"}}}),
        ("http://127.0.0.1:9/a.tar", {"client_kwargs": {"auth": "basic"}}),
        ("http://127.0.0.1:9/a.tar", {"client_kwargs": {"cookies": {"c": "1"}}}),
        ("http://127.0.0.1:9/a.tar", {"auth": "basic"}),
    ):
        assert not plain_options(url, options), (url, options)


def test_the_origin_headers_are_kept_at_is_the_one_aiohttp_requests_name() -> None:
    """An IDN host is sent in punycode: its own requests must keep their headers."""
    from wids.storage.redirects import confine

    options = confine("http://Bücher.Example/a.tar", {"headers": {"X-Api-Key": "SECRET-K"}})
    keep = options["client_kwargs"]["middlewares"][0]
    assert keep.home == "http://xn--bcher-kva.example:80"
    assert {"x-api-key", "authorization", "cookie"} <= set(keep.names)
    assert "SECRET" not in repr(keep)  # it keys the filesystem by names, never by values
    plain = {"client_kwargs": {"timeout": 5}}
    assert confine("http://h/a.tar", plain) is plain and confine("s3://b/k", options) is options
