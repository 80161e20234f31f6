"""Conventions the library keeps, checked on its source: how it logs and what it prints.

- The library logs through ``logging.getLogger(__name__)`` only, so every record comes from a
  logger under ``wids`` and users configure it as one tree (``logging.getLogger("wids")``).
  It never logs through the root logger, configures logging or adds handlers: that is the
  application's business (the CLI's, in ``wids/cli/``).
- Nothing outside ``wids/cli/`` writes to stdout or stderr (ruff's T20 catches ``print``; this
  catches ``sys.stdout``/``sys.stderr`` writes too).
- ``warnings.warn`` always passes ``stacklevel``, so a warning points at the caller's line.
"""

from __future__ import annotations

import ast
import importlib
import logging
import pkgutil
from pathlib import Path

import wids

PACKAGE = Path(wids.__file__).resolve().parent
_ROOT_CALLS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
_CONFIG_CALLS = {"basicConfig", "addHandler", "removeHandler", "setLevel", "disable"}


def _library_files() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "cli" not in p.relative_to(PACKAGE).parts]


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    where = path.name if PACKAGE not in path.parents else path.relative_to(PACKAGE.parent)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "print":
                found.append(f"{where}:{node.lineno}: print()")
            if not isinstance(func, ast.Attribute):
                continue
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id == "warnings" and func.attr == "warn":
                if not any(k.arg == "stacklevel" for k in node.keywords):
                    found.append(f"{where}:{node.lineno}: warnings.warn() without stacklevel")
            if isinstance(owner, ast.Name) and owner.id == "logging":
                if func.attr == "getLogger":
                    args = node.args
                    if not (
                        len(args) == 1
                        and isinstance(args[0], ast.Name)
                        and args[0].id == "__name__"
                    ):
                        found.append(f"{where}:{node.lineno}: getLogger() not of __name__")
                elif func.attr in _ROOT_CALLS or func.attr in _CONFIG_CALLS:
                    found.append(f"{where}:{node.lineno}: logging.{func.attr}()")
            elif func.attr in _CONFIG_CALLS - {"setLevel"}:
                found.append(f"{where}:{node.lineno}: .{func.attr}()")
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("stdout", "stderr")
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            found.append(f"{where}:{node.lineno}: sys.{node.attr}")
    return found


def test_the_library_logs_only_through_its_module_loggers_and_prints_nothing():
    files = _library_files()
    assert len(files) > 40  # the scan sees the package
    problems = [p for f in files for p in _problems(f)]
    assert problems == []


def test_the_check_sees_what_it_forbids(tmp_path):
    bad = tmp_path / "probe.py"
    text = (
        "import logging, sys\n"
        "log = logging.getLogger('mine')\n"
        "logging.info('x')\n"
        "logging.basicConfig()\n"
        "print('x')\n"
        "sys.stderr.write('x')\n"
        "log.addHandler(logging.NullHandler())\n"
        "import warnings; warnings.warn('x')\n"
    )
    bad.write_text(text)
    found = _problems(bad)
    assert len(found) == 7, found


def test_every_logger_of_the_library_is_under_wids():
    """Each module's logger is named after the module, so all of them hang below ``wids``."""
    names = []
    for info in pkgutil.walk_packages(wids.__path__, "wids."):
        if info.name.startswith("wids.cli") or info.name == "wids.__main__":
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, logging.Logger):
                names.append((info.name, value.name))
    assert len(names) > 5
    assert [(m, n) for m, n in names if n != m] == []
