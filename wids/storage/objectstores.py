"""Transports of object stores: S3 (s3fs's client) and GCS (its JSON API), and the choice.

See :mod:`wids.storage.transport` for the interface. Both make one request per call (no
s3fs or gcsfs retry loop inside the caller's attempts) and use only public attributes of s3fs
(``set_session``, ``get_s3``, ``split_path``, ``s3_additional_kwargs``, ``req_kw``) and gcsfs
(``split_path``, ``url``, ``base``, ``credentials``).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..errors import PermanentRemoteError
from .answer import Answer, Pin, too_large
from .backends import file_stat, is_http, is_s3, request_timeout, with_defaults
from .redact import redact_url
from .retry import RetryPolicy
from .stats import FileStat
from .transport import (
    HttpTransport,
    Transport,
    _date,
    _span,
    read_body,
    read_bounded,
)

__all__ = ["GcsTransport", "S3Transport", "fsspec_transport", "transport_for"]


def _precondition_failed(exc: BaseException | None) -> bool:
    """Whether a botocore error (or its cause) is S3 ``PreconditionFailed`` / HTTP 412."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, Mapping):
            if response.get("Error", {}).get("Code") == "PreconditionFailed":
                return True
            if response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                return True
        exc = exc.__cause__
    return False


def _invalid_range(exc: BaseException | None) -> bool:
    """Whether a botocore error (or its cause) is S3 ``InvalidRange`` / HTTP 416."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, Mapping):
            if response.get("Error", {}).get("Code") == "InvalidRange":
                return True
            if response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                return True
        exc = exc.__cause__
    return False


class S3Transport(Transport):
    """``get_object`` / ``head_object`` on s3fs's client, once each (no s3fs retry loop)."""

    checked = True
    asynchronous = True

    def __init__(self, url: str, fs: Any, path: str, timeout: float = 30.0) -> None:
        super().__init__(url, fs, path, timeout)
        bucket, key, version = fs.split_path(path)
        self.kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version:
            self.kwargs["VersionId"] = version
        self.extra = {**fs.s3_additional_kwargs, **fs.req_kw}

    async def prepare(self) -> None:
        """Make s3fs's client."""
        await self._client()

    async def _client(self) -> Any:
        await self.fs.set_session()
        return await self.fs.get_s3(self.kwargs["Bucket"])

    async def get(self, start: int, end: int, pin: Pin) -> Answer:
        """One conditional ``get_object`` of the range."""
        client = await self._client()
        kwargs = {**self.extra, **self.kwargs, "Range": f"bytes={start}-{end - 1}"}
        condition = pin.if_match()
        if condition is not None:
            kwargs["IfMatch"] = condition
        try:
            resp = await client.get_object(**kwargs)
        except Exception as exc:
            if _precondition_failed(exc):
                raise pin.refused(f"PreconditionFailed for IfMatch {condition}") from None
            if _invalid_range(exc):  # the file shrank? its size decides
                pin.learn((await self.stat()).size, None, None)
            raise
        try:
            data: bytes = await resp["Body"].read()
        finally:
            resp["Body"].close()
        etag = resp.get("ETag") or None
        mtime = _date(resp.get("LastModified")) if etag is None or pin.wants_date else None
        span, total = _span(resp.get("ContentRange"))
        return Answer(data, total, etag, mtime, span, False, resp.get("ContentRange") or "")

    async def get_whole(self, limit: int | None) -> bytes:
        """One ``get_object`` of the whole file, bounded by its announced length."""
        client = await self._client()
        resp = await client.get_object(**self.extra, **self.kwargs)
        try:
            size = int(resp.get("ContentLength") or 0)
            if limit is not None and size > limit:
                raise too_large(self.url, size, limit)
            data: bytes = await resp["Body"].read()
        finally:
            resp["Body"].close()
        return data

    async def stat(self) -> FileStat:
        """One ``head_object``."""
        client = await self._client()
        try:
            head = await client.head_object(**self.extra, **self.kwargs)
        except Exception as exc:
            response = getattr(exc, "response", None)
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if response else 0
            if status == 404:  # a HEAD says no more: is it the bucket that is missing?
                try:
                    await client.head_bucket(Bucket=self.kwargs["Bucket"])
                except Exception:
                    raise PermanentRemoteError(
                        f"no such bucket {self.kwargs['Bucket']!r}", shard=redact_url(self.url)
                    ) from None
            raise
        return file_stat(head, int(head["ContentLength"]))


class GcsTransport(Transport):
    """GCS's JSON API on this process's session, pinned to the object's generation.

    gcsfs's requests retry six times inside each of ours (with the global ``random`` state);
    these are one request each. gcsfs gives the URL and the credentials.
    """

    checked = True
    asynchronous = True

    def __init__(self, url: str, fs: Any, path: str, timeout: float = 30.0) -> None:
        super().__init__(url, fs, path, timeout)
        bucket, key, generation = fs.split_path(path)
        self.generation = generation or None
        quoted = urllib.parse.quote(key, safe="")
        self.meta_url = f"{fs.base}b/{bucket}/o/{quoted}"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity"}
        self.fs.credentials.apply(headers)
        return headers

    def _session(self) -> Any:
        import asyncio

        from .clients import session

        return session(asyncio.get_running_loop(), self.timeout)

    async def get(self, start: int, end: int, pin: Pin) -> Answer:
        """One ranged media GET of the pinned generation (the first answer's, if none yet)."""
        generation = pin.etag or self.generation
        headers = {**self._headers(), "Range": f"bytes={start}-{end - 1}"}
        url = self.fs.url(self.path, generation=generation)
        async with self._session().get(url, headers=headers) as resp:
            if resp.status == 404 and generation is not None:  # that generation is gone?
                now = await self.generation_of()  # FileNotFoundError if the object is
                raise pin.differs(f"its generation {generation} is gone (now {now})")
            if resp.status == 404:
                raise FileNotFoundError(redact_url(pin.url))
            got = resp.headers.get("x-goog-generation") or None
            if resp.status == 416:
                pin.learn(_span(resp.headers.get("content-range"))[1], got, None)
            resp.raise_for_status()
            data = await read_bounded(resp, pin.url, start, end)
            if resp.status == 200:
                return Answer(data, len(data), got, None, None, True)
            span, total = _span(resp.headers.get("content-range"))
            raw = resp.headers.get("content-range") or ""
            return Answer(data, total, got, None, span, False, raw)

    async def get_whole(self, limit: int | None) -> bytes:
        """One media GET of the whole object, bounded."""
        url = self.fs.url(self.path, generation=self.generation)
        async with self._session().get(url, headers=self._headers()) as resp:
            if resp.status == 404:
                raise FileNotFoundError(redact_url(self.url))
            resp.raise_for_status()
            return await read_body(resp, self.url, limit)

    async def stat(self) -> FileStat:
        """The object's metadata (``etag`` as gcsfs reports it, for fingerprints)."""
        async with self._session().get(self.meta_url, headers=self._headers()) as resp:
            if resp.status == 404:
                raise FileNotFoundError(redact_url(self.url))
            resp.raise_for_status()
            meta = json.loads(await resp.read())
        return file_stat(meta, int(meta["size"]))

    async def generation_of(self) -> str | None:
        """The object's current generation."""
        async with self._session().get(self.meta_url, headers=self._headers()) as resp:
            if resp.status == 404:
                raise FileNotFoundError(redact_url(self.url))
            resp.raise_for_status()
            found = json.loads(await resp.read()).get("generation")
        return str(found) if found is not None else None


def _is_gcs(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "gs" in protocols and hasattr(fs, "credentials") and hasattr(fs, "url")


def transport_for(url: str, fs: Any, path: str, timeout: float, client_timeout: Any) -> Transport:
    """The transport of ``url`` on ``fs`` (see the module)."""
    if "::" in url or not fs.async_impl:
        return Transport(url, fs, path, timeout)
    if is_http(fs):
        return HttpTransport(url, fs, path, timeout, client_timeout)
    if is_s3(fs):
        return S3Transport(url, fs, path, timeout)
    if _is_gcs(fs):
        return GcsTransport(url, fs, path, timeout)
    return Transport(url, fs, path, timeout)


def fsspec_transport(url: str, options: Mapping[str, Any], policy: RetryPolicy) -> Transport:
    """The transport of ``url`` on this process's fsspec filesystem under ``options``.

    The filesystem is :func:`~wids.storage.clients.filesystem`'s (one per process, protocol
    and options), with the timeouts of ``policy`` (:func:`~wids.storage.backends.with_defaults`).

    Raises:
        ImportError: The backend of ``url``'s protocol is not installed (names its extra).
    """
    from .clients import filesystem

    fs, path = filesystem(url, with_defaults(url, options, policy))
    client_timeout = request_timeout(url, options, policy)
    return transport_for(url, fs, path, policy.timeout, client_timeout)
