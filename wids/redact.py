"""Credential redaction: URLs and error texts that are safe to log and to show.

:func:`redact_url` removes ``user:password@`` and secret-looking query parameters from a URL;
:func:`_scrub` does the same for every URL inside a text and masks the secret values of a
storage-options mapping (collected by :func:`_secret_values`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["redact_url"]

_SECRET_PARAM = re.compile(r"^(x-amz-|x-goog-)|sig|token|key|secret|passw|credential|auth|session")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>)]+")
_SECRET_OPTION = re.compile(r"key|secret|token|passw|credential|session", re.IGNORECASE)


def redact_url(url: str) -> str:
    """Return ``url`` without credentials: no ``user:password@``, no secret query parameters.

    Query parameters that look like signatures or tokens (``X-Amz-*``, ``X-Goog-*``, ``sig``,
    ``token``, ``key`` ...) are removed; others are kept. Chained URLs (``a::b``) are redacted
    part by part; plain paths are returned unchanged.

    Example:
        >>> redact_url("https://u:pw@host/a.tar?X-Amz-Signature=abc&v=1")
        'https://host/a.tar?v=1'
    """
    if "::" in url:
        return "::".join(redact_url(part) for part in url.split("::"))
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://<unparsable>"
    netloc = parts.netloc.rpartition("@")[2]
    query = parts.query
    if query:
        kept = [
            (k, v)
            for k, v in parse_qsl(query, keep_blank_values=True)
            if not _SECRET_PARAM.search(k.lower())
        ]
        query = urlencode(kept)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _secret_values(options: Any) -> list[str]:
    """Collect string values of ``options`` stored under secret-looking keys (recursively)."""
    found: list[str] = []
    if isinstance(options, Mapping):
        for k, v in options.items():
            if isinstance(v, str) and _SECRET_OPTION.search(str(k)) and len(v) >= 4:
                found.append(v)
            elif isinstance(v, Mapping):
                found.extend(_secret_values(v))
    return found


def _scrub(text: str, secrets: Sequence[str]) -> str:
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for s in secrets:
        text = text.replace(s, "***")
    return text[:500]
