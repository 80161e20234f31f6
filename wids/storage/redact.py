"""What is safe to show a human or a log: credentials removed, control characters escaped.

This is the one module that knows what a secret looks like.

- :func:`redact_url` removes ``user:password@`` and secret-looking query parameters from a URL.
- :func:`redact_text` does the same for every URL inside a text, masks signed-request material
  (``Authorization`` headers, ``Signature=``/``Credential=``, session tokens, bearer tokens)
  and the secret values of a storage-options mapping (collected by :func:`_secret_values`).
- :class:`RedactingFilter` applies :func:`redact_text` to log records, including those of
  fsspec, s3fs, gcsfs, aiohttp, botocore and urllib3 when ``wids --debug`` enables them.
- :func:`escape_controls` makes text from a shard (member names, keys, labels) safe to print
  on a terminal: ANSI/OSC escape sequences and other control characters are shown escaped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["RedactingFilter", "escape_controls", "redact_text", "redact_url"]

MASK = "***"

_SECRET_PARAM = re.compile(r"^(x-amz-|x-goog-)|sig|token|key|secret|passw|credential|auth|session")
# A URL in running text; trailing punctuation (the ":" of "url: message") is not part of it.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>)]*[^\s'\"<>).,:;]")
_SECRET_OPTION = re.compile(r"key|secret|token|passw|credential|session", re.IGNORECASE)
# Signed-request material as libraries log it: headers in dict reprs or "Name: value" lines
# ('Authorization': b'AWS4-HMAC-SHA256 Credential=..., Signature=...'), and its parts.
_SECRET_HEADER = re.compile(
    r"""(?P<name>['"]?(?:authorization|proxy-authorization|cookie|set-cookie|x-amz-security-token"""
    r"""|x-goog-[a-z-]*(?:token|signature|credential)[a-z-]*|x-api-key)['"]?\s*[:=]\s*)"""
    r"""(?P<value>b?'[^']*'|b?"[^"]*"|[^\r\n,}]+)""",
    re.IGNORECASE,
)
_SECRET_PART = re.compile(
    r"(?P<name>\b(?:signature|credential|x-amz-signature|x-amz-credential|x-amz-security-token"
    r"|x-goog-signature|x-goog-credential|sig|token|access_token|password|secret)=)"
    r"(?P<value>[^\s,&'\"]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}")


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


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with credentials removed: URLs redacted, signatures and tokens masked.

    Args:
        text: Any text: an error message, a log line, a traceback.
        secrets: Literal values to mask as well (e.g. from :func:`_secret_values` of the
            storage options in use).

    Example:
        >>> redact_text("GET https://u:pw@h/x?sig=1 failed; Authorization: Bearer abcdefgh12")
        'GET https://h/x failed; Authorization: ***'
    """
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    text = _SECRET_HEADER.sub(lambda m: m.group("name") + MASK, text)
    text = _SECRET_PART.sub(lambda m: m.group("name") + MASK, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    for s in secrets:
        text = text.replace(s, MASK)
    return text


def _scrub(text: str, secrets: Iterable[str]) -> str:
    return redact_text(text, secrets)[:500]


def escape_controls(text: str) -> str:
    r"""Return ``text`` with every non-printable character escaped, for a terminal.

    ANSI CSI and OSC sequences, other C0/C1 controls, bidirectional overrides and line or
    paragraph separators from a shard's member names, keys or values would otherwise move the
    cursor, recolour, retitle or rewrite what the user sees. Printable text (any script) and
    the plain space are kept.

    Example:
        >>> print(escape_controls("a\x1b[31mred\u202e"))
        a\x1b[31mred\u202e
    """
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return "".join(out)


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record with :func:`redact_text` applied to it.

    Install it on a handler (not a logger: a logger's filters skip records of its child
    loggers), so it sees what libraries log too. The message, its arguments, the exception
    text and the stack are redacted; the record is always passed on.

    Args:
        secrets: Literal values to mask as well.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record`` in place; always ``True``."""
        try:
            message = record.getMessage()
        except Exception:  # a library's bad format string: show it unformatted
            message = f"{record.msg} {record.args}"
        record.msg, record.args = redact_text(message, self.secrets), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info, self.secrets)
        return True
