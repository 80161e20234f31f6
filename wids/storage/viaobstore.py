"""obstore (a Rust object-store client) as one more transport: S3, GCS and HTTP(S) range reads.

The optional ``obstore`` extra. Which transport a file is read with is the storage option
``"transport"`` (:func:`choice`): ``"auto"`` (the default: obstore for ``s3://`` where it is
installed and the options translate, the backend where it was measured to win, :func:`_wins`;
fsspec for everything else), ``"obstore"`` (obstore for S3, GCS and HTTP(S) wherever the
options translate; fsspec with a :class:`ObstoreFallbackWarning` saying why where they do not)
or ``"fsspec"`` (:mod:`wids.storage.transport` always). The option is wids's own: fsspec never
sees it. :func:`obstore_transport` makes the choice for one file.

Translation (:func:`translate`) is exact or nothing: every storage option either has its
obstore equivalent or the file is read through fsspec. Nothing is dropped, and nothing that
obstore would take from the environment or a credentials chain of its own is left to it where
botocore or gcsfs would decide otherwise: S3 needs the key and secret (or ``anon``) and the
region or endpoint in the options, and the store obstore builds must hold only what was
given (no ``AWS_*`` variable obstore would add to them, :func:`_from_environment`); GCS only
``token="anon"`` (its emulators: ``endpoint_url``); HTTP(S) only the client's timeout and
the headers ``Authorization`` and ``Cookie`` (reqwest follows redirects, with no setting to
stop it, and drops only those two on a hop to another origin: any other header, an API key,
would follow it; :mod:`wids.storage.redirects`), on URLs without a query or user name. The
options are the ones :class:`~wids.storage.origins.Scope` gives the file's origin, so
credentials still go only where they were given.

A :class:`ObstoreTransport` makes one request per call (obstore's retries off: wids's loop is
the only one), conditional on the file's :class:`~wids.storage.answer.Pin` (``if_match`` the
etag; GCS ``version=`` the generation; else ``if_unmodified_since``); its
:class:`~wids.storage.answer.Answer` is checked by :func:`~wids.storage.answer.check_answer`.
obstore's errors are sorted into wids's (:func:`_failure`), messages redacted.

Processes: obstore runs on a tokio runtime that does not survive ``fork`` (a child that
touches it hangs). Stores are made lazily in the reading process, kept in
:mod:`wids.storage.clients` under its pid, beside the pid of the first process that used
obstore: a forked child of that one reads through fsspec (:func:`usable`); ``forkserver`` and
``spawn`` workers are fresh processes and use obstore. Nothing runs at fork time.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..errors import IndexMismatchError, PermanentRemoteError, WidsError
from ..errors import RangeNotSupportedError as _RangeNotSupported
from .answer import Answer, Pin, too_large
from .clients import get
from .redact import redact_text, redact_url
from .redirects import DROPPED_ACROSS_ORIGINS
from .stats import FileStat, comparable_etag
from .transport import LOOP, Transport

__all__ = [
    "CHOICES",
    "ObstoreFallbackWarning",
    "ObstoreTransport",
    "choice",
    "obstore_transport",
    "translate",
    "usable",
]

logger = logging.getLogger(__name__)

CHOICES = ("fsspec", "obstore", "auto")
"""The values of the ``"transport"`` storage option."""

_S3_KEYS = frozenset({"key", "secret", "token", "anon", "endpoint_url", "client_kwargs"})
_S3_CLIENT_KEYS = frozenset({"endpoint_url", "region_name"})
_GCS_KEYS = frozenset({"token", "endpoint_url", "project", "requests_timeout"})
_HTTP_KEYS = frozenset({"headers", "client_kwargs"})


def choice(options: Mapping[str, Any]) -> str:
    """The transport the ``"transport"`` storage option selects (``"auto"`` by default).

    Raises:
        ValueError: Not one of :data:`CHOICES`.
    """
    value = options.get("transport", "auto")
    if value not in CHOICES:
        raise ValueError(f"storage option 'transport' must be one of {CHOICES}, not {value!r}")
    return str(value)


def usable() -> bool:
    """Whether this process may use obstore: it is not a forked child of one that did."""
    first: int = get(("obstore-runtime",), os.getpid)
    return first == os.getpid()


class ObstoreFallbackWarning(UserWarning):
    """``transport="obstore"`` was asked for, and a file is read through fsspec (says why)."""


def obstore_transport(
    url: str, options: Mapping[str, Any], timeout: float
) -> ObstoreTransport | None:
    """The obstore transport of ``url`` if its ``"transport"`` option selects it, else ``None``.

    ``None`` (fsspec) for ``"fsspec"``; for ``"auto"`` and ``"obstore"`` when the options do
    not translate, obstore is not installed (``"auto"``) or this process is a forked child of
    one that used it (:func:`usable`). ``"obstore"`` warns (:class:`ObstoreFallbackWarning`)
    whenever it falls back.

    Raises:
        ImportError: ``"obstore"`` was asked for and it is not installed (names the extra).
        ValueError: The ``"transport"`` option is not one of :data:`CHOICES`.
    """
    wanted = choice(options)
    if wanted == "fsspec" or (wanted == "auto" and not _wins(url)):
        return None
    try:
        import obstore  # noqa: F401
    except ImportError as e:
        if wanted == "auto":
            return None
        from ..extras import missing

        raise missing("obstore", "storage_options transport='obstore'", e) from None
    rest = {k: v for k, v in options.items() if k != "transport"}
    config = translate(url, rest, timeout)
    if isinstance(config, _Config) and not usable():
        config = "this process was forked from one that used obstore (tokio cannot be forked)"
    if isinstance(config, str):
        _fell_back(url, wanted, config)
        return None
    return ObstoreTransport(url, config, timeout)


def _wins(url: str) -> bool:
    """Whether ``auto`` reads ``url`` through obstore: S3, where it wins (docs/storage.md)."""
    return url.split("://", 1)[0].lower() in ("s3", "s3a") and "::" not in url


def _fell_back(url: str, wanted: str, why: str) -> None:
    """Say why ``url`` is read through fsspec (a warning if obstore was asked for)."""
    logger.debug("%s read through fsspec, not obstore: %s", redact_url(url), why)
    if wanted == "obstore":
        warnings.warn(
            f"{redact_url(url)} is read through fsspec, not obstore: {why}",
            ObstoreFallbackWarning,
            stacklevel=3,
        )


class _Config:
    """What a file is read with through obstore: the store's kind and arguments, and its path."""

    __slots__ = ("kind", "kwargs", "path", "root")

    def __init__(self, kind: str, root: str, path: str, kwargs: dict[str, Any]) -> None:
        self.kind, self.root, self.path, self.kwargs = kind, root, path, kwargs


def translate(url: str, options: Mapping[str, Any], timeout: float) -> _Config | str:
    """The obstore store and path of ``url`` under ``options``, or why there is none.

    ``options`` are the file's (its origin's, without ``"transport"``); ``timeout`` is the
    retry policy's, for obstore's client.
    """
    if "::" in url or "://" not in url:
        return "not an s3://, gs:// or http(s):// URL"
    scheme = url.split("://", 1)[0].lower()
    client: dict[str, Any] = {"timeout": f"{timeout:g}s", "connect_timeout": f"{timeout:g}s"}
    if scheme in ("s3", "s3a"):
        return _s3(url, options, client)
    if scheme in ("gs", "gcs"):
        return _gcs(url, options, client)
    if scheme in ("http", "https"):
        return _http(url, options, client)
    return f"obstore does not read {scheme}:// here"


def _unknown(options: Mapping[str, Any], known: frozenset[str]) -> str | None:
    extra = sorted(str(k) for k in options if k not in known)
    return f"storage options {extra} have no obstore equivalent" if extra else None


def _bucket_key(url: str) -> tuple[str, str] | str:
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket or not key or "?" in rest or "#" in rest:
        return "not a bucket/key URL"
    return (bucket, key) if _plain_path(key) else _ODD_PATH


_ODD_PATH = "a key with an empty, '.' or '..' segment (obstore's paths have none)"


def _plain_path(path: str) -> bool:
    """Whether obstore addresses ``path`` as it is (no segment it would drop or refuse)."""
    return all(part not in ("", ".", "..") for part in path.split("/"))


def _s3(url: str, options: Mapping[str, Any], client: dict[str, Any]) -> _Config | str:
    why = _unknown(options, _S3_KEYS)
    if why:
        return why
    kwargs = dict(options.get("client_kwargs") or {})
    why = _unknown(kwargs, _S3_CLIENT_KEYS)
    if why:
        return why.replace("storage options", "client_kwargs")
    found = _bucket_key(url)
    if isinstance(found, str):
        return found
    bucket, key = found
    config: dict[str, Any] = {}
    if options.get("anon"):
        config["skip_signature"] = True
    elif options.get("key") and options.get("secret"):
        config["access_key_id"] = str(options["key"])
        config["secret_access_key"] = str(options["secret"])
        if options.get("token"):
            config["session_token"] = str(options["token"])
    else:
        return "no key and secret (or anon) in the storage options: botocore's chain decides"
    endpoint = kwargs.get("endpoint_url") or options.get("endpoint_url")
    if endpoint:
        config["endpoint"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            client["allow_http"] = True
    region = kwargs.get("region_name")
    if region:
        config["region"] = str(region)
    elif not endpoint:
        return "no region_name or endpoint_url in the storage options: botocore finds it"
    added = _from_environment(config)
    if added:
        return (
            f"obstore would also take {added} from the environment, which the storage options "
            "do not say (botocore decides otherwise); give them as storage options"
        )
    return _Config("s3", bucket, key, {"config": config, "client_options": client})


# AWS_* variables obstore reads, and the S3 setting of the options that overrides each
_AWS_OVERRIDDEN = {
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_TOKEN": "session_token",
    "AWS_REGION": "region",
    "AWS_DEFAULT_REGION": "region",
    "AWS_ENDPOINT": "endpoint",
    "AWS_ENDPOINT_URL": "endpoint",
    "AWS_ENDPOINT_URL_S3": "endpoint",
}
# AWS_* variables that change nothing once the options give a key and secret (or anon)
_AWS_UNUSED = frozenset(
    (
        "AWS_PROFILE AWS_DEFAULT_PROFILE AWS_CONFIG_FILE AWS_SHARED_CREDENTIALS_FILE AWS_PAGER "
        "AWS_DEFAULT_OUTPUT AWS_EXECUTION_ENV AWS_CONTAINER_CREDENTIALS_RELATIVE_URI "
        "AWS_CONTAINER_CREDENTIALS_FULL_URI AWS_CONTAINER_AUTHORIZATION_TOKEN "
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE AWS_WEB_IDENTITY_TOKEN_FILE AWS_ROLE_ARN "
        "AWS_ROLE_SESSION_NAME AWS_STS_REGIONAL_ENDPOINTS "
        "AWS_CA_BUNDLE"  # botocore's trust roots; obstore keeps its own (fails, never leaks)
    ).split()
)


def _from_environment(config: Mapping[str, Any]) -> list[str]:
    """The ``AWS_*`` variables obstore would add to ``config`` (unlike botocore, given a key)."""
    added = []
    for name in os.environ:
        if not name.startswith("AWS_") or name in _AWS_UNUSED:
            continue
        if config.get("skip_signature") and name in ("AWS_SESSION_TOKEN", "AWS_TOKEN"):
            continue  # unsigned requests carry no token
        if _AWS_OVERRIDDEN.get(name) not in config:
            added.append(name)
    return sorted(added)


def _gcs(url: str, options: Mapping[str, Any], client: dict[str, Any]) -> _Config | str:
    why = _unknown(options, _GCS_KEYS)
    if why:
        return why
    if options.get("token") != "anon":
        return "GCS credentials other than token='anon': gcsfs's chain decides"
    found = _bucket_key(url)
    if isinstance(found, str):
        return found
    bucket, key = found
    config: dict[str, Any] = {"skip_signature": True}
    endpoint = options.get("endpoint_url")
    if endpoint:
        config["base_url"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            client["allow_http"] = True
    return _Config("gcs", bucket, key, {"config": config, "client_options": client})


def _http(url: str, options: Mapping[str, Any], client: dict[str, Any]) -> _Config | str:
    why = _unknown(options, _HTTP_KEYS)
    if why:
        return why
    kwargs = dict(options.get("client_kwargs") or {})
    if set(kwargs) - {"timeout"}:
        return f"client_kwargs {sorted(set(kwargs) - {'timeout'})} have no obstore equivalent"
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or parts.username is not None or parts.password is not None:
        return "a URL with a query, fragment or user name"
    if "%2f" in parts.path.lower():  # an encoded "/" inside a segment
        return "a URL path with an encoded '/'"
    path = urllib.parse.unquote(parts.path[1:])
    if not _plain_path(path):
        return _ODD_PATH
    if url.lower().startswith("http://"):
        client["allow_http"] = True
    headers = options.get("headers")
    kept = sorted(
        str(k) for k in dict(headers or {}) if str(k).lower() not in DROPPED_ACROSS_ORIGINS
    )
    if kept:  # reqwest would follow a redirect to another origin with them (no setting)
        return f"headers {kept} would follow a redirect to another origin (obstore keeps them)"
    if headers:
        client["default_headers"] = {str(k): str(v) for k, v in dict(headers).items()}
    root = f"{parts.scheme}://{parts.netloc}"
    return _Config("http", root, path, {"client_options": client})


def _make_store(config: _Config) -> Any:
    """The obstore store of ``config`` (in this process; see :func:`store`)."""
    from obstore.store import GCSStore, HTTPStore, S3Store

    retry: Any = {"max_retries": 0}  # wids's retry loop is the only one
    kwargs = config.kwargs
    if config.kind == "s3":
        return S3Store(
            config.root,
            config=kwargs["config"],
            client_options=kwargs["client_options"],
            retry_config=retry,
        )
    if config.kind == "gcs":
        return GCSStore(
            config.root,
            config=kwargs["config"],
            client_options=kwargs["client_options"],
            retry_config=retry,
        )
    return HTTPStore.from_url(
        config.root,
        client_options=kwargs["client_options"],
        retry_config=retry,
    )


def store(config: _Config) -> Any:
    """This process's obstore store for ``config`` (made on first use, kept under the pid)."""
    usable()  # records the first process that uses obstore, before its runtime starts
    key = (os.getpid(), "obstore", config.kind, config.root, repr(sorted(config.kwargs.items())))
    return get(key, lambda: _make_store(config))


class ObstoreTransport(Transport):
    """Range reads through obstore (see the module): one request per call, pinned and checked.

    Args:
        url: The file.
        config: Its store and path (:func:`translate`).
        timeout: The retry policy's timeout of one attempt.
    """

    checked = True
    asynchronous = True
    direct = True  # one read at a time in the calling thread: no hop into an event loop
    parted = True  # a whole-file download may fetch parts concurrently (storage/parts.py)

    def __init__(self, url: str, config: _Config, timeout: float = 30.0) -> None:
        super().__init__(url, LOOP, config.path, timeout)
        self.config = config
        self.gcs = config.kind == "gcs"
        self._store: Any = None

    def _obstore(self) -> Any:
        found = self._store
        if found is None:
            found = self._store = store(self.config)
        return found

    def _options(self, start: int, end: int, pin: Pin) -> dict[str, Any]:
        options: dict[str, Any] = {"range": (start, end)}
        if self.gcs:
            if pin.etag is not None:
                options["version"] = pin.etag  # a GCS pin's version is the generation
            return options
        condition = pin.if_match()
        if condition is not None:
            options["if_match"] = condition
        elif pin.etag is None and pin.since is not None:
            options["if_unmodified_since"] = datetime.fromtimestamp(pin.since, timezone.utc)
        return options

    def _answer(self, result: Any, data: bytes) -> Answer:
        meta = result.meta
        etag = meta.get("version") if self.gcs else meta.get("e_tag")
        modified = meta.get("last_modified")
        mtime = modified.timestamp() if modified is not None else None
        first, last = result.range
        return Answer(data, meta.get("size"), etag, mtime, (first, last), False)

    def get_sync(self, start: int, end: int, pin: Pin) -> Answer:
        """One conditional range read in the calling thread."""
        import obstore

        options = self._options(start, end, pin)
        try:
            result = obstore.get(self._obstore(), self.path, options=options)  # type: ignore[arg-type]
            data = bytes(result.bytes())
        except Exception as exc:
            raise self._failure_sync(exc, pin, options) from None
        return self._answer(result, data)

    async def get(self, start: int, end: int, pin: Pin) -> Answer:
        """One conditional range read on the event loop."""
        import obstore

        options = self._options(start, end, pin)
        try:
            result = await obstore.get_async(self._obstore(), self.path, options=options)  # type: ignore[arg-type]
            data = bytes(await result.bytes_async())
        except Exception as exc:
            raise await self._failure_async(exc, pin, options) from None
        return self._answer(result, data)

    def get_whole_sync(self, limit: int | None) -> bytes:
        """The whole file in the calling thread, refused past ``limit`` from its announced size."""
        import obstore

        try:
            result = obstore.get(self._obstore(), self.path)
            size = int(result.meta["size"])
            if limit is not None and size > limit:
                raise too_large(self.url, size, limit)
            return bytes(result.bytes())
        except Exception as exc:
            raise _failure(exc, self.url, self.timeout) from None

    async def get_whole(self, limit: int | None) -> bytes:
        """The whole file, refused past ``limit`` from its announced size."""
        import obstore

        try:
            result = await obstore.get_async(self._obstore(), self.path)
            size = int(result.meta["size"])
            if limit is not None and size > limit:
                raise too_large(self.url, size, limit)
            return bytes(await result.bytes_async())
        except Exception as exc:
            raise _failure(exc, self.url, self.timeout) from None

    def stat_sync(self) -> FileStat:
        """One HEAD of the file, in the calling thread."""
        import obstore

        try:
            return self._stat_of_meta(obstore.head(self._obstore(), self.path))
        except FileNotFoundError:  # a HEAD has no body to say "no such bucket": a GET has
            try:
                obstore.get(self._obstore(), self.path, options={"range": (0, 1)})
            except Exception as exc:
                raise _failure(exc, self.url, self.timeout) from None
            raise FileNotFoundError(redact_url(self.url)) from None
        except Exception as exc:
            raise _failure(exc, self.url, self.timeout) from None

    async def stat(self) -> FileStat:
        """One HEAD of the file (see :meth:`stat_sync`)."""
        import obstore

        try:
            return self._stat_of_meta(await obstore.head_async(self._obstore(), self.path))
        except FileNotFoundError:
            try:
                await obstore.get_async(self._obstore(), self.path, options={"range": (0, 1)})
            except Exception as exc:
                raise _failure(exc, self.url, self.timeout) from None
            raise FileNotFoundError(redact_url(self.url)) from None
        except Exception as exc:
            raise _failure(exc, self.url, self.timeout) from None

    def _stat_of_meta(self, meta: Mapping[str, Any]) -> FileStat:
        modified = meta.get("last_modified")
        mtime = modified.timestamp() if modified is not None else None
        etag = meta.get("e_tag")
        return FileStat(int(meta["size"]), comparable_etag(etag) if etag else None, mtime)

    # -- failures ------------------------------------------------------------------------------

    def _failure_sync(self, exc: Exception, pin: Pin, options: Mapping[str, Any]) -> Exception:
        """The error to raise for ``exc`` (the pin's, where the file changed)."""
        meta = self._head_sync() if _needs_head(exc, options) else None
        return _pinned_failure(exc, pin, options, meta, self.url, self.timeout)

    async def _failure_async(
        self, exc: Exception, pin: Pin, options: Mapping[str, Any]
    ) -> Exception:
        meta = await self._head_async() if _needs_head(exc, options) else None
        return _pinned_failure(exc, pin, options, meta, self.url, self.timeout)

    def _head_sync(self) -> Any:
        import obstore

        try:
            return obstore.head(self._obstore(), self.path)
        except Exception:  # noqa: BLE001 - no answer: the first failure stands
            return None

    async def _head_async(self) -> Any:
        import obstore

        try:
            return await obstore.head_async(self._obstore(), self.path)
        except Exception:  # noqa: BLE001 - no answer: the first failure stands
            return None


def _needs_head(exc: Exception, options: Mapping[str, Any]) -> bool:
    """Whether the object's metadata tells what ``exc`` means (a generation gone, a 416)."""
    return (isinstance(exc, FileNotFoundError) and "version" in options) or _status(exc) == 416


def _pinned_failure(
    exc: Exception, pin: Pin, options: Mapping[str, Any], meta: Any, url: str, timeout: float
) -> Exception:
    """The error for ``exc``: the pin's where the file changed (``meta``: its HEAD, if asked)."""
    changed = _changed(exc, pin, options)
    if changed is not None:
        return changed
    if meta is not None and isinstance(exc, FileNotFoundError):  # the pinned generation is gone
        return pin.differs(f"its generation is {meta.get('version')} where it was {pin.etag}")
    if meta is not None:  # 416: did the file shrink? its size decides
        pin.learn(int(meta["size"]), None, None)
    return _failure(exc, url, timeout)


def _changed(exc: Exception, pin: Pin, options: Mapping[str, Any]) -> IndexMismatchError | None:
    """The pin's error if ``exc`` says a conditional request was refused (a 412)."""
    from obstore.exceptions import PreconditionError

    if isinstance(exc, PreconditionError) or _status(exc) == 412:
        if "if_unmodified_since" in options:
            return pin.refused(f"If-Unmodified-Since {options['if_unmodified_since']:%c}")
        return pin.refused(f"If-Match {options.get('if_match')}")
    return None


# obstore 0.12 raises a type for these statuses (object_store's error kinds); the others
# (416, 429, 5xx, ...) and failures without an answer are all its GenericError.
_TYPED_STATUS = (
    ("PreconditionError", 412),
    ("PermissionDeniedError", 403),
    ("UnauthenticatedError", 401),
    ("NotModifiedError", 304),
)
# Last resort, for a GenericError only: the status and the kind of failure exist nowhere but
# in its message. Matched on obstore's own wording, never on free text (the URL and the
# server's body are in the message too); what does not match is a transient
# ObstoreConnectionError, which the retry loop bounds (so a changed wording costs retries and
# a plainer message, never a wrong classification as "not found" or "permanent").
_STATUS = re.compile(r"Server returned non-2xx status code: (\d{3})\b")
_TIMED_OUT = re.compile(r"^\s*kind: Timeout,$", re.MULTILINE)
_NO_SUCH_BUCKET = re.compile(r"<Code>NoSuchBucket</Code>")


def _status(exc: BaseException) -> int | None:
    """The HTTP status of obstore's ``exc``: from its type, else (GenericError) its message."""
    from obstore import exceptions

    for name, status in _TYPED_STATUS:
        if isinstance(exc, getattr(exceptions, name)):
            return status
    if not isinstance(exc, exceptions.GenericError):
        return None
    found = _STATUS.search(str(exc).split("\n", 1)[0])
    return int(found.group(1)) if found else None


class ObstoreStatusError(OSError):
    """An HTTP error answer obstore reported; ``status`` is what the retry loop classifies."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ObstoreConnectionError(ConnectionError):
    """A failure obstore reported without an answer (connect, timeout, a cut body): transient."""


def _failure(exc: Exception, url: str, timeout: float) -> Exception:
    """The wids error for obstore's ``exc`` (sorted as :mod:`wids.storage.retry` expects).

    By obstore's exception types (:mod:`obstore.exceptions`; its NotFoundError is the builtin
    :class:`FileNotFoundError`); a GenericError's status or timeout is read from its message
    only as the last resort :data:`_STATUS` describes.
    """
    from obstore import exceptions

    if isinstance(exc, WidsError):
        return exc
    text = redact_text(str(exc).split("\n", 1)[0])
    shard = redact_url(url)
    if isinstance(exc, exceptions.NotSupportedError):
        if "Range" in text:
            return _RangeNotSupported(f"the server ignores Range ({text})", shard=shard)
        return PermanentRemoteError(f"obstore cannot read it ({text})", shard=shard)
    if isinstance(exc, FileNotFoundError):
        if _NO_SUCH_BUCKET.search(str(exc)):  # S3's 404 body: a configuration problem
            return PermanentRemoteError(f"no such bucket ({text})", shard=shard)
        return FileNotFoundError(shard)
    status = _status(exc)
    if status is not None:
        return ObstoreStatusError(status, text)
    if isinstance(exc, exceptions.GenericError):
        if _TIMED_OUT.search(str(exc)):
            return TimeoutError(f"no answer within {timeout:g}s ({text})")
        return ObstoreConnectionError(text)
    if isinstance(exc, exceptions.JoinError):
        return ObstoreConnectionError(text)
    if isinstance(exc, exceptions.BaseError):  # a path or configuration obstore refuses
        return PermanentRemoteError(f"obstore refused the request ({text})", shard=shard)
    return exc
