"""``wids`` refuses to run when ``import wids`` finds the reference wids instead of this package.

Both distributions install a top-level ``wids`` folder, and pip installs one over the other
without a word (docs/install.md). Here the real reference (its source archive, the one
``tools/test.sh`` downloads into ``.venv-reference``) is laid over a copy of this package, as
pip leaves ``site-packages/wids/`` after ``pip install wids`` on top of ``wids-shards``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import wids

OURS = Path(wids.__file__).resolve().parent


def _run_cli(site: Path) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.path.insert(0, {str(site)!r}); from wids.cli import main; "
    code += "sys.exit(main(['--help']))"
    # -I: no PYTHONPATH, current directory or user site; this site folder comes first
    return subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=site, timeout=300
    )


def test_the_cli_names_the_other_package_and_how_to_fix_it(tmp_path: Path) -> None:
    archive = os.environ.get("WIDS_REFERENCE_TESTS", "")
    if not archive.endswith(".tar.gz"):
        pytest.skip("no reference source archive: $WIDS_REFERENCE_TESTS (bash tools/test.sh)")
    pytest.importorskip("braceexpand")  # the reference's __init__ imports it (and torch)
    pytest.importorskip("torch")
    site = tmp_path / "site"
    shutil.copytree(OURS, site / "wids", ignore=shutil.ignore_patterns("__pycache__"))
    assert _run_cli(site).returncode == 0  # this package alone: the help, exit 0
    laid = 0
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts  # wids-0.1.11/src/wids/__init__.py, ...
            if member.isfile() and parts[1:3] == ("src", "wids") and len(parts) == 4:
                data = tar.extractfile(member)
                assert data is not None
                (site / "wids" / parts[3]).write_bytes(data.read())
                laid += 1
    assert laid >= 5
    r = _run_cli(site)
    assert r.returncode == 2, r.stdout[-500:] + r.stderr[-2000:]
    assert r.stdout == ""
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("wids: error: `import wids` finds another package (")
    assert str(site / "wids" / "__init__.py") in line and "pip uninstall -y wids" in line
