"""``wids.storage.forks``: a fork is noticed without ``os.getpid()``."""

from __future__ import annotations

import os
import pickle

from wids import ShardListDataset
from wids.storage import forks


def test_a_forked_child_and_grandchild_see_a_new_generation():
    made = forks.stamp()
    assert forks.generation == made
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            answer = [forks.generation != made]
            again = forks.stamp()
            grand = os.fork()
            if grand == 0:
                os._exit(0 if forks.generation not in (made, again) else 1)
            answer.append(os.waitpid(grand, 0)[1] == 0)
            os.write(w, repr(answer).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    assert answer == "[True, True]"
    assert forks.generation == made  # the parent's is its own


def test_an_unpickled_dataset_is_this_process_s(tmp_path):
    ds = ShardListDataset([{"url": str(tmp_path / "a.tar"), "nsamples": 1}])
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._made == forks.generation
