"""torchdata's StatefulDataLoader with ChunkedSampler and 2 workers: a checkpoint taken after a
few batches resumes in a new process with exactly the rest of the epoch, in the same order, for
fork and spawn workers. The processes are tests/stateful_job.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_frameworks import N, write_shards

JOB = Path(__file__).with_name("stateful_job.py")
STEPS, BATCH = 5, 4


def phase(shards: Path, context: str, name: str) -> dict:
    root = shards.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(JOB.parent.parent)}
    cmd = [sys.executable, str(JOB), str(shards), str(root), context, name]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((root / f"{name}-{context}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_checkpoint_resumes_in_a_new_process_with_the_rest_of_the_epoch(tmp_path, context):
    shards = write_shards(tmp_path)
    saved = phase(shards, context, "save")
    resumed = phase(shards, context, "resume")
    assert len(saved["before"]) == STEPS
    assert resumed["before"] == []
    assert resumed["after"] == saved["after"]  # the same batches, in the same order
    seen = [i for batch in saved["before"] + resumed["after"] for i in batch]
    assert sorted(seen) == list(range(N))  # and together exactly one epoch
    assert seen != list(range(N))  # a shuffled epoch, so the order carries information
