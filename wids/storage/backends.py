"""What wids knows of fsspec's backends: default options, stat answers, HTTP and S3 filesystems.

- :func:`with_defaults`: storage options that make S3, HTTP and GCS honour the retry policy's
  timeout and leave retries to wids (a user's own settings win).
- :func:`request_timeout`: the timeout of each ranged HTTP request wids makes itself.
- :func:`file_stat`: a :class:`~wids.storage.stats.FileStat` from a backend's ``info()``
  answer, whatever its keys for the etag and modification time (and GCS's MD5).
- :func:`is_http` / :func:`is_s3`: filesystems whose range requests wids makes itself,
  conditional and checked (:mod:`wids.storage.conditional`).
- :func:`url_to_fs`: fsspec's, with a missing backend package named by the extra that
  installs it (the ``s3`` extra); so is aiohttp, wherever an HTTP timeout needs it.

- :func:`preload`: import a URL's backend ahead of the first read.

Nothing here imports a backend at import time: filesystems are recognised by their protocol
and methods.
"""

from __future__ import annotations

import base64
import importlib
import urllib.parse
from collections.abc import Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from ..errors import IndexFormatError
from .redact import redact_url
from .retry import RetryPolicy
from .stats import FileStat

__all__ = [
    "file_stat",
    "is_http",
    "is_s3",
    "plain_options",
    "preload",
    "request_timeout",
    "url_to_fs",
    "with_defaults",
]


def url_to_fs(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs(url, **options)``; a missing backend names its extra.

    Raises:
        ImportError: The backend of ``url``'s protocol (s3fs, gcsfs, aiohttp) is not installed.
        IndexFormatError: No fsspec backend has ``url``'s protocol (a misspelt or made-up
            scheme, from the caller or from an index): fsspec's bare ``ValueError`` named no
            file.
    """
    import fsspec

    from ..extras import missing_backend

    options = {k: v for k, v in options.items() if k != "transport"}  # wids's, not fsspec's
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        raise missing_backend(url, e) from None
    except ValueError as e:
        if not str(e).startswith("Protocol not known"):
            raise
        raise IndexFormatError(
            f"no storage backend is known for this URL's protocol ({e}): a misspelt scheme?",
            shard=redact_url(url),
        ) from None
    return fs, path


def with_defaults(url: str, options: Mapping[str, Any], policy: RetryPolicy) -> dict[str, Any]:
    """``options`` for ``url``'s backend, with timeouts from ``policy`` and no backend retries."""
    if "::" in url:
        return dict(options)
    protocol = url.split("://", 1)[0].lower()
    opts = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("connect_timeout", policy.timeout)
        config.setdefault("read_timeout", policy.timeout)
        config.setdefault("retries", {"total_max_attempts": 1})  # our loop retries, not botocore
        config.setdefault("max_pool_connections", 32)  # botocore's 10 would queue read_ranges
        opts["config_kwargs"] = config
    elif protocol in ("http", "https"):
        client = dict(opts.get("client_kwargs") or {})
        if "timeout" not in client:
            aiohttp = _aiohttp()  # what fsspec's HTTP filesystem needs
            client["timeout"] = aiohttp.ClientTimeout(
                total=None, sock_connect=policy.timeout, sock_read=policy.timeout
            )
        opts["client_kwargs"] = client
    elif protocol in ("gs", "gcs"):
        opts.setdefault("requests_timeout", policy.timeout)
    return opts


def request_timeout(url: str, options: Mapping[str, Any], policy: RetryPolicy) -> Any:
    """The ``aiohttp.ClientTimeout`` of each ranged HTTP request wids makes itself, or ``None``.

    Every such request runs inside an attempt bounded by ``policy.timeout`` as a whole
    (:func:`~wids.storage.retry.retry_async`), so only connecting keeps a timer of its own:
    the session's per-read timer (:func:`with_defaults`) would be re-armed for every piece of
    every answer. ``None`` (the session's) where the user set the client's timeout, or for
    other protocols.
    """
    if "::" in url or url.split("://", 1)[0].lower() not in ("http", "https"):
        return None
    if "timeout" in (options.get("client_kwargs") or {}):
        return None
    return _aiohttp().ClientTimeout(total=None, sock_connect=policy.timeout, sock_read=None)


def plain_options(url: str, options: Any) -> bool:
    """Whether fsspec would send ``url``'s range requests as plain GETs with these options.

    That is: ``http://`` or ``https://`` without credentials in the URL, and no option but the
    client's timeout (no headers, auth, proxies, TLS settings). Such URLs are read by the
    plain client (:mod:`wids.storage.http1`).
    """
    if not url.lower().startswith(("http://", "https://")) or "::" in url:
        return False
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return False
    extra = set(options) - {"client_kwargs"}
    return not extra and set(options.get("client_kwargs") or {}) <= {"timeout"}


def _aiohttp() -> Any:
    """aiohttp, or an ``ImportError`` naming the ``http`` extra."""
    try:
        return importlib.import_module("aiohttp")
    except ImportError as e:
        from ..extras import missing

        raise missing("aiohttp", "http(s):// URLs", e) from None


def _mtime(info: Mapping[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "Last-Modified", "updated", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        try:
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, datetime):
                return value.timestamp()
            if isinstance(value, str):
                if value[:1].isdigit():
                    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
                return parsedate_to_datetime(value).timestamp()
        except (ValueError, TypeError, OverflowError):
            continue
    return None


def _etag(info: Mapping[str, Any]) -> str | None:
    for key in ("ETag", "etag", "Etag", "generation", "md5Hash"):
        value = info.get(key)
        if value:
            text = str(value)
            weak = text.startswith("W/")
            return ("W/" if weak else "") + text[2 if weak else 0 :].strip('"')
    return None


def _md5(info: Mapping[str, Any]) -> str | None:
    """GCS's ``md5Hash`` (base64 of the MD5 of the object's bytes) as hex, if it gives one.

    Composite objects have none. S3's ETag is left to :class:`~wids.index.Fingerprint`: it is
    an MD5 only for objects uploaded in one part without SSE-KMS/SSE-C encryption.
    """
    value = info.get("md5Hash")
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 16 else None


def file_stat(info: Mapping[str, Any], size: int) -> FileStat:
    """What a backend's ``info()`` answer says of a file of ``size`` bytes."""
    return FileStat(size=size, etag=_etag(info), mtime=_mtime(info), md5=_md5(info))


def is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP filesystem (with the session we make requests on)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "http" in protocols and hasattr(fs, "encode_url") and hasattr(fs, "set_session")


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is s3fs (with the botocore client we call ``get_object`` on)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "s3" in protocols and hasattr(fs, "get_s3") and hasattr(fs, "split_path")


def preload(url: str, options: Mapping[str, Any] | None = None) -> None:
    """Import the fsspec backend of ``url`` (and aiohttp for HTTP) now, not at the first read.

    A dataset calls this when it loads its shard list (``len(ds)``, in the DataLoader's main
    process): DataLoader workers forked afterwards inherit the imported modules instead of
    each paying for them (~200 ms for aiohttp and its TLS contexts) on their first sample.
    Nothing is connected or opened. An unknown protocol or a missing package is left for the
    first read to report. A plain ``http(s)://`` URL under ``options`` (its storage options)
    that :func:`plain_options` allows imports only fsspec's event loop (batches run on it):
    its reads and downloads go on the plain client (:mod:`wids.storage.http1`), which needs
    no aiohttp.
    """
    if "::" in url or "://" not in url:
        return
    protocol = url.split("://", 1)[0].lower()
    if protocol == "file":
        return
    if plain_options(url, {k: v for k, v in (options or {}).items() if k != "transport"}):
        importlib.import_module("fsspec.asyn")  # the event loop of batches, nothing more
        return
    try:
        import fsspec

        fsspec.get_filesystem_class(protocol)
        if protocol in ("http", "https"):
            importlib.import_module("aiohttp")
    except (ImportError, ValueError):
        pass
