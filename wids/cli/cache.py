"""``wids cache``: list, size and clean the local shard cache."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..storage import escape_controls, redact_url
from .options import (
    EPILOG_ENV,
    default_cache_dir,
    human,
    parse_duration,
    parse_size,
    parse_storage_options,
    storage_flag,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``wids cache`` (ls, du, clean) to the subcommands."""
    p = sub.add_parser(
        "cache",
        help="list, size and clean the local shard cache",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  wids cache ls\n  wids cache du\n"
        "  wids cache clean --older-than 7d\n  wids cache clean --max-size 50G\n\n" + EPILOG_ENV,
    )
    _cache_dir_flag(p, default=None)
    csub = p.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter
    ls = csub.add_parser(
        "ls",
        help="cached shards, least recently used first",
        formatter_class=fmt,
        epilog="example:\n  wids cache ls --cache-dir /data/wids-cache --json\n",
    )
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument(
        "--index",
        help="mark the copies that are not the version this index records (STALE: a dataset "
        "over it fetches them again)",
    )
    storage_flag(ls)
    du = csub.add_parser(
        "du",
        help="bytes and entries in the cache",
        formatter_class=fmt,
        epilog="example:\n  wids cache du\n",
    )
    cl = csub.add_parser(
        "clean",
        help="remove entries not in use (all of them if no option), and abandoned downloads",
        formatter_class=fmt,
        epilog="examples:\n  wids cache clean --older-than 7d\n  wids cache clean --max-size 50G\n",
    )
    cl.add_argument(
        "--older-than",
        type=parse_duration,
        help="not used for this long; a unit is required: 90s, 30m, 12h, 7d, 2w",
    )
    cl.add_argument("--max-size", type=parse_size, help="evict LRU entries down to: 50G, 500M")
    for each in (ls, du, cl):  # after the subcommand too: wids cache du --cache-dir X
        _cache_dir_flag(each, default=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_cache)


def _cache_dir_flag(p: argparse.ArgumentParser, default: Any) -> None:
    # a subcommand's copy defaults to SUPPRESS, so it sets the value only when given
    p.add_argument(
        "--cache-dir",
        default=default,
        help="the cache directory (default: $WIDS_CACHE_DIR or the per-user cache directory); "
        "before or after the subcommand",
    )


def _cmd_cache(args: argparse.Namespace) -> int:
    from ..cache import MARKER, ShardCache, cache_state
    from ..errors import CacheDirError

    cache = ShardCache(args.cache_dir or default_cache_dir())
    root = cache.cache_dir
    state = cache_state(root)
    if state == "unmarked":
        raise CacheDirError(
            f"{root} is not a wids cache (no {MARKER}): nothing to list, and wids will not "
            "clean it; check --cache-dir"
        )
    if state != "marked":
        what = "does not exist" if state == "missing" else "is empty"
        as_json = args.cache_command == "ls" and args.json
        print(f"no cache: {root} {what}", file=sys.stderr if as_json else sys.stdout)
        if as_json:
            print("[]")
        return 0
    if args.cache_command == "ls":
        return _cache_ls(cache, args.json, _stale(cache, args))
    if args.cache_command == "du":
        print(_cache_du(cache))
        return 0
    before = cache.total_bytes()
    removed = cache.clean(older_than=args.older_than, max_bytes=args.max_size)
    left = cache.total_bytes()
    print(
        f"removed {len(removed)} shards, freed {human(before - left)}; {human(left)} left "
        "(member tables in scans/, index copies in indexes/ and md5s of copied shards in "
        "digests/ are kept)"
    )
    return 0


def _stale(cache: Any, args: argparse.Namespace) -> dict[str, str]:
    """The entries that are not the version ``--index`` records (none without it)."""
    if args.index is None:
        return {}
    from ..dataset.compressed import cache_versions
    from ..index import count_shards, open_index, shard_getter
    from ..storage import Store

    idx = open_index(args.index, Store(parse_storage_options(args.storage_option)))
    get = shard_getter(idx)
    shards = (get(k) for k in range(count_shards(idx)))
    stale: dict[str, str] = cache.stale(
        v for i in shards for v in cache_versions(i.url, i.fingerprint)
    )
    return stale


def _cache_ls(cache: Any, as_json: bool, stale: dict[str, str]) -> int:
    import time

    entries = cache.entries()
    if as_json:
        rows = [{k: getattr(e, k) for k in e.__slots__} for e in entries]
        for row in rows:
            row["stale"] = stale.get(str(row["url"]))
        print(json.dumps(rows, indent=2))
        return 0
    if not entries:
        print(f"no cached shards in {cache.cache_dir}")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_access))
        version = f"etag {e.etag}" if e.etag else "no etag"
        if not e.etag and e.mtime is not None:
            version = "modified " + time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.mtime))
        mark = f"  STALE ({stale[e.url]})" if e.url in stale else ""
        # a URL (from an index) may hold escape sequences: shown escaped, like everything else
        print(
            f"{when}  {human(e.size):>9}  {escape_controls(redact_url(e.url))}  "
            f"[{escape_controls(version)}]{escape_controls(mark)}"
        )
    return 0


def _cache_du(cache: Any) -> str:
    from ..cache import count_files

    parts = [f"{human(cache.total_bytes())} in {len(cache.entries())} shards"]
    for sub, what in (
        ("scans", "member tables"),
        ("indexes", "index copies"),
        ("digests", "md5s of copied shards"),
    ):
        n, nbytes = count_files(cache.cache_dir, sub)
        if n:
            parts.append(f"{human(nbytes)} in {n} {what}")
    return f"{', '.join(parts)}  {cache.cache_dir}"
