"""wids.storage.answer: answers must carry the range asked for and the pinned version."""

from __future__ import annotations

from pathlib import Path

import pytest
from recordingserver import RecordingServer
from tarfixtures import make_samples, write_shard

from wids import RetryPolicy, ShardListDataset, build_index
from wids.errors import CorruptReadError, IndexMismatchError, PermanentRemoteError, ShortReadError
from wids.storage import Answer, Pin, check_answer

URL = "http://127.0.0.1:9/x.tar"


def test_answers_must_carry_the_range_asked_for_and_the_known_version() -> None:
    """Content-Range, size and etag of an answer (HTTP and S3 expose them) are checked."""
    pin = Pin(URL, size=1000)
    data = bytes(10)
    assert check_answer(pin, Answer(data, 1000, None, None, (10, 20)), 10, 20) == data
    with pytest.raises(CorruptReadError, match="Content-Range is 'bytes 0-9/1000'"):
        check_answer(
            pin, Answer(data, 1000, None, None, (0, 10), raw_range="bytes 0-9/1000"), 10, 20
        )
    with pytest.raises(CorruptReadError):
        check_answer(pin, Answer(data, None, None, None, (-1, -1), raw_range="garbage"), 10, 20)
    with pytest.raises(IndexMismatchError, match="its size is 1001 bytes where it was 1000"):
        check_answer(pin, Answer(data, 1001, None, None, (10, 20)), 10, 20)
    check_answer(pin, Answer(data, None, '"abc"'), 10, 20)  # the first answer's etag is kept ...
    assert pin.etag == '"abc"' and pin.pinned and pin.if_match() == '"abc"'
    check_answer(pin, Answer(data, None, 'W/"abc"'), 10, 20)
    with pytest.raises(IndexMismatchError, match="changed while it was read"):
        check_answer(pin, Answer(data, None, '"abd"'), 10, 20)  # ... and a later one must match it


def test_lengths_and_whole_files() -> None:
    pin = Pin(URL)
    with pytest.raises(ShortReadError):
        check_answer(pin, Answer(bytes(5)), 10, 20)
    with pytest.raises(PermanentRemoteError, match="ignores Range"):
        check_answer(pin, Answer(bytes(50)), 10, 20)
    with pytest.raises(CorruptReadError, match="whole file"):
        check_answer(pin, Answer(bytes(10), 10, whole=True), 10, 20)


def test_without_an_etag_the_first_date_pins_the_file() -> None:
    """No ETag: the first answer's Last-Modified pins (If-Unmodified-Since), later ones compare."""
    pin = Pin(URL, size=100)
    assert pin.if_unmodified_since() is None and not pin.pinned
    check_answer(pin, Answer(bytes(10), 100, None, 1_700_000_000.0, (0, 10)), 0, 10)
    assert pin.pinned and pin.if_unmodified_since() == "Tue, 14 Nov 2023 22:13:20 GMT"
    check_answer(pin, Answer(bytes(10), 100, None, 1_700_000_000.0, (0, 10)), 0, 10)
    with pytest.raises(IndexMismatchError, match="modified at"):
        check_answer(pin, Answer(bytes(10), 100, None, 1_700_000_001.0, (0, 10)), 0, 10)


def test_an_index_pin_names_the_index_until_an_answer_matched() -> None:
    pin = Pin(URL, size=100, etag="v1", indexed=True)
    with pytest.raises(IndexMismatchError, match="not the shard the index describes"):
        check_answer(pin, Answer(bytes(10), 100, "v2", None, (0, 10)), 0, 10)
    check_answer(pin, Answer(bytes(10), 100, "v1", None, (0, 10)), 0, 10)
    with pytest.raises(IndexMismatchError, match="changed while it was read"):
        check_answer(pin, Answer(bytes(10), 100, "v2", None, (0, 10)), 0, 10)


@pytest.mark.parametrize(
    "content_range",
    [
        "bytes {a}-{b}/" + "9" * 5000,  # int() refuses past 4,300 digits: was a raw ValueError
        "bytes {a}-{b}/abc",
        "bytes +{a}-{b}/{n}",
        "bytes {a}-{b}/-{n}",
    ],
    ids=["5000-digit total", "non-numeric total", "signed start", "negative total"],
)
def test_a_malformed_content_range_is_a_corrupt_read_naming_the_shard(
    tmp_path: Path, content_range: str
) -> None:
    root = tmp_path / "www"
    root.mkdir()
    write_shard(root / "a.tar", make_samples(3, prefix="a", fields=(".txt",)))
    size = (root / "a.tar").stat().st_size

    def lie(path: str, status: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        if status == 206:
            a, _, b = headers["Content-Range"][6:].partition("/")[0].partition("-")
            headers["Content-Range"] = content_range.format(a=a, b=b, n=size)
        return status, headers

    honest, hostile = RecordingServer(root), RecordingServer(root, lie=lie)
    try:
        build_index([f"{honest.base}/a.tar"], str(tmp_path / "honest.json"))
        index = tmp_path / "i.json"
        index.write_text((tmp_path / "honest.json").read_text().replace(honest.base, hostile.base))
        ds = ShardListDataset(str(index), transformations=[], retry=RetryPolicy(attempts=2))
        for read in (lambda: ds[0], lambda: ds.__getitems__([0, 1, 2])):
            with pytest.raises(CorruptReadError, match="Content-Range") as e:
                read()
            assert e.value.shard == f"{hostile.base}/a.tar"
        ds.close()
    finally:
        honest.stop()
        hostile.stop()
