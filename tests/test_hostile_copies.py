"""Careless copies: a local dataset uploaded to S3/GCS, then a shard replaced at the same size.

The index was built on the local shards: it records their size, mtime and md5, but no etag.
The store gives its own etag and modification time, so before md5s were compared only the
size was (and a recorded member's header, which a same-layout rewrite keeps): the replaced
shard's bytes were served silently. Real servers on 127.0.0.1 (moto, the GCS emulator).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from tarfixtures import make_samples, write_shard

from wids import ShardListDataset, build_index
from wids.errors import IndexMismatchError

N, PER = 3, 6


def _local(root: Path, big: int = 0) -> tuple[list[Path], Path]:
    root.mkdir(parents=True)
    paths = [root / f"train-{k:04d}.tar" for k in range(N)]
    for k, p in enumerate(paths):
        samples = make_samples(PER, fields=(".txt",), prefix=f"s{k}-")
        if big:
            samples.append((f"s{k}-big.bin", b"b" * big))
        write_shard(p, samples)
    index = root / "train.json"
    build_index([str(p) for p in paths], str(index))
    return paths, index


def _upload(server, root: Path, prefix: str, **put) -> str:
    """Upload the dataset directory (shards, index, member sidecars) under ``prefix``."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            name = f"{prefix}/{path.relative_to(root).as_posix()}"
            server.fs.put_file(str(path), f"{server.bucket}/{name}", **put)
    server.fs.invalidate_cache()
    return server.url(f"{prefix}/train.json")


def _rewritten(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[515] ^= 0xFF  # the first member's data: same size, same layout, other bytes
    return bytes(data)


def _texts(ds) -> list:
    return [ds[i].get(".txt") for i in range(len(ds))]


@pytest.mark.parametrize("store", ["s3", "gcs"])
@pytest.mark.parametrize("reach", ["uploaded index", "local index, url_map"])
def test_uploaded_shard_replaced_at_the_same_size_is_refused(request, store, reach, tmp_path):
    server = request.getfixturevalue(f"{store}_server")
    paths, local_index = _local(tmp_path / "d")
    prefix = f"copies{uuid.uuid4().hex[:8]}"
    uploaded = _upload(server, tmp_path / "d", prefix)
    so = server.storage_options
    where: dict = {"storage_options": so, "transformations": []}
    index = uploaded
    if reach != "uploaded index":  # the index stays here; its shards are read from the bucket
        index = str(local_index)
        where["url_map"] = {f"{tmp_path / 'd'}/": server.url(f"{prefix}/")}
    expected = _texts(ShardListDataset(str(local_index), transformations=[]))
    assert _texts(ShardListDataset(index, **where)) == expected
    if store == "gcs":  # GCS gives the md5 of every object: compared as it is
        assert server.fs.info(server.url(f"{prefix}/{paths[1].name}")).get("md5Hash")
    server.put_bytes(_rewritten(paths[1]), f"{prefix}/{paths[1].name}")
    ds = ShardListDataset(index, **where)
    assert ds[0][".txt"] == expected[0]
    with pytest.raises(IndexMismatchError) as e:
        ds[PER]  # was served with the other bytes
    assert e.value.shard == server.url(f"{prefix}/{paths[1].name}")
    assert "md5" in str(e.value) and "wids index create" in str(e.value)


def test_multipart_uploads_are_compared_by_size_and_header_until_indexed(s3_server, tmp_path):
    """An object uploaded in parts has an etag ``<md5 of the parts' md5s>-<parts>``: no MD5 of
    its bytes to compare with the index's. Its size and a recorded member's header are still
    checked (no false alarm for the same bytes); indexing the uploaded shards records their
    etags, and a later rewrite is then refused."""
    paths, _ = _local(tmp_path / "d", big=10 << 20)  # s3fs: in parts from 2 x chunksize
    prefix = f"copies{uuid.uuid4().hex[:8]}"
    so = s3_server.storage_options
    index = _upload(s3_server, tmp_path / "d", prefix, chunksize=5 << 20)
    etag = s3_server.fs.info(f"{s3_server.bucket}/{prefix}/{paths[0].name}")["ETag"]
    assert re.fullmatch(r"[0-9a-f]{32}-[0-9]+", etag.strip('"'))  # uploaded in parts
    expected = _texts(ShardListDataset(str(tmp_path / "d" / "train.json"), transformations=[]))
    assert _texts(ShardListDataset(index, transformations=[], storage_options=so)) == expected
    # index the uploaded shards: their etags are recorded, a same-size rewrite is refused
    urls = [s3_server.url(f"{prefix}/{p.name}") for p in paths]
    pinned = str(tmp_path / "s3.json")
    build_index(urls, pinned, storage_options=so)
    for_s3 = {"s3://": so}  # a local index: credentials named for the shards' origin
    ds = ShardListDataset(pinned, transformations=[], storage_options=for_s3)
    assert ds._catalog.load().infos[1].etag
    assert _texts(ds) == expected
    s3_server.put_bytes(_rewritten(paths[1]), f"{prefix}/{paths[1].name}")
    with pytest.raises(IndexMismatchError, match="etag"):
        ShardListDataset(pinned, transformations=[], storage_options=for_s3)[PER + 1]


def test_a_single_part_upload_of_the_same_bytes_is_the_indexed_shard(s3_server, tmp_path):
    """A recorded md5 equals the etag of an object uploaded in one part: the shard, checked."""
    paths, _ = _local(tmp_path / "d")
    prefix = f"copies{uuid.uuid4().hex[:8]}"
    index = _upload(s3_server, tmp_path / "d", prefix)
    ds = ShardListDataset(index, transformations=[], storage_options=s3_server.storage_options)
    info = ds._catalog.load().infos[0]
    etag = s3_server.fs.info(info.url)["ETag"].strip('"')
    assert info.etag is None and info.md5sum == etag  # compared: no etag recorded, an md5
    assert len(_texts(ds)) == N * PER == len(ds)
    assert os.path.getsize(paths[0]) == info.size
