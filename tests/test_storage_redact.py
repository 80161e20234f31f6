"""wids.storage.redact: credentials never shown, control characters escaped."""

from __future__ import annotations

import logging
import sys

import pytest

from wids.storage import RedactingFilter, Store, escape_controls, redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://u:pw@host/a.tar", "https://host/a.tar"),
        ("https://host/a.tar?X-Amz-Signature=abc&X-Amz-Credential=k&v=1", "https://host/a.tar?v=1"),
        (
            "https://host/a.tar?token=t&sig=s&access_token=a&X-Goog-Signature=g",
            "https://host/a.tar",
        ),
        ("https://host/a.tar?part=3#frag", "https://host/a.tar?part=3"),
        ("s3://bucket/key.tar", "s3://bucket/key.tar"),
        ("simplecache::https://u:p@h/x?sig=1", "simplecache::https://h/x"),
        ("/data/shard-000.tar", "/data/shard-000.tar"),
        ("relative/shard.tar", "relative/shard.tar"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_text_masks_urls_headers_tokens_and_option_secrets() -> None:
    secrets = Store({"key": "AKIAEXAMPLE", "secret": "s3cr3tvalue", "anon": False}).secrets()
    text = (
        "GET https://u:pw@h/x?X-Amz-Signature=abc failed; "
        "{'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/x, Signature=ff'} "
        "Bearer abcdefgh12345 token=zzz s3cr3tvalue"
    )
    out = redact_text(text, secrets)
    for secret in ("pw@", "X-Amz-Signature", "AWS4-HMAC", "abcdefgh12345", "zzz", "s3cr3tvalue"):
        assert secret not in out, secret
    assert "https://h/x" in out


def test_redacting_filter_redacts_message_args_and_traceback() -> None:
    record = logging.LogRecord(
        "fsspec", logging.DEBUG, __file__, 1, "fetch %s", ("https://u:pw@h/x?sig=1",), None
    )
    try:
        raise RuntimeError("token=abc123")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "fetch https://h/x"
    assert record.exc_text is not None and "abc123" not in record.exc_text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name ü 名", "plain name ü 名"),
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("x\u202ey", "x\\u202ey"),
        ("line\nbreak", "line\\x0abreak"),
    ],
)
def test_escape_controls(text: str, shown: str) -> None:
    assert escape_controls(text) == shown
