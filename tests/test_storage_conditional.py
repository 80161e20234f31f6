"""wids.storage.conditional: answers must carry the range asked for and the known version."""

from __future__ import annotations

import pytest

from wids import RetryPolicy
from wids.errors import (
    CorruptReadError,
    IndexMismatchError,
)
from wids.storage import Source
from wids.storage.conditional import check_answer

DATA = bytes((i * 7 + i // 251) % 256 for i in range(300_000))
FAST = RetryPolicy(attempts=4, max_time=10.0, backoff=0.01, max_backoff=0.05, timeout=5.0)


def test_answers_must_carry_the_range_asked_for_and_the_known_version() -> None:
    """Content-Range and etag of an answer (HTTP and S3 expose them) are checked."""
    src = Source("http://127.0.0.1:9/x.tar", size=1000)
    check_answer(src, 10, 20, "bytes 10-19/1000", None)
    with pytest.raises(CorruptReadError, match="Content-Range is 'bytes 0-9/1000'"):
        check_answer(src, 10, 20, "bytes 0-9/1000", None)
    with pytest.raises(CorruptReadError):
        check_answer(src, 10, 20, "garbage", None)
    with pytest.raises(IndexMismatchError, match="its size is 1001, the index says 1000"):
        check_answer(src, 10, 20, "bytes 10-19/1001", None)
    check_answer(src, 10, 20, None, '"abc"')  # the first answer's etag is kept ...
    assert src.etag == '"abc"' and src.pins_version
    check_answer(src, 10, 20, None, 'W/"abc"')
    with pytest.raises(IndexMismatchError, match="changed while it was read"):
        check_answer(src, 10, 20, None, '"abd"')  # ... and a later one must match it
