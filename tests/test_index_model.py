"""The index model: shard records, components, limits, the repair hint (``wids.index.model``)."""

from __future__ import annotations

import pickle

import pytest

from wids import Component, ShardInfo
from wids.errors import IndexFormatError, UntrustedLocationError
from wids.index import REPAIR_HINT, Fingerprint, with_repair_hint
from wids.index.model import MAX_NSAMPLES, max_samples


def test_shard_info_keeps_its_public_fields_and_carries_its_fingerprint() -> None:
    info = ShardInfo("s3://b/a.tar", 10, 10240, '"e"', 1.5, "ff")
    assert (info.url, info.nsamples, info.size, info.etag, info.mtime, info.md5sum) == (
        "s3://b/a.tar",
        10,
        10240,
        '"e"',
        1.5,
        "ff",
    )
    assert info.fingerprint == Fingerprint(10240, '"e"', 1.5, "ff")
    assert ShardInfo("a.tar", 0).fingerprint == Fingerprint()
    assert pickle.loads(pickle.dumps(info)) == info
    with pytest.raises(AttributeError):
        info.size = 3  # type: ignore[misc]  # frozen


def test_component_counts_its_shards() -> None:
    assert Component("extra", 0.5, 2, 7).nshards == 5


def test_max_samples_is_what_a_tar_of_that_size_can_hold() -> None:
    # a sample has at least a 512-byte header; the archive ends in at least one zero block
    assert [max_samples(n) for n in (0, 512, 1024, 10240)] == [0, 0, 1, 19]
    assert max_samples(None) == MAX_NSAMPLES


def test_repair_hint_is_added_once_and_never_to_an_untrusted_index() -> None:
    e = with_repair_hint(IndexFormatError("bad field", shard="i.json"))
    assert str(e).endswith(f"to repair, {REPAIR_HINT}") and e.shard == "i.json"
    assert with_repair_hint(e) is e
    refused = UntrustedLocationError("names a local file", shard="https://h/i.json")
    assert with_repair_hint(refused) is refused  # rebuilding cannot help
