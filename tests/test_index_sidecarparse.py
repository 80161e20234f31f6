"""Member sidecars parsed straight into arrays: ``wids.index.sidecarparse``.

The fast path must read exactly what ``json.loads`` reads, or step aside: every sidecar here is
read twice, by the reader as it is and with the fast path turned off (``json.loads`` for
every sidecar, as before it), and the two must give the same table or the same error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import wids.index.jsonreader
from wids import JsonIndex, JsonIndexWriter, ShardInfo, ShardMembers
from wids.errors import IndexFormatError
from wids.index.sidecarparse import MIN_BYTES, parse_sidecar


def _members(n: int) -> ShardMembers:
    samples, off = [], 512
    for i in range(n):
        ms = []
        for field, size in ((".cls", 1), (".jpg", 20_000 + i % 977), (".json", 66)):
            ms.append((field, off, size))
            off += (size + 511) // 512 * 512 + 512
        samples.append((f"dir/{i:09d}", ms))
    return ShardMembers.from_samples(samples)


def _index(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """A one-shard JSON index of ``n`` samples (no tar needed to read members) and its sidecar."""
    members = _members(n)
    size = int(members.spans()[1][-1]) + 1024
    path = tmp_path / "ix.json"
    with JsonIndexWriter(path, name="ix") as w:
        w.add(ShardInfo("s-000.tar", n, size=size, mtime=1.5), members)
    doc = json.loads(path.read_text())
    return path, path.parent / doc["shardlist"][0]["members"]


def _outcome(path: Path) -> ShardMembers | str:
    try:
        table = JsonIndex(str(path)).members(0)
    except IndexFormatError as e:
        return f"{type(e).__name__}: {e}"
    assert table is not None
    return table


def _by_json_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> ShardMembers | str:
    """:func:`_outcome` with the fast path off: every sidecar parsed by ``json.loads``."""
    with monkeypatch.context() as m:
        m.setattr(wids.index.jsonreader, "parse_sidecar", lambda data: None)
        return _outcome(path)


def test_a_written_sidecar_takes_the_fast_path_and_reads_as_json_loads_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sidecar = _index(tmp_path, 300)
    data = sidecar.read_bytes()
    assert len(data) >= MIN_BYTES
    parsed = parse_sidecar(data)
    assert parsed is not None
    head, blob, offsets, columns = parsed
    cols = json.loads(data)
    assert head == {k: v for k, v in cols.items() if k not in ("keys", *_COLS)}
    assert blob == "".join(cols["keys"]).encode() and offsets[-1] == len(blob)
    assert [c.tolist() for c in columns] == [cols[c] for c in _COLS]
    assert _outcome(path) == _by_json_loads(path, monkeypatch) == _members(300)


_COLS = ("sample_start", "member_field", "member_offset", "member_size")


def _sub(old: bytes, new: bytes, count: int = 1) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        assert old in data
        return data.replace(old, new, count)

    return edit


def _utf16_head(data: bytes) -> bytes:
    """The head re-encoded as UTF-16 (json.loads would guess it), the tail left ASCII."""
    k = data.find(b',"keys":[')
    return data[:k].decode().encode("utf-16-be") + b"\x00" + data[k:]


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(_sub(b'"member_offset":[512,', b'"member_offset":[0512,'), id="leading-0"),
        pytest.param(_sub(b'"member_offset":[512,', b'"member_offset":[-512,'), id="negative"),
        pytest.param(_sub(b'"member_offset":[512,', b'"member_offset":[+512,'), id="plus"),
        pytest.param(_sub(b'"member_offset":[512,', b'"member_offset":[512.0,'), id="float"),
        pytest.param(_sub(b'"member_offset":[512,', b'"member_offset":[512,,'), id="empty-num"),
        pytest.param(_sub(b'"member_offset":[512,', b'"member_offset":[,512,'), id="lead-comma"),
        pytest.param(_sub(b'"member_offset":[512,', b'"member_offset":[512 ,'), id="space"),
        pytest.param(
            _sub(b'"member_offset":[512,', b'"member_offset":[1000000000000000512,'),
            id="19-digits",
        ),
        pytest.param(
            _sub(b'"member_offset":[512,', b'"member_offset":[' + b"9" * 25 + b","),
            id="25-digits",
        ),
        pytest.param(_sub(b'"member_size":[1,', b'"member_size":[4611686018427387,'), id="big"),
        pytest.param(_sub(b'"member_field":[0,1', b'"member_field":[0,7'), id="field-range"),
        pytest.param(_sub(b'"sample_start":[0,3,', b'"sample_start":[0,2,'), id="starts"),
        pytest.param(_sub(b'"sample_start":[0,3,6,', b'"sample_start":[0,6,'), id="short"),
        pytest.param(_sub(b",1536,", b",1024,"), id="overlap"),
        pytest.param(_sub(b'"dir/000000007"', b'"dir/0000\\"00007"'), id="escaped-quote"),
        pytest.param(_sub(b'"dir/000000007"', b'"dir/0000\\u00e907"'), id="escape"),
        pytest.param(_sub(b'"dir/000000007"', "dir/0000é07".join('""').encode()), id="utf8"),
        pytest.param(_sub(b'"dir/000000007"', b'"dir/0000\x0107"'), id="control"),
        pytest.param(_sub(b'"dir/000000007"', b'"dir/0000\xff07"'), id="not-utf8"),
        pytest.param(_sub(b'"dir/000000007"', b'"dir/0000],07"'), id="bracket-in-key"),
        pytest.param(_sub(b'"dir/000000007",', b'"dir/000000007" ,'), id="key-space"),
        pytest.param(_sub(b'"dir/000000007",', b'"dir/000000007",,'), id="key-comma"),
        pytest.param(_sub(b'"dir/000000007",', b'"dir/000000007","x",'), id="extra-key"),
        pytest.param(_sub(b'"dir/000000007",', b""), id="missing-key"),
        pytest.param(_sub(b'"dir/000000007",', b'"dir/000000007"'), id="missing-comma"),
        pytest.param(_sub(b'"fields":', b'"keys":[],"fields":'), id="keys-twice"),
        pytest.param(_sub(b'"fields":', b'"member_size":[1],"fields":'), id="column-twice"),
        pytest.param(_sub(b'"fields":[', b'"fields":"x","f":['), id="fields-not-list"),
        pytest.param(_sub(b'"fields":[', b'"fields":{"a":[1,'), id="keys-nested"),
        pytest.param(lambda d: d + b" ", id="trailing-space"),
        pytest.param(lambda d: d + b"x", id="trailing-junk"),
        pytest.param(lambda d: d[:-2] + b"}", id="unclosed"),
        pytest.param(lambda d: d[:-1] + b',"member_size":[1]}', id="last-twice"),
        pytest.param(_sub(b'"member_field":[', b'"member_fields":['), id="renamed"),
        pytest.param(_sub(b'"version":1', b'"version":2'), id="version"),
        pytest.param(_sub(b'"size":', b'"size":1024,"x":'), id="stale-size"),
        pytest.param(_utf16_head, id="utf16-head-ascii-tail"),
    ],
)
def test_an_edited_sidecar_reads_as_json_loads_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Callable[[bytes], bytes]
) -> None:
    path, sidecar = _index(tmp_path, 300)
    sidecar.write_bytes(edit(sidecar.read_bytes()))
    assert _outcome(path) == _by_json_loads(path, monkeypatch)


def test_small_sidecars_and_other_documents_are_left_to_json_loads(tmp_path: Path) -> None:
    _, sidecar = _index(tmp_path, 3)
    data = sidecar.read_bytes()
    assert len(data) < MIN_BYTES and parse_sidecar(data) is None
    assert parse_sidecar(b"[" * 10_000 + b"]" * 10_000) is None
    head = b'{"fields":[".a"],"keys":['
    assert parse_sidecar(head + b"[" * 200_000 + b"]}") is None  # nested too deeply
    empty = head + b'],"sample_start":[],"member_field":[],"member_offset":[],"member_size":[]}'
    assert parse_sidecar(empty + b" " * MIN_BYTES) is None and json.loads(empty)


def test_a_big_sidecar_is_not_given_to_json_loads_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """json.loads makes ~10 Python objects a sample, then numpy copies them: only the head."""
    path, sidecar = _index(tmp_path, 20_000)
    ix = JsonIndex(str(path))
    assert len(ix.shards) == 1  # the description: json.loads, not part of the measure
    parsed: list[int] = []
    loads = json.loads

    def counted(text: str | bytes, **kwargs: object) -> object:
        parsed.append(len(text))
        return loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(json, "loads", counted)
    table = ix.members(0)
    assert table is not None and len(table) == 20_000
    assert np.array_equal(table.member_offset, _members(20_000).member_offset)
    assert table.key(19_999) == "dir/000019999"
    assert parsed and max(parsed) < 1000 < sidecar.stat().st_size
