"""The bulk scan of local shards (tar.scan_local_headers + samples.group_headers) against the
exact walker and grouping: the same member table, byte for byte, or the same typed error."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarfixtures import FORMATS, Entry, make_samples, write_shard, write_tar

from wids import open_index
from wids.errors import WidsError
from wids.index.jsonwriter import render_sidecar
from wids.index.model import ShardInfo
from wids.index.scan import _table, scan_shard
from wids.samples import DUPLICATE_POLICIES, group_columns, group_headers
from wids.storage import Source
from wids.tar import scan_local_headers, scan_local_rows

INFO = ShardInfo(url="s.tar", nsamples=0, size=1, etag=None, mtime=None)


def _outcome(fn):
    try:
        return "ok", render_sidecar(INFO, fn())
    except WidsError as e:
        return type(e).__name__, str(e)


def _same_as_exact(path: Path) -> None:
    """scan_shard (bulk where it applies) == the exact walker + group_columns, every policy."""
    for policy in DUPLICATE_POLICIES:
        bulk = _outcome(lambda policy=policy: scan_shard(Source(str(path)), duplicates=policy)[1])
        exact = _outcome(
            lambda policy=policy: _table(
                group_columns(scan_local_rows(path), duplicates=policy, shard=str(path))
            )
        )
        assert bulk == exact, policy
    headers = scan_local_headers(path)
    if headers is not None:  # then every member is a plain regular file, as the walker says
        rows = scan_local_rows(path)
        assert [(r[1] - 512, r[2], r[3]) for r in rows] == [
            (int(o), int(s), "0") for o, s in zip(headers.header_offset, headers.size, strict=True)
        ]
        assert [r[0].encode("utf-8", "surrogateescape") for r in rows] == [
            bytes(headers.name[i, : headers.name_len[i]]) for i in range(len(rows))
        ]


def test_every_fixture_and_its_truncations_and_corruptions(tar_fixture: Path) -> None:
    raw = tar_fixture.read_bytes()
    _same_as_exact(tar_fixture)
    variants = [raw[:cut] for cut in (0, 100, 512, 700, 1024, len(raw) - 1024, len(raw) - 512)]
    for at in (0, 124, 130, 148, 156, 345, 600):
        if at < len(raw):
            bad = bytearray(raw)
            bad[at] ^= 0x11
            variants.append(bytes(bad))
    for k, data in enumerate(variants):
        path = tar_fixture.with_name(f"variant-{k}.tar")
        path.write_bytes(data)
        _same_as_exact(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_plain_shards_take_the_bulk_path(tmp_path: Path, fmt: str) -> None:
    path = write_shard(tmp_path / "s.tar", make_samples(20), format=fmt)
    headers = scan_local_headers(path)
    assert headers is not None and len(headers.size) == 60
    cols = group_headers(headers)
    assert (
        cols is not None
        and len(cols.key_offsets) == 21
        and cols.fields
        == [
            ".jpg",
            ".cls",
            ".json",
        ]
    )
    _same_as_exact(path)
    # Anything else goes to the exact walker: a directory, a ustar prefix, a repeated key.
    for k, extra in enumerate(
        (Entry("d/", type="5"), Entry("p" * 90 + "/" + "q" * 20 + ".bin", b"x"))
    ):
        other = write_tar(tmp_path / f"o{k}.tar", [*make_samples(2), extra], format="ustar")
        assert scan_local_headers(other) is None
    again = write_shard(tmp_path / "r.tar", make_samples(2) * 2, format=fmt)
    assert group_headers(scan_local_headers(again)) is None
    _same_as_exact(again)


_NAME = st.text(alphabet="ab./é_", min_size=0, max_size=8)
_ENTRY = st.one_of(
    st.tuples(_NAME, st.integers(0, 1100)).map(lambda t: Entry(t[0] or "x", b"z" * t[1])),
    st.sampled_from([Entry("dir/", type="5"), Entry("ln.x", type="2", linkname="a.b")]),
    st.integers(95, 130).map(lambda n: Entry("l" * n + ".txt", b"y")),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entries=st.lists(_ENTRY, max_size=12),
    fmt=st.sampled_from(FORMATS),
    damage=st.one_of(st.none(), st.tuples(st.booleans(), st.integers(0, 1 << 16))),
)
def test_random_tars_bulk_equals_exact(entries: list[Entry], fmt: str, damage) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.tar"
        try:
            write_tar(path, entries, format=fmt)
        except (ValueError, UnicodeError):  # tarfile cannot write it in this format
            return
        if damage is not None:
            cut, at = damage
            raw = bytearray(path.read_bytes())
            if cut:
                del raw[at % (len(raw) + 1) :]
            else:
                raw[at % len(raw)] ^= 0x08
            path.write_bytes(bytes(raw))
        _same_as_exact(path)
        os.remove(path)


def test_a_rebuild_keeps_equal_sidecars_and_replaces_changed_ones(tmp_path: Path) -> None:
    from wids.index.build import build_index
    from wids.index.jsonformat import members_dir

    shards = [write_shard(tmp_path / f"s{i}.tar", make_samples(5, seed=i)) for i in range(2)]
    out = tmp_path / "ix.json"
    build_index([str(s) for s in shards], str(out))
    sidecars = [next(Path(members_dir(str(out))).glob(f"*-s{i}.tar.json")) for i in range(2)]
    before = [(p.stat().st_ino, p.read_bytes()) for p in sidecars]
    write_shard(shards[1], make_samples(6, seed=1))  # one shard changes
    build_index([str(s) for s in shards], str(out), incremental=False)
    after = [(p.stat().st_ino, p.read_bytes()) for p in sidecars]
    assert after[0] == before[0]  # the same file: not replaced by an equal one
    assert after[1][1] != before[1][1] and b'"nsamples":6' in after[1][1]
    assert open_index(str(out)).members(1) is not None


def test_samples_of_many_fields(tmp_path: Path) -> None:
    """Over 62 fields (no bitmask per sample): repeats still found, else bulk = exact."""
    fields = [f".f{i}" for i in range(70)]
    path = write_shard(tmp_path / "m.tar", make_samples(3, fields=fields, jpg_size=1))
    cols = group_headers(scan_local_headers(path))
    assert cols is not None and cols.fields == fields
    _same_as_exact(path)
    again = [*make_samples(1, fields=fields, jpg_size=1), ("000000.f3", b"x")]
    path = write_shard(tmp_path / "r.tar", again)
    assert group_headers(scan_local_headers(path)) is None
    _same_as_exact(path)


_INTS = st.lists(st.integers(0, (1 << 62) - 1) | st.integers(0, 1100), max_size=40)


@settings(max_examples=200, deadline=None)
@given(offsets=_INTS, extra=st.lists(st.integers(-5, 1 << 40), max_size=5))
def test_sidecar_bytes_are_json_dumps_of_the_columns(offsets: list[int], extra: list[int]) -> None:
    """render_sidecar's numpy digits == json.dumps of the columns, for any integer values."""
    import json

    import numpy as np

    from wids.index.jsonformat import MEMBERS_FORMAT, VERSION
    from wids.index.jsonwriter import _json_ints
    from wids.index.members import ShardMembers

    for values in (offsets, extra, sorted(offsets)):
        arr = np.array(values, dtype=np.int64)
        assert _json_ints(arr) == json.dumps(values, separators=(",", ":"))
    n = len(offsets)
    members = ShardMembers(
        fields=[".a", ".é"],
        key_blob=b"k\xff" * n,
        key_offsets=np.arange(n + 1) * 2,
        sample_start=np.arange(n + 1),
        member_field=np.arange(n) % 2,
        member_offset=512 + np.arange(n) * 1024,
        member_size=np.array([v % 512 for v in offsets], dtype=np.int64),
    )
    info = ShardInfo(url="s\u00e9.tar", nsamples=n, size=1 << 40, etag='"e"', mtime=1.5)
    doc = {
        "format": MEMBERS_FORMAT,
        "version": VERSION,
        "url": info.url,
        "nsamples": n,
        "size": info.size,
        "etag": info.etag,
        "mtime": info.mtime,
        **members.to_columns(),
    }
    assert render_sidecar(info, members) == json.dumps(doc, separators=(",", ":")).encode("ascii")


@pytest.mark.parametrize("batches", [(64, 16384), (3, 5), (1, 1)])
def test_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches) -> None:
    """Headers are checked in batches: any batch size gives the same table, and an odd member
    after the first batch still sends the archive to the exact walker."""
    from wids.tar import bulk

    monkeypatch.setattr(bulk, "FIRST_BATCH", batches[0])
    monkeypatch.setattr(bulk, "BATCH", batches[1])
    members = make_samples(40, jpg_size=700)
    path = write_shard(tmp_path / "p.tar", members)
    headers = scan_local_headers(path)
    assert headers is not None and len(headers.size) == 120
    _same_as_exact(path)
    for at in (100, 119):
        odd = write_tar(
            tmp_path / f"o{at}.tar", [*members[:at], Entry("d/", type="5"), *members[at:]]
        )
        assert scan_local_headers(odd) is None
        _same_as_exact(odd)
