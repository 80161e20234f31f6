"""``wids.storage.forks``: a fork is noticed without ``os.getpid()``; children leave the parent's
connections alone."""

from __future__ import annotations

import gc
import os
import pickle
import time

import pytest
import torch.utils.data
from forked import in_fork

from wids import RetryPolicy, ShardListDataset
from wids.storage import Source, Store, forks


def test_a_forked_child_and_grandchild_see_a_new_generation():
    made = forks.stamp()
    assert forks.generation == made

    def child() -> str:
        answer = [forks.generation != made]
        again = forks.stamp()
        grand = os.fork()
        if grand == 0:
            os._exit(0 if forks.generation not in (made, again) else 1)
        answer.append(os.waitpid(grand, 0)[1] == 0)
        return repr(answer)

    assert in_fork(child) == "[True, True]"
    assert forks.generation == made  # the parent's is its own


def test_an_unpickled_dataset_is_this_process_s(tmp_path):
    ds = ShardListDataset([{"url": str(tmp_path / "a.tar"), "nsamples": 1}])
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._made == forks.generation


class _Reads(torch.utils.data.Dataset):
    def __init__(self, source: Source) -> None:
        self.source = source

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        n = len(self.source.read_range(i, i + 10))
        gc.collect()  # as a longer epoch would: frees the parent's filesystem this one replaced
        return n


@pytest.mark.servers
def test_dataloader_workers_leave_the_parent_s_kept_alive_connection_working(http_server):
    # Workers drop the parent's filesystem (and its aiohttp session) they inherited; closing
    # its connections there unregistered the parent's socket from the epoll both share, and
    # the parent's next request waited its whole timeout (then a retry answered).
    url = http_server.put_bytes(bytes(100), "forks-keepalive.bin")
    source = Store(retry=RetryPolicy(attempts=2, timeout=20.0, max_time=60.0)).source(url)
    source.info()  # the parent keeps this connection alive
    loader = torch.utils.data.DataLoader(
        _Reads(source), num_workers=2, multiprocessing_context="fork"
    )
    assert [int(n) for n in loader] == [10] * 4
    start = time.monotonic()
    assert source.info().size == 100  # on the same kept-alive connection
    assert time.monotonic() - start < 5.0
