"""URLs and paths: local or remote, how an index records a shard, and local file names for URLs.

- :func:`is_local` / :func:`is_remote`: a plain path or ``file://`` URL is local; anything else
  (``s3://``, ``https://``, chained ``a::b``) is remote.
- :func:`local_file` (the absolute path a local URL names), :func:`local_path` (a local output
  with ``file://`` removed), :func:`output_dir` and :func:`stored_url`: where an index lives
  and how it records a shard.
- :func:`url_name`: the one way wids names a local file after a URL (cache entries, scan
  tables, index snapshots, member-table sidecars): credentials never reach a file name, a
  re-signed URL names the same file, and URLs that differ in any other query parameter name
  different files.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from .redact import file_identity, strip_credentials

__all__ = [
    "anchored",
    "is_local",
    "is_remote",
    "local_file",
    "local_path",
    "output_dir",
    "stored_url",
    "url_name",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def is_local(url: str) -> bool:
    """Whether ``url`` is a plain local path or a ``file://`` URL."""
    if url.startswith("file://"):
        return True
    return "://" not in url and "::" not in url


def is_remote(url: str) -> bool:
    """Whether ``url`` names something other than a local file (``file://`` is local)."""
    return ("://" in url or "::" in url) and not url.startswith("file://")


def local_file(url: str) -> str:
    """The absolute path of a local ``url`` (``file://`` removed, ``~`` expanded)."""
    path = url[len("file://") :] if url.startswith("file://") else url
    return os.path.abspath(os.path.expanduser(path))


def anchored(src: Any) -> Any:
    """``src`` with a relative local path, or each of a list of them, made absolute now.

    A dataset names its shards when it is made, as the reference did: an ``os.chdir`` after
    that (or a worker started in another directory) must not change what a relative path
    names. URLs, ``pipe:`` commands and anything that is not a path come back unchanged.
    """
    if isinstance(src, os.PathLike):
        src = os.fspath(src)
    if isinstance(src, str):
        return local_file(src) if _relative_local(src) else src
    if (
        isinstance(src, (list, tuple))
        and src
        and all(isinstance(s, (str, os.PathLike)) for s in src)
    ):
        return type(src)(anchored(s) for s in src)
    return src


def _relative_local(path: str) -> bool:
    return is_local(path) and not path.startswith(("pipe:", "file://")) and not os.path.isabs(path)


def local_path(url: str) -> str:
    """A local output as a plain path (``file://`` removed)."""
    return url.removeprefix("file://")


def output_dir(url: str) -> str:
    """The directory of an output: an absolute local path, or a URL."""
    if is_remote(url):
        return url.rpartition("/")[0]
    return os.path.dirname(os.path.abspath(local_path(url)))


def stored_url(url: str, out_dir: str) -> str:
    """How an index in ``out_dir`` records a shard: relative when inside that directory.

    Args:
        url: The shard, as given or resolved (a path, ``file://`` path, or URL).
        out_dir: The index's directory: an absolute local path or a URL (``s3://bucket/x``).

    Example:
        >>> stored_url("s3://bucket/data/train-0.tar", "s3://bucket/data")
        'train-0.tar'
    """
    if is_remote(url):
        prefix = out_dir.rstrip("/") + "/"
        if is_remote(out_dir) and url.startswith(prefix) and "?" not in url:
            return url[len(prefix) :]
        return url
    path = os.path.abspath(local_path(url))
    if is_remote(out_dir):
        return "file://" + path  # a bare "/x" would resolve against the remote index's host
    rel = os.path.relpath(path, out_dir)
    return path if rel.startswith("..") else rel


def url_name(url: str, suffix: str = "") -> str:
    """A local file name for ``url``: 24 hex digits of a hash, a readable tail, ``suffix``.

    Credentials are not part of a file's identity: the hash is of the URL without
    ``user:password@`` and the signature parameters of S3, GCS, Azure and CloudFront signed
    URLs (:func:`~wids.storage.redact.strip_credentials`), so a re-signed URL names the same
    file and no secret reaches a file name. Every other query parameter is part of it:
    ``get?key=a`` and ``get?key=b`` name two files. (Earlier versions also dropped every
    parameter whose name merely contained ``key``, ``sig``, ``token``, ``auth`` or
    ``session``: such URLs now have new names, and their old cache entries are not found.)
    The tail is
    the URL's last path segment (no query, at most 80 characters, only ``A-Za-z0-9._-``, no
    leading dot), ``file`` when there is none.

    Example:
        >>> url_name("https://u:pw@host/data/train-0.tar?X-Amz-Signature=s", ".json")[24:]
        '-train-0.tar.json'
    """
    clean = strip_credentials(url)
    identity = file_identity(url)  # a user name's hash too: alice's and bob's ftp homes differ
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    tail = re.split(r"[?#]", clean, maxsplit=1)[0].rstrip("/").rsplit("/", 1)[-1]
    tail = _UNSAFE.sub("_", tail)[-80:].lstrip(".")
    return f"{digest}-{tail or 'file'}{suffix}"
