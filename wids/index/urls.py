"""Shard URLs: resolving against a base, mirrors (``url_map``), remote-only checks, braces.

- :func:`resolve_url` and :func:`url_dir` — relative shard URLs resolve against the index's
  directory (a path or any fsspec URL), as the reference does.
- :func:`check_url_map`, :func:`map_url`, :func:`apply_url_map` — reading shards from a mirror.
- :func:`is_remote_url`, :func:`check_remote_ref` — an index read from a remote location may
  not name the user's local files.
- :func:`expand_braces` — shell-style ``{000..099}`` and ``{a,b}`` patterns.
- :func:`unpipe_url` — webdataset's ``pipe:curl -s URL`` (and ``gsutil cat``, ``gcloud storage
  cat``, ``aws s3 cp URL -``) read as the URL they fetch; every other ``pipe:`` is refused.
  :func:`resolve_url` and :func:`expand_braces` apply it, so every way shard URLs enter does.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import warnings
from collections.abc import Mapping
from itertools import product

from ..errors import PipeCommandError
from ..storage import redact_url
from .model import ShardInfo

__all__ = [
    "LOCAL_SCHEMES",
    "UrlMap",
    "apply_url_map",
    "check_remote_ref",
    "check_url_map",
    "expand_braces",
    "is_remote_url",
    "map_url",
    "resolve_url",
    "unpipe_url",
    "url_dir",
]


def resolve_url(url: str, base: str | None) -> str:
    """Resolve a shard URL against a base directory.

    Absolute URLs (with a scheme) and absolute paths are returned as they are (``~`` is
    expanded); a path-absolute ``/x`` under a remote base keeps the base's scheme and host,
    as in the reference. Without a base, relative paths resolve against the current directory.

    Args:
        url: The URL or path as stored.
        base: A directory path or URL (``s3://bucket/prefix``), or ``None``.

    Returns:
        An absolute URL or an absolute, normalised local path.

    Example:
        >>> resolve_url("../b/x.tar", "s3://bucket/a")
        's3://bucket/b/x.tar'

    Raises:
        PipeCommandError: A ``pipe:`` URL that :func:`unpipe_url` does not map.
    """
    url = unpipe_url(url)
    if "://" in url or "::" in url:
        return url
    if base and "::" in base:
        prefix, _, last = base.rpartition("::")
        return f"{prefix}::{resolve_url(url, last)}"
    if base and base.startswith("file://"):
        base = base[len("file://") :]
    if base and "://" in base:
        scheme, rest = base.split("://", 1)
        netloc, _, path = rest.partition("/")
        joined = posixpath.normpath(posixpath.join("/" + path, url))
        return f"{scheme}://{netloc}{'/' + joined.lstrip('/') if joined != '/' else '/'}"
    if url.startswith("~"):
        return os.path.expanduser(url)
    if url.startswith("/"):
        return os.path.normpath(url)
    root = os.path.abspath(os.path.expanduser(base)) if base else os.getcwd()
    return os.path.normpath(os.path.join(root, url))


UrlMap = tuple[tuple[str, str], ...]
"""A validated ``url_map``: ``(old prefix, new prefix)`` pairs, longest prefix first."""


def _absolute(url: str) -> bool:
    return "://" in url or "::" in url or os.path.isabs(url)


def check_url_map(url_map: Mapping[str, str] | UrlMap | None) -> UrlMap:
    """Validate a ``url_map`` (``{"https://old/": "s3://new/"}``) and order it for matching.

    Shard URLs are resolved first (relative ones against the index's directory), then the
    longest ``old`` prefix that starts a URL is replaced by its ``new`` prefix. Local shards
    resolve to absolute paths, so a local prefix is an absolute path (``file://`` is accepted
    and stripped).

    Args:
        url_map: Old prefix to new prefix; ``None`` or empty for none.

    Returns:
        The pairs, longest old prefix first.

    Raises:
        TypeError: Not a mapping of strings.
        ValueError: A prefix is empty or relative, one ends in ``/`` and its replacement does
            not (or the reverse), or two prefixes are the same.
    """
    if not url_map:
        return ()
    if not isinstance(url_map, (Mapping, tuple)):
        raise TypeError(f"url_map must be a dict of prefix -> prefix, not {type(url_map).__name__}")
    items = url_map.items() if isinstance(url_map, Mapping) else url_map
    pairs: dict[str, str] = {}
    for old, new in items:
        if not isinstance(old, str) or not isinstance(new, str):
            kinds = f"{type(old).__name__} -> {type(new).__name__}"
            raise TypeError(f"url_map entries must be str -> str, not {kinds}")
        shown = f"url_map {redact_url(old)!r} -> {redact_url(new)!r}"
        if not _absolute(old) or not _absolute(new):
            raise ValueError(f"{shown}: both must be absolute URLs (scheme://...) or paths")
        if old.endswith("/") != new.endswith("/"):
            raise ValueError(f"{shown}: end both prefixes in '/' or neither")
        key = old.removeprefix("file://")
        if key in pairs:
            raise ValueError(f"{shown}: the prefix {redact_url(key)!r} is given twice")
        pairs[key] = new
    return tuple(sorted(pairs.items(), key=lambda kv: len(kv[0]), reverse=True))


def map_url(url: str, url_map: UrlMap) -> str:
    """``url`` with the longest matching prefix of a checked ``url_map`` replaced."""
    for old, new in url_map:
        if url.startswith(old):
            return new + url[len(old) :]
    return url


def apply_url_map(shards: list[ShardInfo], url_map: UrlMap) -> list[ShardInfo]:
    """Shards with their URLs mapped by a checked ``url_map``.

    A mapped shard keeps its size and md5 but not its etag and mtime: those were issued by the
    store it was indexed in, and the new location issues its own. It is still checked by size
    and by a recorded member's tar header when opened.
    """
    if not url_map:
        return shards
    out = []
    for info in shards:
        url = map_url(info.url, url_map)
        if url != info.url:
            info = ShardInfo(url, info.nsamples, info.size, None, None, info.md5sum)
        out.append(info)
    return out


# fsspec protocols that reach local files or this process's memory (or, like ``reference``
# and ``dir``, wherever their own configuration points): never where a remote index may send us.
# ``asynclocal`` (morefs) is the local disk; ``git`` and ``dvc`` read local repositories.
LOCAL_SCHEMES = frozenset(
    ("file", "local", "memory", "reference", "dir", "asynclocal", "git", "dvc")
)


def is_remote_url(url: str) -> bool:
    """Whether ``url`` names a remote location.

    Every part of an fsspec ``::`` chain must have a protocol, none of :data:`LOCAL_SCHEMES`.

    Example:
        >>> is_remote_url("https://host/a.tar"), is_remote_url("simplecache::s3://b/a.tar")
        (True, True)
        >>> is_remote_url("file:///etc/passwd"), is_remote_url("tar://x::/data/a.tar")
        (False, False)
    """
    parts = url.split("::")
    if "://" not in parts[-1]:
        return False
    for part in parts:
        scheme = part.split("://", 1)[0] if "://" in part else part
        if not scheme or scheme.lower() in LOCAL_SCHEMES:
            return False
    return True


def check_remote_ref(url: str, origin: str | None, allow_local: bool) -> str | None:
    """Why ``url``, read from the index file ``origin``, may not be used, or ``None``.

    An index read from a remote location is not trusted with the user's local files: every
    location it names (shards, member tables, other descriptions) must be remote too, unless
    the caller passed ``allow_local_shards=True``. Indexes that are local themselves (files,
    ``memory://``, Python objects) may name anything.
    """
    if allow_local or origin is None or not is_remote_url(origin) or is_remote_url(url):
        return None
    return (
        f"{redact_url(url)!r} is not a remote location, but the index is remote: refused "
        "(pass allow_local_shards=True, or --allow-local-shards, if you trust this index)"
    )


def url_dir(url: str) -> str:
    """The directory containing a file given by path or URL (absolute for local paths)."""
    if "://" in url or "::" in url:
        head, _, _ = url.rpartition("/")
        return head if "://" in head or "::" in head else url
    return os.path.dirname(os.path.abspath(os.path.expanduser(url)))


# -------------------------------------------------------------------------------------------
# Brace patterns

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def _alternatives(body: str) -> list[str] | None:
    m = _RANGE.match(body)
    if m:
        a, b = m.group(1), m.group(2)
        lo, hi = int(a), int(b)
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-").startswith("0") for s in (a, b))
        width = max(len(a), len(b)) if padded else 0
        step = 1 if hi >= lo else -1
        return [str(i).zfill(width) for i in range(lo, hi + step, step)]
    if "," in body:
        return body.split(",")
    return None


# fsspec filesystems that wrap the next link of a chained URL (``simplecache::s3://b/x.tar``)
_WRAPPERS = frozenset(
    ("simplecache", "filecache", "blockcache", "cached", "tar", "zip", "libarchive", "dir")
)
_LIST_SEP = re.compile(r"::(?![^\[]*\])")  # not the "::" of an IPv6 host (``http://[::1]/``)
_BARE_PROTOCOL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def _shard_list(pattern: str) -> list[str]:
    """Several patterns in one string, split at ``::`` (webdataset: ``a-{0..3}.tar::b.tar``).

    Unless the first link is an fsspec filesystem that wraps the next (a chained URL, kept
    whole): ``simplecache::s3://...``, ``tar://member::s3://...``.
    """
    parts = _LIST_SEP.split(pattern)
    first = parts[0]
    protocol = first if _BARE_PROTOCOL.fullmatch(first) else first.partition("://")[0]
    if len(parts) == 1 or protocol in _WRAPPERS:
        return [pattern]
    return [p for p in parts if p]


def expand_braces(pattern: str) -> list[str]:
    """Expand shell-style brace groups: ranges ``{000..099}`` and lists ``{a,b,c}``.

    Ranges are zero-padded to the wider bound when either bound has a leading zero, and may
    count down. Several groups give their product, leftmost varying slowest. A group that is
    neither a range nor a list (``{x}``) stays literal, as in the shell. Nested groups are not
    supported.

    Example:
        >>> expand_braces("train-{000..002}.tar")
        ['train-000.tar', 'train-001.tar', 'train-002.tar']
        >>> expand_braces("{a,b}-{1..2}")
        ['a-1', 'a-2', 'b-1', 'b-2']

    ``::`` separates several patterns, as in webdataset
    (``"a-{0..3}.tar::b-{0..3}.tar"``: a's shards, then b's), except after an fsspec filesystem
    that wraps the next link of a chained URL (``simplecache::s3://b/x-{0..3}.tar``). A
    ``pipe:`` pattern is first read by :func:`unpipe_url` (and refused if it is not a known
    fetch).
    """
    if "::" in pattern:
        parts = _shard_list(pattern)
        if len(parts) != 1 or parts[0] != pattern:
            return [url for part in parts for url in expand_braces(part)]
    pattern = unpipe_url(pattern)
    pieces: list[list[str]] = []
    pos = 0
    for m in _BRACE.finditer(pattern):
        alts = _alternatives(m.group(1))
        if alts is None:
            continue
        pieces.append([pattern[pos : m.start()]])
        pieces.append(alts)
        pos = m.end()
    pieces.append([pattern[pos:]])
    return ["".join(parts) for parts in product(*pieces)]


# -------------------------------------------------------------------------------------------
# webdataset's pipe: URLs

# curl's flags that change neither what is fetched nor where it goes.
_CURL_FLAGS = frozenset(
    ("-s", "-S", "-L", "-f", "--silent", "--show-error", "--location", "--fail")
)
_CURL_SHORT = re.compile(r"^-[sSLf]+$")
# Commands that write one object to stdout: (words before the URL, words after, URL schemes).
_FETCHES: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    (("gsutil", "cat"), (), ("gs",)),
    (("gcloud", "storage", "cat"), (), ("gs",)),
    (("aws", "s3", "cp"), ("-",), ("s3",)),
)
_PUNCTUATION = frozenset(";|&<>()")
_SAFE_URL = re.compile(r"^[A-Za-z0-9]+://[^/\s]+(/[^\s]*)?$")
_warned: set[str] = set()


def _shown(tokens: list[str]) -> str:
    """A refused command as errors show it: URLs redacted, any other argument elided."""
    known = {"curl", "gsutil", "gcloud", "aws", "cat", "cp", "s3", "storage", "-", "||", "true"}
    out = []
    for t in tokens:
        if "://" in t:
            out.append(redact_url(t))
        elif t in known or t in _CURL_FLAGS or _CURL_SHORT.match(t) or set(t) <= _PUNCTUATION:
            out.append(t)
        else:
            out.append("…")
    return "pipe:" + " ".join(out)


def _url_of(tokens: list[str]) -> tuple[str, str] | None:
    """The URL a known fetch command reads, and the command's shape, or ``None``."""
    if tokens[-2:] == ["||", "true"]:
        tokens = tokens[:-2]
    if not tokens:
        return None
    if tokens[0] == "curl":
        args = [t for t in tokens[1:] if t not in _CURL_FLAGS and not _CURL_SHORT.match(t)]
        if len(args) != 1:
            return None
        url = args[0]
        schemes: tuple[str, ...] = ("http", "https")
        shape = " ".join("URL" if t == url else t for t in tokens)
    else:
        for before, after, fetch_schemes in _FETCHES:
            n = len(before)
            if tuple(tokens[:n]) == before and tuple(tokens[n + 1 :]) == after:
                url, schemes = tokens[n], fetch_schemes
                shape = " ".join((*before, "URL", *after))
                break
        else:
            return None
    if url.split("://", 1)[0].lower() not in schemes or not _SAFE_URL.match(url):
        return None
    return url, shape


def unpipe_url(url: str) -> str:
    """The URL a webdataset ``pipe:`` shard URL fetches; any other URL unchanged.

    Shard lists written for webdataset say ``pipe:curl -s -L https://host/x.tar || true``,
    ``pipe:gsutil cat gs://b/x.tar``, ``pipe:gcloud storage cat gs://b/x.tar`` or
    ``pipe:aws s3 cp s3://b/x.tar -``. wids never runs a shell command: these exact shapes
    (curl with only ``-s -S -L -f`` and their long forms, one ``http(s)`` URL; an optional
    ``|| true``) are read as the URL, through fsspec, with a warning once per process per
    shape. Anything else — other commands or flags, several URLs, ``;``, pipes, ``&&``,
    ``$(...)``, backticks, redirections — is refused.

    Args:
        url: A shard URL or path, possibly ``pipe:...``.

    Returns:
        ``url``, or the URL its ``pipe:`` command fetches.

    Raises:
        PipeCommandError: A ``pipe:`` URL that is not one of the known fetches.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     unpipe_url("pipe:curl -s -L http://host/a.tar || true")
        'http://host/a.tar'
    """
    if not url.startswith("pipe:"):
        return url
    command = url[len("pipe:") :]
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        tokens = list(lexer)
    except ValueError:  # an unclosed quote
        raise PipeCommandError(
            "a pipe: command wids cannot parse (unbalanced quotes): refused; wids never runs "
            "shell commands, give the shard's URL instead",
            shard="pipe:…",
        ) from None
    found = _url_of(tokens) if not any(c in command for c in "`$\\\n\r") else None
    if found is None:
        raise PipeCommandError(
            "not a plain fetch of one URL (curl [-s -S -L -f] http(s)://..., gsutil cat gs://..., "
            "gcloud storage cat gs://..., aws s3 cp s3://... -, optionally || true): refused; "
            "wids never runs shell commands, give the shard's URL instead",
            shard=_shown(tokens),
        )
    target, shape = found
    if shape not in _warned:
        _warned.add(shape)
        warnings.warn(
            f"wids reads 'pipe:{shape}' shard URLs as the URL itself through fsspec "
            f"(pipe:{shape.replace('URL', redact_url(target), 1)} -> {redact_url(target)}); "
            "wids never runs shell commands: write the URLs into the shard list to silence this",
            UserWarning,
            stacklevel=3,
        )
    return target
