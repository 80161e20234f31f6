"""Write throughput: wids.ShardWriter against webdataset 1.x's ShardWriter, on the same samples.

Two cases, each written by three writers in fresh processes, in alternating rounds:

- ``bytes``: already-encoded samples (``.jpg`` payloads of random bytes, ``.cls``, ``.json``);
- ``jpeg``: ``uint8`` H×W×3 arrays that both writers encode as JPEG at quality 100
  (webdataset's fixed quality; wids gets ``Encoder(quality=100)``), plus ``.cls`` ints.

Writers: ``wids`` (shards plus a JSON index; every shard fsync'ed and renamed into place, the
index republished after every shard), ``wids-noindex`` (``index=None``: the same tar writing
without recording members or writing an index), and ``webdataset`` (``webdataset.ShardWriter``
1.x, run with the Python of ``--venv``, as ``tools/bench_read.py`` runs the reference wids).
Samples are generated before the clock starts, identically on both sides (same numpy seed);
the clock covers every ``write`` and the final ``close``. Each writer's best of ``--rounds``
rounds is reported, as samples/s and MB/s of shard bytes, with the ratios:
``wids / webdataset`` (goal >= 1.0) and ``wids-noindex / wids`` time (indexing overhead, goal
< 5%).

Set up the peer once (its own venv; torch pinned so pip keeps the CPU wheel)::

    python -m venv /tmp/venv-wds && /tmp/venv-wds/bin/pip install torch==2.13.0
    /tmp/venv-wds/bin/pip install -c <(echo torch==2.13.0) webdataset==1.0.2 pillow

Run::

    python tools/bench_write.py --venv /tmp/venv-wds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run by every writer in a fresh interpreter: argv = writer case n size seed outdir maxcount.
_CHILD = r"""
import json, os, sys, time
import numpy as np

writer, case, n, size, seed, outdir, maxcount = sys.argv[1:8]
n, size, seed, maxcount = int(n), int(size), int(seed), int(maxcount)
rng = np.random.default_rng(seed)
samples = []
if case == "bytes":
    for i in range(n):
        payload = rng.bytes(int(size * rng.uniform(0.5, 1.5)))
        samples.append({"__key__": "%08d" % i, "jpg": payload, "cls": b"%d" % (i % 1000),
                        "json": b'{"i": %d, "label": %d}' % (i, i % 1000)})
else:
    yy, xx = np.mgrid[0:size, 0:size]
    base = np.stack([xx, yy, (xx + yy) // 2], axis=-1).astype(np.int32)
    for i in range(n):
        noise = rng.integers(-20, 21, (size, size, 3))
        img = np.clip(base + noise + (i % 64), 0, 255).astype(np.uint8)
        samples.append({"__key__": "%08d" % i, "jpg": img, "cls": i % 1000})
pattern = os.path.join(outdir, "bench-%06d.tar")
if writer == "webdataset":
    import webdataset as wds
    make = lambda: wds.ShardWriter(pattern, maxcount=maxcount, verbose=0)
else:
    from wids import Encoder, ShardWriter
    index = None if writer == "wids-noindex" else True
    make = lambda: ShardWriter(pattern, maxcount=maxcount, index=index,
                               encoder=Encoder(quality=100))
t0 = time.perf_counter()
sink = make()
for s in samples:
    sink.write(s)
sink.close()
seconds = time.perf_counter() - t0
nbytes = sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir)
             if f.endswith(".tar"))
print(json.dumps({"seconds": seconds, "bytes": nbytes}))
"""

WRITERS = ("wids", "wids-noindex", "webdataset")


def run_writer(writer: str, case: str, args: argparse.Namespace) -> dict | None:
    """One timed run in a fresh process; ``None`` (with a message) if it could not run."""
    outdir = tempfile.mkdtemp(prefix="wids-bench-write-", dir=args.tmp)
    if writer == "webdataset":
        python = os.path.join(args.venv, "bin", "python") if args.venv else ""
        if not os.path.exists(python):
            shutil.rmtree(outdir, ignore_errors=True)
            return None
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    else:
        python = sys.executable
        env = dict(os.environ, PYTHONPATH=REPO)
    n, size = (args.n, args.size) if case == "bytes" else (args.images, args.image_size)
    argv = [writer, case, str(n), str(size), str(args.seed), outdir, str(args.maxcount)]
    try:
        proc = subprocess.run(
            [python, "-c", _CHILD, *argv],
            capture_output=True,
            text=True,
            cwd=outdir,  # a fresh directory: nothing of this checkout shadows the peer
            env=env,
            timeout=3600,
        )
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    if proc.returncode != 0:
        print(f"{writer} {case} failed:\n{proc.stderr[-1500:]}", file=sys.stderr)
        return None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["samples"] = n
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--venv", metavar="VENV", help="venv with webdataset==1.0.2 and pillow")
    p.add_argument("--cases", default="bytes,jpeg", help="comma-separated: bytes, jpeg")
    p.add_argument("--n", type=int, default=20000, help="samples in the bytes case")
    p.add_argument("--size", type=int, default=16000, help="mean .jpg bytes in the bytes case")
    p.add_argument("--images", type=int, default=1500, help="samples in the jpeg case")
    p.add_argument("--image-size", type=int, default=256, help="image side in the jpeg case")
    p.add_argument("--maxcount", type=int, default=1000, help="samples per shard")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; best one counts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp", help="where shards are written (default: the system temp dir)")
    args = p.parse_args(argv)
    if not args.venv:
        print("no --venv given: webdataset is not measured", file=sys.stderr)

    print(f"{'case':6} {'writer':13} {'samples/s':>10} {'MB/s':>8} {'seconds':>8}")
    for case in args.cases.split(","):
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for writer in WRITERS:
                r = run_writer(writer, case, args)
                if r is not None and (writer not in best or r["seconds"] < best[writer]["seconds"]):
                    best[writer] = r
        for writer, r in best.items():
            rate, mbs = r["samples"] / r["seconds"], r["bytes"] / r["seconds"] / 1e6
            print(f"{case:6} {writer:13} {rate:10.0f} {mbs:8.1f} {r['seconds']:8.3f}")
        ours, bare, peer = (best.get(w) for w in WRITERS)
        if ours and peer:
            ratio = peer["seconds"] / ours["seconds"]  # same samples: the ratio of rates
            print(f"{case:6} throughput wids / webdataset: {ratio:.2f}x")
        if ours and bare:
            extra = ours["seconds"] / bare["seconds"] - 1
            print(f"{case:6} indexing overhead (wids vs wids-noindex): {extra * 100:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
