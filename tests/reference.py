"""The reference wids (webdataset==0.2.111), for side-by-side tests: where it is, and a check.

Its import name ``wids`` collides with ours, so it lives in a venv of its own, whose python is
``$WIDS_REFERENCE_PYTHON``; ``tools/test.sh`` (and so CI) makes that venv (``.venv-reference``,
``tools/venv.sh``) and sets the variable. Without the variable the side-by-side tests skip,
saying so; with it, a python that does not import the reference wids is a failure, not a skip.
Run it with ``-I`` (isolated: no ``PYTHONPATH``, current directory or user site), so that it
cannot import this checkout's ``wids``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile

import pytest

ENV_VAR = "WIDS_REFERENCE_PYTHON"
_PROBE = "import torch, wids, wids.wids_specs; print(wids.__file__)"


@functools.cache
def _check(python: str) -> str:
    r = subprocess.run(
        [python, "-I", "-c", _PROBE],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        timeout=300,
    )
    assert r.returncode == 0, f"${ENV_VAR}={python} does not import the reference wids: {r.stderr}"
    return r.stdout.strip()


def reference_python() -> str:
    """The reference venv's python; skips the calling test if the variable is unset."""
    python = os.environ.get(ENV_VAR)
    if not python:
        pytest.skip(f"no reference wids: set ${ENV_VAR} (bash tools/test.sh makes one)")
    _check(python)
    return python
