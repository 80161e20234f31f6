"""Options and value parsers shared by the ``wids`` subcommands.

Environment variables only supply defaults, here, and every one is named in ``--help``
(:data:`EPILOG_ENV`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = [
    "EPILOG_ENV",
    "allow_local_flag",
    "default_cache_dir",
    "human",
    "parse_duration",
    "parse_size",
    "parse_storage_options",
    "parse_url_map",
    "storage_flag",
    "url_map_flag",
]

EPILOG_ENV = """environment (defaults only; flags win):
  WIDS_CACHE_DIR   default --cache-dir (else the per-user cache directory, ~/.cache/wids)
"""


def default_cache_dir() -> str:
    """``$WIDS_CACHE_DIR``, else the per-user cache directory (``$XDG_CACHE_HOME/wids``)."""
    env = os.environ.get("WIDS_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "wids")


def parse_storage_options(items: Sequence[str] | None) -> dict[str, Any]:
    """``key=value`` pairs to a dict; values are parsed as JSON when they parse, else strings.

    Dotted keys nest: ``client_kwargs.endpoint_url=http://...``. A key that starts with an
    origin is an option for that origin only: ``https://host:8443/headers.Authorization=...``
    (or ``https://host:8443={"headers": {...}}``).
    """
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--storage-option wants key=value, not {item!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        if "://" in key:  # an origin's own options: its host's dots do not nest
            scheme, _, rest = key.partition("://")
            netloc, slash, key = rest.partition("/")
            node = out.setdefault(f"{scheme}://{netloc}", {})
            if not slash or not key:
                node.update(value if isinstance(value, dict) else {})
                if not isinstance(value, dict):
                    raise argparse.ArgumentTypeError(f"{item!r}: an origin's options are a dict")
                continue
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def storage_flag(p: argparse.ArgumentParser) -> None:
    """Add ``-s/--storage-option KEY=VALUE`` (see :func:`parse_storage_options`)."""
    p.add_argument(
        "-s",
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help=(
            "fsspec storage option (repeatable; dotted keys nest, values parse as JSON); "
            "credentials go only to the servers of the URLs you name: give another server "
            "its own with a key that starts with its origin, "
            "e.g. 'https://cdn.example/headers.Authorization=Bearer ...'"
        ),
    )


def parse_url_map(items: Sequence[str] | None) -> dict[str, str]:
    """``OLD=NEW`` prefix pairs (the first ``=`` separates) to a ``url_map`` dict."""
    out: dict[str, str] = {}
    for item in items or ():
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise argparse.ArgumentTypeError(f"--url-map wants OLD=NEW, not {item!r}")
        out[old] = new
    return out


def url_map_flag(p: argparse.ArgumentParser) -> None:
    """Add ``--url-map OLD=NEW`` (see :func:`parse_url_map`)."""
    p.add_argument(
        "--url-map",
        action="append",
        metavar="OLD=NEW",
        help="read shards whose URL starts with OLD from NEW instead: a mirror or proxy with the "
        "same bytes (repeatable; the longest matching OLD wins)",
    )


def allow_local_flag(p: argparse.ArgumentParser) -> None:
    """Add ``--allow-local-shards``."""
    p.add_argument(
        "--allow-local-shards",
        action="store_true",
        help="let an index read from a remote location (http, s3, gs ...) name local files; "
        "refused by default, so a crafted index cannot read your files",
    )


def human(n: float) -> str:
    """A byte count for people: ``"512 B"``, ``"1.5 MB"`` (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``"500M"``, ``"10GB"``, ``"1.5GiB"``, ``"1000"`` (bytes) to a number of bytes."""
    import re

    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500M, 10G, 1.5GiB)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_duration(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``, ``"2w"`` to seconds; a unit is required."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    if m and not m.group(2):
        raise argparse.ArgumentTypeError(
            f"{text.strip()!r} has no unit: write {m.group(1)}s, {m.group(1)}m, "
            f"{m.group(1)}h or {m.group(1)}d"
        )
    if not m or m.group(2).lower() not in _TIME_UNITS:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 7d, 12h, 30m, 90s)")
    return float(m.group(1)) * _TIME_UNITS[m.group(2).lower()]
