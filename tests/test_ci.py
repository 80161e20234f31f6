"""tools/test.sh (the README's test command, CI's entry point) installs every pytest plugin its
own pytest command line needs, so a fresh machine runs the suite as the developers do."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
# pytest options -> the distribution that provides them
PLUGIN_OPTIONS = {
    "-n": "pytest-xdist",
    "--dist": "pytest-xdist",
    "--no-loadscope-reorder": "pytest-xdist",
    "--timeout": "pytest-timeout",
}


def _pytest_args() -> list[str]:
    lines = [
        line
        for line in (ROOT / "tools" / "test.sh").read_text().splitlines()
        if re.match(r"\s*python -m pytest\b", line)
    ]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[3:]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def test_test_sh_runs_two_xdist_workers_a_file_each_and_lists_skips():
    args = _pytest_args()
    assert args[:6] == ["-q", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
    assert "-rs" in args  # every skipped test and its reason, in the summary
    assert args[-1] == "$@"  # the caller's options come last, so `-n 0` overrides


def test_the_test_extra_installs_the_plugins_test_sh_uses_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    test_extra = {_name(r) for r in project["optional-dependencies"]["test"]}
    pinned = {
        _name(line)
        for line in (ROOT / "tools" / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    used = {PLUGIN_OPTIONS[a] for a in _pytest_args() if a in PLUGIN_OPTIONS}
    assert "pytest-xdist" in used
    assert used <= test_extra
    assert used <= pinned


class _Item:
    def __init__(self, path: str, slow: bool) -> None:
        self.path, self.slow = path, slow

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def test_files_with_a_slow_test_come_first_each_in_its_own_order():
    from ordering import slow_files_first

    items = [_Item("a", False), _Item("b", False), _Item("b", True), _Item("c", False)]
    items += [_Item("d", True), _Item("d", False), _Item("a", False)]
    order = [(i.path, i.slow) for i in items]
    slow_files_first(items)
    assert [(i.path, i.slow) for i in items] == [order[k] for k in (1, 2, 4, 5, 0, 3, 6)]


def test_the_scripts_install_into_a_venv_of_the_checkout_not_the_python_on_path(tmp_path):
    """tools/venv.sh makes the venv with $PYTHON and puts it first on PATH; with a stamp that
    matches (what a finished install leaves), a second run installs nothing."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    script = f"""
        set -euo pipefail
        . tools/venv.sh
        _wids_make_venv {venv}
        _wids_stamp "$WIDS_TORCH" all > {venv}/.wids-installed
        wids_venv all
        command -v python
        python -c 'import sys; print(sys.prefix)'
    """
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "WIDS_VENV": str(venv)}
    r = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(venv / "bin" / "python"), str(venv)]
    assert "installing" not in r.stderr  # the stamp matched: no pip run
    for script_name in ("test.sh", "demo.sh"):
        text = (ROOT / "tools" / script_name).read_text()
        assert ". tools/venv.sh" in text and "pip install" not in text
