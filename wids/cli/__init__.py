"""The ``wids`` command.

Each subcommand is a module of this package (:mod:`.index`, :mod:`.subset`, :mod:`.cache`,
:mod:`.show`) whose ``register(subparsers)`` adds its parser and sets ``func``; the flags and
value parsers they share are in :mod:`.options`. Errors reach the user as one line
(``--debug`` shows the traceback). Environment variables only supply defaults, and every one
is named in ``--help``.

Everything the command prints, and every log line (wids' and, with ``--debug``, those of
fsspec, s3fs, gcsfs, aiohttp, botocore and urllib3), passes through :mod:`wids.storage.redact`:
credentials never reach the terminal, and control characters from shards are escaped.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..storage import RedactingFilter, escape_controls, redact_text
from . import cache, index, show, subset
from .options import EPILOG_ENV, parse_storage_options

__all__ = ["build_parser", "main"]

_SUBCOMMANDS = (index.register, subset.register, cache.register, show.register)


def build_parser() -> argparse.ArgumentParser:
    """The ``wids`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="wids",
        description="Random access to WebDataset tar shards on any fsspec filesystem.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG_ENV,
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show tracebacks and debug logs (also fsspec's, botocore's ...; credentials redacted)",
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


class _Version(argparse.Action):
    """``--version``, looking the version up only when asked (package metadata: start-up time)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(kwargs.get("help")))

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"wids {_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def _version() -> str:
    from .. import __version__

    return str(__version__)


# Libraries whose loggers --debug turns on; their records carry URLs, headers and signatures.
_LIBRARY_LOGGERS = ("fsspec", "s3fs", "gcsfs", "aiohttp", "botocore", "urllib3")


def _secrets_of(args: argparse.Namespace) -> list[str]:
    given = getattr(args, "storage_option", None)
    if not given:  # the usual case, without importing the storage layer (start-up time)
        return []
    from ..storage import Store

    try:
        return Store(parse_storage_options(given)).secrets()
    except argparse.ArgumentTypeError:
        return []


def _start_logging(debug: bool, secrets: Sequence[str]) -> tuple[logging.Handler, int]:
    """A redacting stderr handler on the root logger; returns it and the old root level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("wids: %(levelname)s: %(name)s: %(message)s"))
    # On the handler, not the loggers: a logger's filters skip its children's records.
    handler.addFilter(RedactingFilter(secrets))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    if debug:
        for name in _LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.DEBUG)
    return handler, old_level


def _shadowed_by() -> str | None:
    """The file of another package that ``import wids`` found instead of this one, or None.

    The reference wids (PyPI's ``wids``, or webdataset 0.2.x) has the same import name, and pip
    installs either over the other without a word: ``import wids`` may then give the reference's
    ``__init__`` while ``wids.cli`` is still this package's, a mixture that half works.
    """
    top = sys.modules.get("wids")
    if top is not None and "write_index" in getattr(top, "__all__", ()):
        return None
    return getattr(top, "__file__", None) or "a folder without __init__.py"


def _in_cli_terms(e: Exception) -> Exception:
    """An error whose advice names Python arguments, reworded with the command's flags."""
    from ..errors import SampleLayoutError

    if not isinstance(e, SampleLayoutError) or not (e.policies or e.sortable):
        return e
    advice = []
    if e.policies:
        flags = " or ".join(f"--duplicates {p}" for p in e.policies)
        advice.append(f"index it with wids index create {flags} to accept this")
    if e.sortable:
        advice.append("write the tar sorted by name (tar --sort=name)")
    return SampleLayoutError(f"{e.problem}; {', or '.join(advice)}", shard=e.shard)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so nothing left in its buffer fails again at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (captured): nothing is flushed to a pipe
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``wids`` command; returns the exit status."""
    import traceback

    shadow = _shadowed_by()
    if shadow is not None:
        print(
            f"wids: error: `import wids` finds another package ({shadow}), probably the reference"
            " wids installed beside or over this one: pip uninstall -y wids wids-shards, then"
            " reinstall wids-shards from its repository (docs/install.md)",
            file=sys.stderr,
        )
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    secrets = _secrets_of(args)
    handler, old_level = _start_logging(args.debug, secrets)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
        return status
    except KeyboardInterrupt:
        print("wids: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # wids ... | head: stop quietly, as other Unix tools do
        _drop_stdout()
        return 128 + 13  # what a shell reports for a command ended by SIGPIPE
    except Exception as e:  # one clear line unless --debug
        if args.debug:
            trace = redact_text(traceback.format_exc(), secrets).splitlines()
            print("\n".join(escape_controls(line) for line in trace), file=sys.stderr)
        from ..errors import IndexFormatError
        from ..index import with_repair_hint

        if isinstance(e, IndexFormatError):
            e = with_repair_hint(e)
        e = _in_cli_terms(e)
        text = escape_controls(redact_text(str(e) or type(e).__name__, secrets))
        print(f"wids: error: {text}", file=sys.stderr)
        return 2
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(old_level)
