"""The dataset's catalog (description, lookup, member tables, first touch) and local cache."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from wids import build_index
from wids.dataset.catalog import Catalog
from wids.dataset.localcache import LocalCache
from wids.errors import OfflineError
from wids.synth import write_dataset

NS, NSAMPLES = 3, 5


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("catalog")
    paths = write_dataset(str(d), shards=NS, samples_per_shard=NSAMPLES, real_images=False)
    out = str(d / "train.json")
    build_index(paths, out, name="train")
    return out, paths


def test_locate_maps_global_indices_to_shard_and_sample(index):
    catalog = Catalog(index[0], LocalCache(None))
    n = NS * NSAMPLES
    assert [catalog.locate(i) for i in (0, NSAMPLES - 1, NSAMPLES, n - 1)] == [
        (0, 0, 0),
        (NSAMPLES - 1, 0, NSAMPLES - 1),
        (NSAMPLES, 1, 0),
        (n - 1, NS - 1, NSAMPLES - 1),
    ]
    assert catalog.locate(-1) == (n - 1, NS - 1, NSAMPLES - 1)
    assert catalog.locate(np.int64(6)) == (6, 1, 1)
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match="out of range"):
            catalog.locate(bad)
    with pytest.raises(TypeError):
        catalog.locate(1.0)


@pytest.mark.parametrize(
    "counts",
    [[5, 5, 5], [5, 5, 2], [5, 5, 9], [4], [3, 0], [3, 5, 3], [0, 3, 3], [2, 0, 2, 2], [1] * 9],
)
def test_locate_agrees_with_the_cumulative_counts_for_any_shard_sizes(counts):
    """Shards of one size but the last (as writers cut them) are found without a search."""
    shards = [{"url": f"s{k}.tar", "nsamples": c} for k, c in enumerate(counts)]
    catalog = Catalog(shards, LocalCache(None))
    pairs = [(s, j) for s, c in enumerate(counts) for j in range(c)]
    want = [(i, s, j) for i, (s, j) in enumerate(pairs)]
    assert [catalog.locate(i) for i in range(sum(counts))] == want
    loaded = catalog.load()
    uniform = counts[0] > 0 and all(c == counts[0] for c in counts[:-1])
    assert loaded.per_shard == (counts[0] if uniform else 0)
    assert [loaded.locate(i) for i in range(sum(counts))] == [s for _, s, _ in want]
    if uniform:  # no search: the cumulative counts are not read (before, a bisect of them)
        loaded.cum_list = loaded.cum = None
        assert [catalog.locate(i) for i in range(sum(counts))] == want


def test_first_touch_is_per_process_and_forgotten_on_request(index):
    catalog = Catalog(index[0], LocalCache(None))
    members, data_end = catalog.members(1)
    info = catalog.load().infos[1]
    assert catalog.needs_check(1)
    catalog.check_fingerprint(info, data_end)

    class Reader:  # reads the local file: what a LocalReader returns
        verifies = False

        def read_span(self, start, end, stats=None, check=None):
            with open(info.url, "rb") as f:
                f.seek(start)
                return f.read(end - start)

    catalog.check_header(1, members, Reader())
    assert not catalog.needs_check(1)
    assert pickle.loads(pickle.dumps(catalog)).needs_check(1)  # a new process checks again
    catalog.forget_check(1)
    assert catalog.needs_check(1)
    assert not Catalog(index[0], LocalCache(None), verify=False).needs_check(0)


def test_pickle_keeps_a_small_description_and_scanned_tables(index, monkeypatch):
    """A spawned DataLoader worker gets the loaded description: on the old code it read the
    index again. A large index is reopened instead (it reopens faster than it pickles)."""
    import wids.dataset.catalog as catalog_module

    catalog = Catalog(index[0], LocalCache(None))
    catalog.members(0)
    again = pickle.loads(pickle.dumps(catalog))
    assert again.loaded and again.locate(-1)[1] == NS - 1
    assert again.members(1)[0] == catalog.members(1)[0]
    monkeypatch.setattr(catalog_module, "PICKLED_SHARDS", NS - 1)
    again = pickle.loads(pickle.dumps(catalog))
    assert not again.loaded  # the open index is reopened in the new process
    assert again.locate(-1)[1] == NS - 1
    scanned = Catalog([{"url": p, "nsamples": NSAMPLES} for p in index[1]], LocalCache(None))
    scanned.members(2)
    assert 2 in pickle.loads(pickle.dumps(scanned))._members  # no second scan


def test_local_cache_is_made_per_process_and_never_pickled(tmp_path):
    local = LocalCache(tmp_path, cache_size=1 << 20, keep=True)
    cache = local.shard_cache()
    assert local.shard_cache() is cache
    assert (cache.max_bytes, cache.keep, cache.offline) == (1 << 20, True, False)
    again = pickle.loads(pickle.dumps(local))
    assert again._cache is None and again.cache_dir == str(tmp_path)
    pid = os.fork()
    if pid == 0:  # the child: the parent's cache (and its threads) is not ours
        os._exit(0 if local.shard_cache() is not cache else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    local.close()


def test_offline_refuses_remote_urls_only(tmp_path):
    local = LocalCache(None, offline=True)
    local.check_online(str(tmp_path / "a.tar"))
    with pytest.raises(OfflineError, match="offline"):
        local.check_online("https://example.invalid/a.tar")
    with pytest.raises(RuntimeError, match="cache_dir"):
        local.shard_cache()


def test_a_remote_index_s_stat_for_the_offline_copy_overlaps_its_read(
    index, http_server, fault_proxy, tmp_path
):
    from faultproxy import FaultPlan

    from wids.cache import snapshot_path

    d = os.path.dirname(index[0])
    for root, _, files in os.walk(d):
        for f in files:
            http_server.put(
                os.path.join(root, f), f"cat-snap/{os.path.relpath(os.path.join(root, f), d)}"
            )
    # every request for the index waits 0.3 s: the stat and the read overlap, or they do not
    proxy = fault_proxy(
        http_server.base, FaultPlan({"delay": 1.0}, rate=1.0, only="train.json", delay=0.3)
    )
    url = proxy.url("cat-snap/train.json")
    catalog = Catalog(url, LocalCache(str(tmp_path / "cache")))
    assert catalog.load().total == NS * NSAMPLES
    assert proxy.paths["/cat-snap/train.json"] == 2  # one read and one stat
    assert proxy.peak_delayed == 2, proxy.peak_delayed  # under way at once
    assert os.path.exists(snapshot_path(tmp_path / "cache", url))  # the offline copy was kept
    offline = Catalog(url, LocalCache(str(tmp_path / "cache"), offline=True))
    assert offline.load().total == NS * NSAMPLES
