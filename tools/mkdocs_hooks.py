"""mkdocs hooks (mkdocs.yml ``hooks:``): the CLI reference is generated at build time.

``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; each build replaces it with the
``--help`` of ``wids`` and of every subcommand (found by walking the argument parser), at a
fixed width of 100 columns. The page therefore cannot go stale, and nothing generated is
checked in.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference -->"


def _parsers(
    parser: argparse.ArgumentParser,
) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def cli_reference() -> str:
    """The help of ``wids`` and each subcommand, as Markdown sections."""
    from wids.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse reads the width when it formats
    try:
        parts = [
            f"## `{p.prog}`\n\n```text\n{p.format_help().rstrip()}\n```\n"
            for p in _parsers(build_parser())
        ]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
