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


@pytest.mark.slow
def test_mypy_strict_accepts_the_package_and_its_users(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    # The project's own configuration (pyproject.toml: strict, with its two relaxations), so
    # the developers' `mypy wids` and this test cannot disagree.
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(REPO / "pyproject.toml"),
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
