"""Type hints: ``mypy --strict`` accepts the package and code that uses its public API.

``tests/typing_user.py`` is written as a user writes code against wids (annotated datasets,
samplers in a DataLoader, writers, an index written with known offsets, typed errors); it is
checked together with the whole package in one mypy run, and also run, so that what mypy
accepts is code that works.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The relaxations: calls into third-party packages that ship no type hints (dask's
# ``distributed``) are untyped whoever makes them. ``wids.sampler.distributed`` picks its base
# class when imported (torch's ``DistributedSampler``, or ``object`` without torch): the base
# cannot carry type arguments, and an ignore there is needed in one environment only.
STRICT_CONFIG = """\
[mypy]
python_version = 3.11
strict = True
ignore_missing_imports = True
untyped_calls_exclude = distributed

[mypy-wids.sampler.distributed]
warn_unused_ignores = False
disallow_any_generics = False
"""


def test_mypy_strict_accepts_the_package_and_its_users(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    config = tmp_path / "mypy.ini"
    config.write_text(STRICT_CONFIG)
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(config),
        "--cache-dir",
        str(tmp_path / "cache"),
        "wids",
        "tests/typing_user.py",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert (REPO / "wids" / "py.typed").is_file()


def test_the_typed_user_code_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "tests/typing_user.py", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
