"""Optional extras stay optional: the core works with torch, s3fs, gcsfs and Pillow unimportable.

Each check runs in a fresh interpreter whose ``sitecustomize`` puts a ``sys.meta_path`` finder in
front of every other, refusing those packages (as if ``pip install wids-shards`` had installed
the core only). The command line runs the same way, through ``python -m wids``. What needs an
extra fails with an ``ImportError`` that names it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCKED = ("torch", "s3fs", "gcsfs", "PIL", "aiohttp", "msgpack", "distributed")

_SITECUSTOMIZE = f"""
import sys


class _OptionalExtrasAbsent:
    blocked = {BLOCKED!r}

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None


sys.meta_path.insert(0, _OptionalExtrasAbsent())
"""

_CORE = r"""
import json, os, pickle, sys

import wids

out = sys.argv[1]
report = {"loaded": sorted(m for m in ("torch", "PIL", "s3fs", "gcsfs") if m in sys.modules)}
try:
    import torch  # noqa: F401
except ImportError:
    report["torch_blocked"] = True

shards = []
for s in range(2):
    path = os.path.join(out, f"core-{s:06d}.tar")
    with wids.TarWriter(path, encoder=False) as w:
        for i in range(4):
            w.write({"__key__": f"{s}{i:05d}", "txt": f"text {s} {i}".encode(),
                     "cls": str(i).encode(), "jpg": b"\xff\xd8not really a jpeg"})
    shards.append(path)
for suffix in (".json", ".sqlite"):
    wids.build_index(shards, os.path.join(out, "core" + suffix))

ds = wids.ShardListDataset[dict](os.path.join(out, "core.sqlite"), transformations=[])
ds = pickle.loads(pickle.dumps(ds))
report["raw"] = [ds[i][".txt"].decode() for i in range(len(ds))]
order = list(wids.ChunkedSampler(ds, chunksize=3, seed=1))
ranks = [list(wids.DistributedChunkedSampler(ds, num_replicas=2, rank=r)) for r in (0, 1)]
report["sampled"] = [sorted(order), sorted(ranks[0] + ranks[1])]

no_jpg = lambda s: {k: v for k, v in s.items() if k != ".jpg"}  # noqa: E731
text = wids.ShardListDataset(os.path.join(out, "core.json"), transformations=[no_jpg, "PIL"])
report["decoded"] = [text[5][".txt"], text[5][".cls"]]


def error_of(f):
    try:
        f()
    except ImportError as e:
        return str(e)
    return None


report["image"] = error_of(lambda: wids.ShardListDataset(os.path.join(out, "core.json"))[0])
report["add"] = error_of(lambda: ds + ds)
report["s3"] = error_of(lambda: wids.open_index("s3://bucket/train.json"))
report["gs"] = error_of(lambda: wids.open_index("gs://bucket/train.json"))
report["loaded_after"] = sorted(m for m in ("torch", "PIL", "s3fs", "gcsfs") if m in sys.modules)
print(json.dumps(report))
"""


@pytest.fixture
def blocked_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def test_the_core_works_without_torch_s3fs_gcsfs_or_pillow(blocked_env, tmp_path):
    r = _run(["-c", _CORE, str(tmp_path)], blocked_env, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["loaded"] == [] and got["loaded_after"] == [] and got["torch_blocked"]
    assert got["raw"] == [f"text {s} {i}" for s in range(2) for i in range(4)]
    assert got["sampled"] == [list(range(8)), list(range(8))]
    assert got["decoded"] == ["text 1 1", 1]
    assert "field '.jpg': decoding images needs Pillow" in got["image"]
    assert install("image") in got["image"]
    assert "ds1 + ds2 needs torch" in got["add"] and install("torch") in got["add"]
    assert install("s3") in got["s3"]
    assert install("gcs") in got["gs"]


def install(extra: str) -> str:
    """What every "needs an extra" error says: the extra, and how to install it from a clone."""
    return (
        f"install the '{extra}' extra of wids-shards: pip install -e '.[{extra}]' in a clone of "
        "its repository (it is not on the package index)"
    )


_EVERY_EXTRA = r"""
import json, sys
import numpy
import wids
import wids.show

shard, port = sys.argv[1], sys.argv[2]


def error_of(f):
    try:
        f()
    except ImportError as e:
        return str(e)
    except Exception as e:
        return f"not an ImportError: {type(e).__name__}: {e}"
    return None


def write(field, value):
    with wids.TarWriter(shard, encoder=wids.Encoder(allow_pickle=True)) as w:
        w.write({"__key__": "a", field: value})


url = f"http://127.0.0.1:{port}/train.json"
report = {
    "http_dataset": error_of(lambda: len(wids.ShardListDataset(url))),
    "http_index": error_of(lambda: wids.build_index([f"http://127.0.0.1:{port}/a.tar"], "x.json")),
    "http_glob": error_of(lambda: wids.build_index([f"http://127.0.0.1:{port}/*.tar"], "y.json")),
    "https_index": error_of(lambda: wids.open_index(f"https://127.0.0.1:{port}/t.json")),
    "encode_image": error_of(lambda: write("jpg", numpy.zeros((4, 4, 3), dtype="uint8"))),
    "encode_msgpack": error_of(lambda: write("msgpack", {"a": 1})),
    "encode_torch": error_of(lambda: write("pth", {"a": 1})),
    "grid": error_of(lambda: wids.show.render_grid([{".jpg": b"x"}], "g.png")),
}
print(json.dumps(report))
"""


def test_every_optional_import_names_its_extra(blocked_env, tmp_path):
    """http(s):// globs without aiohttp, encoding without Pillow/msgpack/torch, the grid without
    PIL."""
    from serverfixtures import free_port

    shard = tmp_path / "w.tar"
    r = _run(["-c", _EVERY_EXTRA, str(shard), str(free_port())], blocked_env, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # plain http(s):// reads, stats and whole files go over wids' own client: nothing is
    # missing, the (absent) server is (test_dataset_remote.py reads a dataset without aiohttp)
    for case in ("http_dataset", "http_index", "https_index"):
        assert got[case].startswith("not an ImportError: RetriesExhaustedError"), case
        assert "127.0.0.1" in got[case] and "Connection refused" in got[case], case
    assert "needs aiohttp" in got["http_glob"] and install("http") in got["http_glob"]
    assert "encoding JPEG images needs Pillow" in got["encode_image"]
    assert install("image") in got["encode_image"]
    assert "encoding msgpack needs msgpack" in got["encode_msgpack"]
    assert install("msgpack") in got["encode_msgpack"]
    assert "needs torch" in got["encode_torch"] and install("torch") in got["encode_torch"]
    assert "wids show --grid) needs Pillow" in got["grid"] and install("image") in got["grid"]


def test_the_command_line_names_the_extras_too(blocked_env, tmp_path):
    shard = tmp_path / "g-000000.tar"
    make = (
        "import sys, wids\n"
        "with wids.TarWriter(sys.argv[1], encoder=False) as w:\n"
        "    w.write({'__key__': '000000', 'jpg': b'not a jpeg', 'cls': b'1'})\n"
    )
    assert _run(["-c", make, str(shard)], blocked_env, tmp_path).returncode == 0
    grid = _run(["-m", "wids", "show", str(shard), "--grid", "g.png"], blocked_env, tmp_path)
    assert grid.returncode == 2 and "needs Pillow" in grid.stderr
    assert install("image") in grid.stderr and "Traceback" not in grid.stderr
    dask = ["-m", "wids", "index", "create", str(shard), "-o", "d.json", "--dask", "tcp://x:1"]
    r = _run(dask, blocked_env, tmp_path)
    assert r.returncode == 2 and "--dask needs dask.distributed" in r.stderr
    assert install("dask") in r.stderr


def test_the_command_line_indexes_without_the_extras(blocked_env, tmp_path):
    shard = tmp_path / "cli-000000.tar"
    make = (
        "import sys, wids\n"
        "with wids.TarWriter(sys.argv[1], encoder=False) as w:\n"
        "    for i in range(3):\n"
        "        w.write({'__key__': f'{i:06d}', 'txt': b'x'})\n"
    )
    assert _run(["-c", make, str(shard)], blocked_env, tmp_path).returncode == 0
    out = tmp_path / "cli.json"
    r = _run(["-m", "wids", "index", "create", str(shard), "-o", str(out)], blocked_env, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 shards, 3 samples" in r.stdout or "3 samples" in r.stdout
    info = _run(["-m", "wids", "index", "info", str(out)], blocked_env, tmp_path)
    assert info.returncode == 0, info.stderr[-3000:]
    check = "import sys; import wids.cli; print(sorted(set(sys.modules) & {'torch', 'PIL'}))"
    assert _run(["-c", check], blocked_env, tmp_path).stdout.strip() == "[]"


def test_the_blocker_blocks(blocked_env, tmp_path):
    """The checks above are worth something only if the packages really are unimportable."""
    code = "import importlib, sys\n" + "".join(
        f"try:\n    importlib.import_module({m!r})\nexcept ImportError:\n    pass\n"
        f"else:\n    sys.exit({m!r} + ' imported')\n"
        for m in BLOCKED
    )
    r = _run(["-c", code], blocked_env, tmp_path)
    assert r.returncode == 0, r.stderr
