"""Which storage options a URL is opened with: credentials go only to the origins they are for.

Storage options are given for the URLs a user names (a dataset's index, a shard list, a
command's argument). An index is data, not the user: the shards it names may live on other
servers, and the user's ``Authorization`` header, cookies, keys or tokens must not follow them
there. So a :class:`Scope` sorts options by *origin*:

- :func:`origin`: for URLs whose server is part of the URL (``http``, ``https``, ``ftp``,
  ``sftp``, ``webdav`` ...) the origin is ``scheme://host:port`` (lower case, default port
  filled in, ``user:password@`` dropped). For object stores (``s3``, ``gs``, ``az``, ``hf`` ...)
  the server is chosen by the options (``endpoint_url``, the account), not by the URL, so an
  index cannot steer those credentials anywhere: their origin is the scheme alone (``s3://``).
  ``s3a`` counts as ``s3``, ``gcs`` as ``gs``. A chained URL (``simplecache::https://...``)
  has the origin of its last part. Local paths have none.
- The *flat* options (``{"headers": {...}, "key": ...}``) are for the *named* origins: those of
  the URLs the store was made for. A URL on any other origin is opened with the flat options
  minus every credential-bearing one (:func:`without_credentials`), if it is of the same kind
  as a named one (``http`` and ``https`` are one kind); with none of them otherwise (an
  index on S3 naming an ``https://`` shard: S3 options mean nothing to an HTTP client).
- Options keyed by an origin (``{"http://b.example:8080": {"headers": {...}}}``) are for that
  origin only; they are merged over what that origin gets from the flat options.

A scope made without named URLs (``named=None``) gives the flat options to every origin: the
behaviour of a bare :class:`~wids.storage.source.Store`. Every public entry point that reads
URLs out of a file (a dataset, ``open_index``, ``verify_index``, ``subset``, the CLI) names the
URLs it was given (:func:`named_by`). A local file the user points at is the user's own: the
URLs written in it count as named (a local index of S3 or HTTP shards gets the options), whereas
a file fetched from a server (also one a local file names through ``source_url``) names servers
of its author's choosing. What names no remote URL (an open stream) names no origin.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Scope", "named_by", "origin", "without_credentials"]

# Schemes whose URL names the server the request goes to (so an index could name another one).
_SERVER_SCHEMES = frozenset(
    {"http", "https", "ftp", "ftps", "sftp", "ssh", "smb", "webdav", "dav", "davs", "webhdfs"}
)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21, "ftps": 990, "sftp": 22, "ssh": 22}
# "::" that starts the next link of a chained URL (not the "::" of an IPv6 address)
_CHAIN = re.compile(r"::(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_AUTHORITY = re.compile(r"[^/?#]*")
_ALIASES = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az"}

# Option names that carry or select credentials, matched anywhere in a (nested) key: headers of
# any name (a custom header may be an API key), auth objects, cookies, keys, secrets, tokens,
# passwords, session and credential objects, SAS tokens, client certificates and TLS contexts,
# connectors and client factories (which may hold any of these), profiles and accounts.
_CREDENTIAL = re.compile(
    r"header|auth|cookie|key|secret|token|passw|credential|session|sas|signature|cert|ssl|tls"
    r"|connector|get_client|profile|account|connection_string|user|login|netrc",
    re.IGNORECASE,
)


def origin(url: str) -> str | None:
    """The origin ``url``'s requests go to, as a normalised URL prefix; ``None`` if local.

    Example:
        >>> origin("HTTP://alice:pw@Data.Example:80/a/b.tar?x=1")
        'http://data.example:80'
        >>> origin("s3://bucket/a.tar"), origin("simplecache::https://h/x"), origin("/d/a.tar")
        ('s3://', 'https://h:443', None)
    """
    url = os.fspath(url)
    if "::" in url:
        url = _CHAIN.split(url)[-1]
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    scheme = scheme.lower()
    scheme = _ALIASES.get(scheme, scheme)
    if scheme == "file" or scheme == "local":
        return None
    if scheme not in _SERVER_SCHEMES:
        return f"{scheme}://"
    hostport = _AUTHORITY.match(rest).group(0).rpartition("@")[2].lower()  # type: ignore[union-attr]
    if hostport.startswith("["):  # IPv6
        host, _, port = hostport.partition("]")
        host, port = host + "]", port.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    if port and not port.isdigit():  # keep it apart from every good origin
        return f"{scheme}://{hostport}#unparsable"
    port = str(int(port)) if port else str(_DEFAULT_PORTS.get(scheme, ""))
    return f"{scheme}://{host}" + (f":{port}" if port else "")


def _kind(o: str | None) -> str:
    """The kind of filesystem an origin is read with (``http`` and ``https`` are one)."""
    scheme = (o or "").split("://", 1)[0]
    return "http" if scheme == "https" else scheme


def named_by(src: Any, *more: Any) -> Any:
    """A store's ``named`` URLs for what the user passed (``src``, then ``base``, ``url_map``).

    ``src`` is an index, a description or a shard list. When ``src`` is a local path, the
    file is the user's own. If neither it nor a local description it names through
    ``source_url`` names a *remote* ``source_url``, every URL they lead to was written by the
    user: ``None`` (the options go to every origin). Otherwise the URLs written in those local
    files are named, and a remote ``source_url`` names only its own origin, not the servers
    written inside that fetched file. Anything else: ``(src, *more)``.
    """
    if isinstance(src, (str, os.PathLike)) and origin(os.fspath(src)) is None:
        names = _local_names(os.fspath(src))
        return None if names is None else (*names, *more)
    return (src, *more)


# URLs written in a local file (``\/`` is JSON's escape of ``/``)
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>/?#]*")
_MAX_LOCAL_FILES = 64  # local descriptions followed through source_url
_MAX_LOCAL_BYTES = 1 << 28
_HEAD = 4096  # enough to tell a JSON description from a SQLite or .widx index


def _local_names(path: str) -> list[str] | None:
    """The URLs written in the local file ``path`` and the local descriptions it names.

    ``None`` when no remote ``source_url`` is on the way (the common case: nothing to scan).
    Only JSON descriptions have ``source_url``; a SQLite or ``.widx`` index (or a shard) is
    recognised from its first bytes and never read whole here.
    """
    path = path.removeprefix("file://")
    if path.endswith((".tar", ".tgz", ".tar.gz", ".tar.zst")):  # a shard, not a description
        return []
    texts: list[str] = []
    remote = False
    todo, seen = [path], set[str]()
    while todo and len(seen) < _MAX_LOCAL_FILES:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(p, "rb") as f:
                head = f.read(_HEAD)
                if head.lstrip()[:1] != b"{":
                    continue  # not a JSON description: no source_url in it
                data = head + f.read(_MAX_LOCAL_BYTES - len(head))
        except OSError:
            continue  # whoever reads it reports the error
        text = data.decode("utf-8", "replace").replace("\\/", "/")
        texts.append(text)
        if '"source_url"' in text:
            for ref, is_remote in _refs(text, os.path.dirname(p)):
                if is_remote:
                    remote = True
                else:
                    todo.append(ref)
    if not remote:
        return None
    return [url for text in texts for url in _URL_IN_TEXT.findall(text)]


def _refs(text: str, here: str) -> Iterable[tuple[str, bool]]:
    """The ``source_url`` references of a description's text: (local path or URL, remote)."""
    try:
        desc = json.loads(text)
    except ValueError:
        return
    stack = [desc]
    while stack:
        d = stack.pop()
        if not isinstance(d, Mapping):
            continue
        ref = d.get("source_url")
        if isinstance(ref, str) and ref:
            if origin(ref) is None:
                yield os.path.join(here, ref.removeprefix("file://")), False
            else:
                yield ref, True
        datasets = d.get("datasets")
        if isinstance(datasets, list):
            stack.extend(datasets)


def is_origin_key(key: object) -> bool:
    """Whether a storage-options key names an origin (``"https://host:port"``, ``"s3://"``)."""
    return isinstance(key, str) and "://" in key


def without_credentials(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without any credential-bearing entry, at any depth of nested mappings.

    Example:
        >>> without_credentials({"headers": {"A": "b"}, "client_kwargs": {"auth": 1, "timeout": 5}})
        {'client_kwargs': {'timeout': 5}}
    """
    out: dict[str, Any] = {}
    for k, v in options.items():
        if _CREDENTIAL.search(str(k)):
            continue
        out[k] = without_credentials(v) if isinstance(v, Mapping) else v
    return out


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        out[k] = _merge(old, v) if isinstance(old, Mapping) and isinstance(v, Mapping) else v
    return out


def _urls(value: Any) -> Iterable[str]:
    """Every URL-like string in ``value`` (a URL, a path, or lists/mappings of them)."""
    if isinstance(value, (str, os.PathLike)):
        yield os.fspath(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _urls(v)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _urls(v)


class Scope:
    """Storage options sorted by origin (see the module).

    Args:
        options: The storage options: flat entries, and entries keyed by an origin.
        named: The URLs the flat options are for (strings, or lists and mappings holding
            them: a shard list or spec given in Python names all its URLs); ``None`` gives the
            flat options to every origin, URLs of local files only (or none) to none.

    Raises:
        TypeError: An origin's entry is not a mapping.
    """

    __slots__ = ("_withholds", "flat", "named", "per_origin")

    def __init__(self, options: Mapping[str, Any], named: Any = None) -> None:
        self.flat = {k: v for k, v in options.items() if not is_origin_key(k)}
        per: dict[str, dict[str, Any]] = {}
        for k, v in options.items():
            if not is_origin_key(k):
                continue
            if not isinstance(v, Mapping):
                raise TypeError(
                    f"storage_options[{k!r}] must be a mapping of options for that origin, "
                    f"not {type(v).__name__}"
                )
            per[origin(k) or k] = dict(v)
        self.per_origin = per
        self.named: frozenset[str] | None = None
        if named is not None:
            found = (origin(u) for u in _urls(named))
            # none remote (a stream, local files only): no remote origin gets the options
            self.named = frozenset(o for o in found if o is not None)
        # whether any URL could be refused for want of withheld credentials (checked per request)
        self._withholds = self.named is not None and without_credentials(self.flat) != self.flat

    def _trusts(self, o: str | None) -> bool:
        return o is None or self.named is None or o in self.named

    def trusted(self, url: str) -> bool:
        """Whether ``url`` gets the flat options whole (its origin is named, or it is local)."""
        return self.named is None or self._trusts(origin(url))

    def options_for(self, url: str) -> Mapping[str, Any]:
        """The options to open ``url`` with (read-only): never another origin's credentials."""
        if self.named is None and not self.per_origin:  # a bare store: parse nothing
            return self.flat
        o = origin(url)
        if self._trusts(o):
            base = self.flat
        elif _kind(o) in {_kind(n) for n in self.named or ()}:
            base = without_credentials(self.flat)
        else:
            base = {}
        entry = self.per_origin.get(o or "")
        return _merge(base, entry) if entry else base

    def withheld(self, url: str) -> str:
        """What to say after a refusal of ``url``, if flat credentials were withheld from it."""
        if not self._withholds:
            return ""
        o = origin(url)
        if self._trusts(o) or o in self.per_origin:
            return ""
        names = ", ".join(sorted(self.named or ())) or "the URLs you named"
        return (
            f"; the credentials in storage_options were given for {names} and withheld from "
            f"{o} (an origin you did not name); to send credentials there, add "
            f"storage_options={{{o!r}: {{...}}}} (see docs/credentials.md)"
        )
