"""Wildcards in shard URLs: ``s3://bucket/train-*.tar``, ``'data/*.tar'``, in natural order.

A shell expands an unquoted local ``data/*.tar`` itself, but not ``s3://...`` or a quoted
pattern; fsspec users expect ``*`` to work on every filesystem. :func:`expand_glob` lists what
a pattern matches: local patterns with :mod:`glob` (no fsspec import), remote ones with the
filesystem's own ``glob`` (S3/GCS listings, an HTTP server's directory page), under the
storage options the store gives that origin. Matches come sorted in natural order
(``name-2`` before ``name-10``), the same on every run, and a pattern that matches nothing is
a :class:`~wids.errors.ShardNotFoundError`, never an empty dataset.

Which characters are wildcards: ``*``, ``?`` and ``[`` in a local path or a bucket URL; in an
``http(s)://`` URL only ``*`` and ``[`` in the path (``?`` starts its query). Chained URLs
(``simplecache::s3://...``) are left as they are.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from ..errors import ShardNotFoundError
from .local import windows_style
from .redact import redact_url
from .urls import is_local

if TYPE_CHECKING:
    from .source import Store

__all__ = ["expand_glob", "has_glob", "natural_key"]

_DIGITS = re.compile(r"(\d+)")


def has_glob(url: str) -> bool:
    """Whether ``url`` holds a wildcard that :func:`expand_glob` expands."""
    if "::" in url:
        return False
    if url.startswith(("http://", "https://")):
        path = url.split("?", 1)[0].split("#", 1)[0]
        return "*" in path or "[" in path
    return any(c in url for c in "*?[")


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort key putting ``name-2`` before ``name-10`` (digit runs compare as numbers).

    Ties (``a01`` and ``a1``) fall back to the text itself, so the order is total. A digit
    run compares by its length without leading zeros, then its digits: no ``int()`` of a
    hostile listing's thousands of digits (Python refuses more than 4300).
    """
    parts = _DIGITS.split(text)
    key = tuple(_number(p) if i % 2 else p for i, p in enumerate(parts))
    return (key, text)


def _number(digits: str) -> tuple[int, str]:
    significant = digits.lstrip("0")
    return len(significant), significant


def expand_glob(pattern: str, store: Store | None = None) -> list[str]:
    """The files ``pattern`` matches, in natural order; ``[pattern]`` if it has no wildcard.

    Args:
        pattern: A local path, ``file://`` URL or fsspec URL, possibly with wildcards
            (``**`` matches across folders).
        store: Storage options for remote patterns (the store's options for that origin).

    Returns:
        Matching files (not folders), as URLs of the pattern's kind: relative local paths stay
        relative, ``file://`` stays, remote ones keep their protocol.

    Raises:
        ShardNotFoundError: Nothing matches.
        ImportError: The pattern's filesystem needs an extra that is not installed.

    Example:
        >>> expand_glob("s3://bucket/train-*.tar")  # doctest: +SKIP
        ['s3://bucket/train-1.tar', 's3://bucket/train-2.tar', 's3://bucket/train-10.tar']
    """
    if not has_glob(pattern) or (is_local(pattern) and os.path.exists(_local(pattern))):
        return [pattern]  # an existing file named "a[1].tar" is that file
    matches = _local_matches(pattern) if is_local(pattern) else _remote_matches(pattern, store)
    if not matches:
        why = "no file matches this pattern"
        if is_local(pattern) and windows_style(pattern):
            why += " (a Windows-style path: here folders are separated by '/')"
        raise ShardNotFoundError(why, shard=redact_url(pattern))
    return sorted(matches, key=natural_key)


def _local(pattern: str) -> str:
    return os.path.expanduser(pattern.removeprefix("file://"))


def _local_matches(pattern: str) -> list[str]:
    import glob

    prefix = "file://" if pattern.startswith("file://") else ""
    return [prefix + p for p in glob.glob(_local(pattern), recursive=True) if os.path.isfile(p)]


def _remote_matches(pattern: str, store: Store | None) -> list[str]:
    from .backends import with_defaults
    from .clients import filesystem
    from .source import Store

    store = store if store is not None else Store()
    options = with_defaults(pattern, store.source(pattern).storage_options, store.retry)
    fs, path = filesystem(pattern, options)
    try:
        found = fs.glob(path, detail=True)
    except FileNotFoundError:
        return []
    return [fs.unstrip_protocol(p) for p, info in found.items() if info.get("type") != "directory"]
