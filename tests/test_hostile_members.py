"""A hostile member table of a plain tar: every read is the right sample or a typed error.

Seeded byte flips of a real shard's ``.widx`` and SQLite index (the member rows, near the
file's end, and anywhere), then reads of samples by ``ds[i]``, batches, a cached whole-shard
copy and member files (``ds.open``). Before, only a sample's first member's tar header was
checked: a later member's mutated size or offset (a ``.cls`` of 234 bytes instead of 1), or a
mutated key or field name, came back as wrong bytes; a corrupt SQLite covering index gave an
untyped ``ValueError`` from ``len(ds)``.
"""

from __future__ import annotations

import random
import tarfile
from pathlib import Path

import pytest
from compressfixtures import compressible_samples
from tarfixtures import write_shard

from wids import ShardListDataset, build_index
from wids.errors import WidsError

TRIALS = 400


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """A plain tar of 60 samples (.bin, .cls, .txt) and its members' bytes by name."""
    d = tmp_path_factory.mktemp("hostile_members")
    path = write_shard(d / "a.tar", compressible_samples(60, seed=3))
    with tarfile.open(path) as t:
        want = {m.name: t.extractfile(m).read() for m in t if m.isfile()}  # type: ignore[union-attr]
    return path, want


def _mutate(orig: bytes, rng: random.Random) -> bytes:
    data = bytearray(orig)
    for _ in range(rng.randint(1, 4)):  # half near the end, where the member rows are
        tail = rng.random() < 0.5
        at = (
            rng.randrange(max(0, len(data) - 40000), len(data))
            if tail
            else rng.randrange(len(data))
        )
        data[at] = rng.randrange(256)
    return bytes(data)


def _check(sample: dict, want: dict[str, bytes]) -> None:
    for field, value in sample.items():
        if not field.startswith("__"):
            assert want.get(sample["__key__"] + field) == value, (sample["__key__"], field)


def _fuzz(  # noqa: ANN001
    index: Path, want: dict[str, bytes], seed: int, read, trials: int = TRIALS, **options
) -> dict[str, int]:
    orig = index.read_bytes()
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    try:
        for _ in range(trials):
            index.write_bytes(_mutate(orig, rng))
            outcome = "ok"
            try:
                ds = ShardListDataset(str(index), transformations=[], **options)
                try:
                    read(ds, rng, want)
                finally:
                    ds.close()
            except WidsError as e:
                outcome = type(e).__name__
            seen[outcome] = seen.get(outcome, 0) + 1
    finally:
        index.write_bytes(orig)
    return seen


def _one_by_one(ds: ShardListDataset, rng: random.Random, want: dict[str, bytes]) -> None:
    for i in rng.sample(range(len(ds)), min(len(ds), 10)):
        _check(ds[i], want)


def _batches(ds: ShardListDataset, rng: random.Random, want: dict[str, bytes]) -> None:
    order = list(range(len(ds)))
    for k in range(0, len(order), 8):  # merged reads of 8 consecutive samples
        for s in ds.__getitems__(order[k : k + 8]):
            _check(s, want)


def _members(ds: ShardListDataset, rng: random.Random, want: dict[str, bytes]) -> None:
    for i in rng.sample(range(len(ds)), min(len(ds), 4)):
        for field in (".bin", ".cls", ".txt"):
            try:
                f = ds.open(i, field)
            except KeyError:  # the field's name mutated
                continue
            with f:
                got = f.read()
            assert want.get(f.name) == got, f.name


@pytest.mark.parametrize("kind", ["widx", "sqlite"])
@pytest.mark.parametrize(
    "read", [_one_by_one, _batches, _members], ids=["ds_i", "batch", "member_file"]
)
def test_a_mutated_member_table_gives_the_right_sample_or_a_typed_error(
    shard: tuple[Path, dict[str, bytes]], tmp_path: Path, kind: str, read
) -> None:  # noqa: ANN001
    path, want = shard
    index = tmp_path / f"i.{kind}"
    build_index([str(path)], str(index))
    seen = _fuzz(index, want, 3, read)
    assert seen.get("ok", 0) > 0 and len(seen) > 1, seen  # the reads ran, the errors too


@pytest.mark.parametrize("access", ["range", "shard"])
def test_a_mutated_member_table_of_a_remote_shard_gives_the_right_sample_or_a_typed_error(
    shard: tuple[Path, dict[str, bytes]], http_server, tmp_path: Path, access: str
) -> None:  # noqa: ANN001
    """Over nginx: range reads (the first header checked with the read, the others after)
    and whole-shard copies in ``cache_dir`` (a cached reader checks nothing itself)."""
    path, want = shard
    http_server.put(str(path), f"hostile_members/{access}/a.tar")
    index = tmp_path / "i.widx"
    build_index([http_server.url(f"hostile_members/{access}/a.tar")], str(index))
    options = {"access": access, "cache_dir": str(tmp_path / "cache")} if access == "shard" else {}
    seen = _fuzz(index, want, 3, _one_by_one, trials=TRIALS, **({"access": access} | options))
    assert seen.get("ok", 0) > 0 and len(seen) > 1, seen


def test_a_corrupt_sqlite_counts_index_is_an_index_format_error(
    shard: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    """The shards' sample counts are read through the covering index ``shards_counts``, which
    the row check does not read: before, a corrupt one gave ``ValueError: 'list' argument
    must have no negative elements`` (or an IndexError) from ``len(ds)``."""
    path, _ = shard
    index = tmp_path / "i.sqlite"
    build_index([str(path)], str(index))
    orig = index.read_bytes()
    rng = random.Random(3)
    untyped: list[str] = []
    for _ in range(1500):
        index.write_bytes(_mutate(orig, rng))
        try:
            ds = ShardListDataset(str(index), transformations=[])
            try:
                len(ds)
                ds[0]
            finally:
                ds.close()
        except WidsError:
            pass
        except Exception as e:  # noqa: BLE001 - what this test looks for
            untyped.append(f"{type(e).__name__}: {e}")
    assert not untyped, untyped[:3]
