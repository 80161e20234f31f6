"""What is safe to show a human or a log: credentials removed, control characters escaped.

This is the one module that knows what a secret looks like.

- :func:`strip_credentials`: a URL without what is known to be a credential (``user:password@``,
  the signature parameters of S3, GCS, Azure and CloudFront signed URLs): a file's *identity*,
  which keeps every other query parameter (``?key=a`` and ``?key=b`` are two files).
- :func:`redact_url` removes ``user:password@`` and secret-looking query parameters from a URL,
  for display (broader than :func:`strip_credentials`: it also drops ``?token=``, ``?key=``).
  URLs are parsed, never cut at punctuation: a password may hold ``)``, ``'``, ``@``.
- :func:`redact_text` does the same for every URL inside a text, masks signed-request material
  (``Authorization`` headers, ``Signature=``/``Credential=``, session tokens, bearer tokens)
  and the secret values of a storage-options mapping (collected by :func:`_secret_values`).
- :class:`RedactingFilter` applies :func:`redact_text` to log records, including those of
  fsspec, s3fs, gcsfs, aiohttp, botocore and urllib3 when ``wids --debug`` enables them.
- :func:`escape_controls` makes text from a shard (member names, keys, labels) safe to print
  on a terminal: ANSI/OSC escape sequences and other control characters are shown escaped.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote_plus, urlsplit

__all__ = [
    "RedactingFilter",
    "escape_controls",
    "file_identity",
    "redact_text",
    "redact_url",
    "strip_credentials",
]

MASK = "***"
_PLAIN_USER = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=%-]+")  # a user name kept as written
# Schemes whose URL names the server, so a user name selects what a path means (ftp: the home)
_SERVER_SCHEMES = frozenset(
    {"http", "https", "ftp", "ftps", "sftp", "ssh", "smb", "webdav", "dav", "davs", "webhdfs"}
)

_SECRET_PARAM = re.compile(r"^(x-amz-|x-goog-)|sig|token|key|secret|passw|credential|auth|session")
# A URL in running text: its authority runs to the first "/", "?", "#" or space (a password may
# hold ")", "'" or "@"); the rest stops at quotes and brackets, and trailing punctuation (the ":"
# of "url: message") is not part of it.
_URL_IN_TEXT = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]*(?:[/?#][^\s'\"<>)]*[^\s'\"<>).,:;])?"
)
# "::" that starts the next link of a chained URL (not the "::" of an IPv6 address)
_CHAIN = re.compile(r"::(?=[A-Za-z][A-Za-z0-9+.-]*(?:://|::))")
# Query parameters that are credentials of a known signing scheme: every parameter in AWS's and
# Google's reserved namespaces (X-Amz-*, X-Goog-*: signature, credential, date, expiry, token),
# and, where the scheme's own parameters show it is one, the parameters of an Azure SAS
# (sv + sig), S3/GCS V2 signatures (AWSAccessKeyId/GoogleAccessId + Signature) and CloudFront
# signed URLs (Key-Pair-Id + Signature). Nothing is matched by a part of a name.
_SIGNED_PREFIXES = ("x-amz-", "x-goog-")
_SIGNED_SCHEMES = (
    (
        {"sv", "sig"},
        {"sv", "ss", "srt", "sp", "se", "st", "spr", "sig", "si", "sr", "sdd", "ses", "skoid",
         "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid", "sduoid"},
    ),
    ({"awsaccesskeyid", "signature"}, {"awsaccesskeyid", "signature", "expires"}),
    ({"googleaccessid", "signature"}, {"googleaccessid", "signature", "expires"}),
    ({"key-pair-id", "signature"}, {"key-pair-id", "signature", "expires", "policy"}),
)  # fmt: skip
_SECRET_OPTION = re.compile(r"key|secret|token|passw|credential|session|auth", re.IGNORECASE)
# Signed-request material as libraries log it: headers in dict reprs or "Name: value" lines
# ('Authorization': b'AWS4-HMAC-SHA256 Credential=..., Signature=...'), and its parts.
_SECRET_HEADER = re.compile(
    r"""(?P<name>['"]?(?:authorization|proxy-authorization|cookie|set-cookie|x-amz-security-token"""
    r"""|x-goog-[a-z-]*(?:token|signature|credential)[a-z-]*|x-api-key)['"]?\s*[:=]\s*)"""
    r"""(?P<value>b?'[^']*'|b?"[^"]*"|[^\r\n,}]+)""",
    re.IGNORECASE,
)
# ``name=value`` pairs whose name ends in a secret's name, after any prefix of word characters
# (``aws_secret_access_key=``, ``X-Amz-Signature=``, ``api_key=``); not after a letter or digit.
_SECRET_PART = re.compile(
    r"(?P<name>(?<![A-Za-z0-9])[\w-]*?(?:signature|credential|security-token|security_token|sig"
    r"|token|password|passwd|secret|secret_access_key|secret_key|api_key|api-key|apikey"
    r"|access_key)\s*=\s*)"
    r"(?P<value>[^\s,&'\"]+)",
    re.IGNORECASE,
)
# The start of a URL's ``user:`` (its password follows), to find userinfo in running text
_USER_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"<>()\[\]]*:")
_BEARER = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}")


def _split(url: str) -> tuple[str, str, str] | None:
    """``(scheme, userinfo, rest)`` of a URL, parsed as its server would; ``None`` if none.

    The authority ends at the first ``/``, ``?`` or ``#``; its last ``@`` ends the userinfo
    (so ``@``, ``)`` and ``'`` in a password stay in it). A password holding an illegal ``/``,
    ``?`` or ``#`` (``user:pa/ss@host``) is recognised too when what follows the first ``:``
    is not a port: then the userinfo runs to the first ``@`` after it.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i >= 0:
            end = min(end, i)
    at = rest.rfind("@", 0, end)
    if at < 0 and not rest.startswith("["):
        colon = rest.find(":", 0, end)
        later = rest.find("@", end)
        port = rest[colon + 1 : end]
        if colon >= 0 and later >= 0 and port and not port.isdigit():
            at = later
    if at < 0:
        return scheme, "", rest
    return scheme, rest[:at], rest[at + 1 :]


def _query(query: str, drop: Callable[[str, set[str]], bool]) -> str:
    """``query`` without the parameters ``drop`` names; the others kept verbatim, in order."""
    pieces = query.split("&")
    names = [unquote_plus(p.partition("=")[0]).lower() for p in pieces]
    known = set(names)
    return "&".join(p for p, n in zip(pieces, names, strict=True) if not drop(n, known))


def _signed(name: str, names: set[str]) -> bool:
    """Whether query parameter ``name`` is a credential of a signing scheme ``names`` show."""
    if name.startswith(_SIGNED_PREFIXES):
        return True
    return any(need <= names and name in params for need, params in _SIGNED_SCHEMES)


def _secret_looking(name: str, names: set[str]) -> bool:
    return _signed(name, names) or _SECRET_PARAM.search(name) is not None


def _clean(
    url: str, drop: Callable[[str, set[str]], bool], *, shown: bool, keep_user: bool = False
) -> str:
    """``url`` without userinfo and the query parameters ``drop`` names.

    For display (``shown``), also without its fragment, and a URL that does not parse is
    shown as ``scheme://<unparsable>``; as an identity, the rest is kept verbatim (two
    URLs that differ in anything but credentials stay different).
    """
    if _CHAIN.search(url):
        parts = _CHAIN.split(url)
        return "::".join(_clean(p, drop, shown=shown, keep_user=keep_user) for p in parts)
    split = _split(url)
    if split is None:
        return url
    scheme, userinfo, rest = split
    scheme = scheme.lower()
    user = userinfo.partition(":")[0] if keep_user and scheme in _SERVER_SCHEMES else ""
    if user and _PLAIN_USER.fullmatch(user):
        rest = f"{user}@{rest}"
    if shown:
        try:
            urlsplit(f"{scheme}://{rest}")
        except ValueError:
            return scheme + "://<unparsable>"
    rest, hash_, fragment = rest.partition("#")
    base, question, query = rest.partition("?")
    query = _query(query, drop) if question else ""
    tail = "" if shown or not hash_ else f"#{fragment}"
    return f"{scheme}://{base}" + (f"?{query}" if query else "") + tail


def strip_credentials(url: str) -> str:
    """``url`` without what is known to be a credential: a file's identity.

    Removed: ``user:password@`` and the query parameters of known signing
    schemes (``X-Amz-*``, ``X-Goog-*``; an Azure SAS's ``sv``, ``se``, ``sp``, ``sig`` ...
    when ``sv`` and ``sig`` are present; ``Signature``, ``Expires`` and the key id of S3/GCS V2
    and CloudFront signatures). Every other parameter is kept, whatever its name, so two URLs
    that differ in one (``?key=a``, ``?key=b``) stay two files, and a re-signed URL is the
    same file.

    Example:
        >>> strip_credentials("https://u:p)w@host/get?key=a&X-Amz-Signature=s")
        'https://host/get?key=a'
    """
    return _clean(url, _signed, shown=False)


def file_identity(url: str) -> str:
    """The string a file's identity (cache entry, sidecar and digest names) is a hash of.

    :func:`strip_credentials`, plus, for a URL whose server is part of it (``http``, ``ftp``,
    ``sftp`` ...) and that names a user, a hash of the user name: ``ftp://alice@h/x`` and
    ``ftp://bob@h/x`` are two files (each path is relative to that user's home), while the
    password stays out. Without a user name it is :func:`strip_credentials` exactly, so those
    URLs keep their names.
    """
    clean = strip_credentials(url)
    users = []
    for part in _CHAIN.split(url):
        split = _split(part)
        if split is None or not split[1] or split[0].lower() not in _SERVER_SCHEMES:
            continue
        user = split[1].partition(":")[0]
        if user:
            users.append(hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:16])
    # NUL never occurs in a URL: no other URL's identity can equal this one
    return clean + "".join(f"\0user={u}" for u in users)


def redact_url(url: str, *, keep_user: bool = False) -> str:
    """Return ``url`` without credentials: no ``user:password@``, no secret query parameters.

    With ``keep_user``, the user name of a URL naming its server stays (``user@host``; the
    password goes): what an offline copy of an index records, so each shard keeps its
    :func:`file_identity`.

    Query parameters that look like signatures or tokens (``X-Amz-*``, ``X-Goog-*``, ``sig``,
    ``token``, ``key`` ...) and those of known signing schemes (:func:`strip_credentials`) are
    removed; others are kept. Chained URLs (``a::b``) are redacted part by part; plain paths
    are returned unchanged.

    Example:
        >>> redact_url("https://u:pw@host/a.tar?X-Amz-Signature=abc&v=1")
        'https://host/a.tar?v=1'
    """
    return _clean(url, _secret_looking, shown=True, keep_user=keep_user)


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
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), _without_userinfo(text))
    text = _SECRET_HEADER.sub(lambda m: m.group("name") + MASK, text)
    text = _SECRET_PART.sub(lambda m: m.group("name") + MASK, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    for s in secrets:
        text = text.replace(s, MASK)
    return text


def _without_userinfo(text: str) -> str:
    """``text`` without the ``user:password@`` of its URLs, before URLs are cut out of it.

    A password may hold what ends a URL in running text (``/``, ``)``, quotes, a space), so
    the userinfo is found first: from ``scheme://user:`` to the last ``@`` before whitespace
    (or, for a password with a space, the first ``@`` on the line), unless what follows the
    ``:`` is a port.
    """
    if "@" not in text:
        return text
    out, pos = [], 0
    for m in _USER_START.finditer(text):
        if m.start() < pos:
            continue
        after = m.end()
        token = re.match(r"\S*", text[after:]).group(0)  # type: ignore[union-attr]
        at = token.rfind("@")
        if at < 0:
            line = text[after:].split("\n", 1)[0]
            at = line.find("@")
            if at < 0 or "://" in line[:at]:
                continue
        port = re.match(r"[^/?#\s]*", text[after : after + at]).group(0)  # type: ignore[union-attr]
        if port.isdigit():  # host:port, then an "@" in the path
            continue
        out.append(text[pos : m.start()] + text[m.start() : m.end()].partition("://")[0] + "://")
        pos = after + at + 1
    return "".join(out) + text[pos:]


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
