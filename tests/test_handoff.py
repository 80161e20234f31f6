"""Member tables handed to DataLoader workers through a private file (``wids.dataset.handoff``).

Shards and their index are served by nginx; workers are real processes under spawn and
forkserver (and a real ``os.fork`` for the never-deletes check). A dataset whose tables are
over ``PICKLED_BYTES`` pickles a ticket (path, size, SHA-256) instead of the tables; the
samples are checked against ``tarfile`` (the oracle).
"""

from __future__ import annotations

import gc
import os
import pickle
import stat
import subprocess
import sys

import pytest
from tar_oracle import dataset_samples, strip_meta

from wids import ChunkedSampler, ShardListDataset, build_index
from wids.dataset.catalog import PICKLED_BYTES
from wids.synth import write_dataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

NS, NSAMPLES = 4, 200  # tables of ~90 bytes a sample: over PICKLED_BYTES together


@pytest.fixture(scope="module")
def remote(http_server, tmp_path_factory):
    """Shards, their index with member sidecars, and the shards alone, on nginx."""
    src = tmp_path_factory.mktemp("handoff-src")
    paths = write_dataset(
        str(src), shards=NS, samples_per_shard=NSAMPLES, real_images=False, jpg_bytes=64
    )
    build_index(paths, str(src / "train.json"), name="train")
    for root, _, files in os.walk(src):
        for name in files:
            path = os.path.join(root, name)
            http_server.put(path, "handoff/" + os.path.relpath(path, src))
    sidecars = sorted(os.listdir(src / "train.members"))
    assert len(sidecars) == NS
    return {
        "paths": paths,
        "index": http_server.url("handoff/train.json"),
        "pattern": http_server.url(f"handoff/synth-{{000000..{NS - 1:06d}}}.tar"),
        "sidecars": [f"handoff/train.members/{n}" for n in sidecars],
        "oracle": dataset_samples(paths),
    }


def _dataset(url):
    ds = ShardListDataset(url, access="range", transformations=[])
    assert len(ds) == NS * NSAMPLES  # the main process loads the index and its tables
    return ds


def _ticket(ds):
    """The handoff file's ticket a pickled copy of ``ds`` carries (``None``: none)."""
    return pickle.loads(pickle.dumps(ds))._catalog._ticket


def _check(remote, samples):
    indices = [s["__index__"] for s in samples]
    assert sorted(indices) == list(range(NS * NSAMPLES))
    for s in samples:
        assert strip_meta(s) == remote["oracle"][s["__index__"]]


def _read_all(ds, ctx, **kw):
    sampler = ChunkedSampler(ds, chunksize=NSAMPLES, seed=4)
    loader = DataLoader(
        ds, sampler=sampler, batch_size=50, num_workers=2, multiprocessing_context=ctx,
        collate_fn=list, **kw,
    )  # fmt: skip
    return [s for batch in loader for s in batch]


def _sidecar_requests(http_server, remote):
    return sum(http_server.request_count(name) for name in remote["sidecars"])


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_workers_get_the_tables_without_fetching_them(remote, http_server, ctx):
    """On the old code tables over 32 KiB were left out of the pickle: each worker fetched
    every sidecar again."""
    ds = _dataset(remote["index"])
    tables = sum(m.nbytes for m, _ in ds._catalog._members.values())
    assert len(ds._catalog._members) == NS and tables > PICKLED_BYTES
    assert len(pickle.dumps(ds)) < PICKLED_BYTES  # the pipe's room: the tables are not in it
    http_server.reset_counts()
    _check(remote, _read_all(ds, ctx))
    assert _sidecar_requests(http_server, remote) == 0
    assert http_server.request_count("handoff/train.json") == 0
    assert http_server.request_count() > 0  # the shards were read


def test_the_file_is_private_written_once_and_checked(remote):
    ds = _dataset(remote["index"])
    first, again = _ticket(ds), _ticket(ds)
    assert first is not None and again == first  # written once per catalog
    folder = os.path.dirname(first.path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert os.listdir(folder) == [os.path.basename(first.path)]
    assert os.path.getsize(first.path) == first.size
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._catalog._members == {}  # read at first need
    assert strip_meta(copy[NSAMPLES + 3]) == remote["oracle"][NSAMPLES + 3]
    assert sorted(copy._catalog._members) == list(range(NS))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_of_the_dataset_goes_to_forkserver_workers(remote, how):
    """A dataset copied with ``copy.deepcopy`` or pickling (as frameworks do) and handed to a
    forkserver DataLoader: on the old code pickling the copy raised ``KeyError: '_handoff'``
    in the catalog's ``__getstate__`` (the copy had no handoff of its own)."""
    import copy as copying

    ds = _dataset(remote["index"])
    if how == "deepcopy":
        other = copying.deepcopy(ds)
    else:
        other = pickle.loads(pickle.dumps(ds))
    _check(remote, _read_all(other, "forkserver"))
    assert strip_meta(ds[7]) == remote["oracle"][7]  # the original still reads beside it


def _spoil(path, how):
    if how == "missing":
        os.unlink(path)
        return
    with open(path, "r+b") as f:
        if how == "short":
            f.truncate(os.path.getsize(path) - 1)
        else:  # one byte changed, same size
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("how", ["altered", "short", "missing"])
def test_a_spoiled_file_is_refused_and_the_tables_are_fetched(remote, http_server, how):
    ds = _dataset(remote["index"])
    ticket = _ticket(ds)
    copy = pickle.loads(pickle.dumps(ds))
    _spoil(ticket.path, how)
    http_server.reset_counts()
    got = [copy[i] for i in range(0, NS * NSAMPLES, NSAMPLES // 2)]
    for s in got:
        assert strip_meta(s) == remote["oracle"][s["__index__"]]
    assert _sidecar_requests(http_server, remote) == NS


def test_an_altered_file_is_refused_by_spawned_workers(remote, http_server):
    ds = _dataset(remote["index"])
    ticket = _ticket(ds)  # the DataLoader's picklings reuse this file
    _spoil(ticket.path, "altered")
    http_server.reset_counts()
    _check(remote, _read_all(ds, "spawn"))
    assert _sidecar_requests(http_server, remote) > 0  # fetched, since the file was refused


class _Marker:
    """Unpickling it creates a file: it shows whether bytes were unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_bytes_that_are_not_the_ticket_s_are_never_unpickled(remote, tmp_path):
    ds = _dataset(remote["index"])
    ticket = _ticket(ds)
    copy = pickle.loads(pickle.dumps(ds))
    marker = tmp_path / "unpickled"
    with open(ticket.path, "wb") as f:
        f.write(pickle.dumps(_Marker(str(marker))))
    assert strip_meta(copy[5]) == remote["oracle"][5]
    assert not marker.exists()


def test_the_file_goes_with_the_dataset_and_no_worker_removes_it(remote):
    ds = _dataset(remote["index"])
    ticket = _ticket(ds)
    folder = os.path.dirname(ticket.path)
    _check(remote, _read_all(ds, "spawn", persistent_workers=True))
    assert os.path.exists(ticket.path)  # the workers collected their copies
    pid = os.fork()
    if pid == 0:  # a forked child drops its copy: the finalizer it inherited does nothing
        del ds
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert os.path.exists(ticket.path)
    del ds
    gc.collect()
    assert not os.path.exists(ticket.path) and not os.path.exists(folder)


def test_the_file_is_removed_at_exit(remote):
    script = (
        "import os, pickle, sys\n"
        "from wids import ShardListDataset\n"
        f"ds = ShardListDataset({remote['index']!r}, transformations=[])\n"
        "len(ds)\n"
        "print(pickle.loads(pickle.dumps(ds))._catalog._ticket.path)\n"
        "sys.modules['__main__'].keep = ds\n"  # alive until the interpreter exits
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    path = out.stdout.strip()
    assert path and not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_scanned_tables_are_handed_over_too(remote, http_server):
    """A shard pattern's tables come from scanning each shard: a copy gets them without a
    scan, and on the old code they all went in the pickle, past the pipe's room."""
    ds = _dataset(remote["pattern"])
    assert ds._catalog._scanned == set(range(NS))
    assert len(pickle.dumps(ds)) < PICKLED_BYTES
    copy = pickle.loads(pickle.dumps(ds))
    http_server.reset_counts()
    copy._catalog.prefetch_members([0])
    assert http_server.request_count() == 0
    assert copy._catalog._scanned == set(range(NS)) and sorted(copy._catalog._members) == [
        0,
        1,
        2,
        3,
    ]
    _check(remote, _read_all(ds, "spawn"))


@pytest.fixture(scope="module")
def many(http_server, tmp_path_factory):
    """An index of more shards than are loaded with its description (``PICKLED_TABLES``)."""
    src = tmp_path_factory.mktemp("handoff-many")
    paths = write_dataset(str(src), shards=40, samples_per_shard=40, real_images=False, jpg_bytes=8)
    build_index(paths, str(src / "many.json"), name="many")
    for root, _, files in os.walk(src):
        for name in files:
            path = os.path.join(root, name)
            http_server.put(path, "handoff-many/" + os.path.relpath(path, src))
    sidecars = [f"handoff-many/many.members/{n}" for n in os.listdir(src / "many.members")]
    assert len(sidecars) == 40
    return {
        "index": http_server.url("handoff-many/many.json"),
        "sidecars": sidecars,
        "oracle": dataset_samples(paths),
    }


def test_tables_loaded_later_go_too_and_the_file_is_rewritten(many, http_server):
    ds = ShardListDataset(many["index"], access="range", transformations=[])
    assert len(ds) == 40 * 40 and not ds._catalog._members  # too many shards to load them all
    for shard in range(12):
        ds[shard * 40]
    first = _ticket(ds)
    assert first is not None and _ticket(ds) == first
    copy = pickle.loads(pickle.dumps(ds))
    http_server.reset_counts()
    assert [strip_meta(copy[k * 40 + 1]) for k in range(12)] == [
        many["oracle"][k * 40 + 1] for k in range(12)
    ]
    assert _sidecar_requests(http_server, many) == 0
    assert http_server.request_count() == 12  # one range read per sample
    ds[12 * 40]  # one more table: the next copy gets a new file, the old one is gone
    second = _ticket(ds)
    assert second is not None and second != first
    assert not os.path.exists(first.path) and os.path.exists(second.path)
    later = pickle.loads(pickle.dumps(ds))
    later._catalog.prefetch_members([12])
    assert sorted(later._catalog._members) == list(range(13))
