"""Start-up of the ``wids`` command: each goal of issue 22 as a ratio, one run.

Times, as fresh processes (``python -m wids ...``, wall clock, one run each):

- ``wids --help`` and ``wids index info`` of a local JSON index: goal <= 0.2 s;
- ``wids show INDEX -n 1`` over local shards: goal <= 0.5 s (no torch);
- ``wids index create`` of 32 local shards: goal within 1.5x of ``build_index`` of the same
  shards called in a process that has wids imported already (the in-process figure, measured
  here right before).

``python -c pass`` is timed too: the interpreter's own start, the floor under every command on
this machine; and ``python -c "import numpy"``, the floor under every command that reads an
index (member tables are numpy arrays). Prints a Markdown table (seconds, the goal, the ratio
to the goal, and the ratio to the floor); on a shared machine compare ratios from one run, not
seconds.

Usage: python tools/bench_startup.py [--shards 32] [--per-shard 100]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _timed(argv: list[str], cwd: str) -> float:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {r.stderr[-2000:]}")
    return seconds


def _wids(*args: str) -> list[str]:
    return [sys.executable, "-m", "wids", *args]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--per-shard", type=int, default=100)
    args = ap.parse_args()

    sys.path.insert(0, str(REPO))
    from wids import build_index
    from wids.synth import write_dataset

    with tempfile.TemporaryDirectory(prefix="wids-bench-startup-") as tmp:
        shards = write_dataset(
            tmp, shards=args.shards, samples_per_shard=args.per_shard, real_images=False,
            jpg_bytes=2000,
        )  # fmt: skip
        index = os.path.join(tmp, "train.json")
        build_index(shards, index, progress=False)  # warms this process and the page cache
        t0 = time.perf_counter()
        build_index(shards, os.path.join(tmp, "inproc.json"), progress=False, incremental=False)
        in_process = time.perf_counter() - t0

        floor = _timed([sys.executable, "-c", "pass"], tmp)
        numpy_floor = _timed([sys.executable, "-c", "import numpy"], tmp)
        rows = [
            ("`wids --help`", _timed(_wids("--help"), tmp), 0.2),
            ("`wids index info train.json`", _timed(_wids("index", "info", index), tmp), 0.2),
            ("`wids show train.json -n 1`", _timed(_wids("show", index, "-n", "1"), tmp), 0.5),
        ]
        create = _timed(_wids("index", "create", *shards, "-o", "cli.json", "-q", "--full"), tmp)
        rows.append((f"`wids index create` ({args.shards} local shards)", create, 1.5 * in_process))

    print(f"python -c pass: {floor:.3f} s; python -c 'import numpy' (which reading any index "
          f"needs): {numpy_floor:.3f} s; in-process build_index of {args.shards} shards: "
          f"{in_process:.3f} s")  # fmt: skip
    print()
    print("| command | seconds | goal | ratio to goal | ratio to `python -c pass` |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, seconds, goal in rows:
        print(f"| {name} | {seconds:.3f} | {goal:.3f} | {seconds / goal:.2f} | "
              f"{seconds / floor:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
