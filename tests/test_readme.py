"""The README stays true: its CLI reference is the CLI's help, and the tests it cites exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_cli_reference_is_the_current_help() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "readme_cli.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, "README's CLI reference is stale: run python tools/readme_cli.py"


def test_cited_tests_exist() -> None:
    """Every ``tests/FILE.py::name`` (and following ``::name``) the README cites is a test."""
    cited: list[tuple[str, str]] = []
    for m in re.finditer(r"`(tests/[\w/]+\.py)((?:::[\w\[\]-]+)?)`|`::([\w\[\]-]+)`", README):
        if m.group(1):
            current = m.group(1)
            if m.group(2):
                cited.append((current, m.group(2)[2:]))
        else:
            cited.append((current, m.group(3)))
    assert len(cited) > 10
    for path, name in cited:
        source = (ROOT / path).read_text()
        stem = name.split("[")[0].rstrip("*")
        assert re.search(rf"^(?:async )?def {re.escape(stem)}", source, re.M), f"{path}::{name}"
