#!/usr/bin/env python
"""Regenerate the README's CLI reference from ``wids ... --help``.

Rewrites the text between ``<!-- cli-reference:start -->`` and ``<!-- cli-reference:end -->``
in README.md with the help of every subcommand (found by walking the argument parser), at a
fixed width of 100 columns.

Usage: python tools/readme_cli.py [--check]   (--check: exit 1 if the README is out of date)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from wids.cli import build_parser

START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def _paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _paths(sub, (*prefix, name))


def reference() -> str:
    env = {**os.environ, "COLUMNS": "100"}
    parts = []
    for path in _paths(build_parser()):
        out = subprocess.run(
            [sys.executable, "-m", "wids", *path, "--help"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        parts.append(f"### `{' '.join(('wids', *path))}`\n\n```text\n{out.rstrip()}\n```\n")
    return "\n".join(parts)


def main() -> int:
    readme = Path(__file__).resolve().parent.parent / "README.md"
    text = readme.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n\n{reference()}\n{END}{tail}"
    if "--check" in sys.argv[1:]:
        return 0 if new == text else 1
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
