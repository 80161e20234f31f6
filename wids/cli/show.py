"""``wids show``: print a table of samples or draw them in a grid image."""

from __future__ import annotations

import argparse

from .options import (
    allow_local_flag,
    default_cache_dir,
    parse_storage_options,
    parse_url_map,
    storage_flag,
    url_map_flag,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``wids show`` to the subcommands."""
    p = sub.add_parser(
        "show",
        help="print a table of samples (key, fields, label) or draw them in a grid image",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  wids show data/train.json                      # first 16 samples as a table\n"
        "  wids show data/train.json --grid grid.png -n 25 --start 1000\n"
        "  wids show s3://bucket/train.json -n 5 -s anon=true\n"
        "  wids show s3://bucket/train.json --offline --cache-dir ~/.cache/wids   # no network\n",
    )
    p.add_argument("index", help="path/URL of an index or dataset description")
    p.add_argument("--grid", metavar="OUT.png", help="draw images with key and label to this file")
    p.add_argument("-n", type=int, default=16, help="number of samples (default 16)")
    p.add_argument(
        "--start", type=int, default=0, help="first sample (default 0; negative: from the end)"
    )
    p.add_argument("--cell", type=int, default=160, help="grid tile size in pixels (default 160)")
    p.add_argument(
        "--cache-dir",
        help="shard cache to read from and fill (default: none; with --offline: $WIDS_CACHE_DIR "
        "or the per-user cache directory)",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="serve only from local files and the cache; fail naming what is missing",
    )
    url_map_flag(p)
    allow_local_flag(p)
    storage_flag(p)
    p.set_defaults(func=_cmd_show)


def _cmd_show(args: argparse.Namespace) -> int:
    from ..show import read_samples, render_grid, samples_table

    samples = read_samples(
        args.index,
        start=args.start,
        n=args.n,
        storage_options=parse_storage_options(args.storage_option),
        cache_dir=args.cache_dir or (default_cache_dir() if args.offline else None),
        offline=args.offline,
        url_map=parse_url_map(args.url_map),
        allow_local_shards=args.allow_local_shards,
    )
    if args.grid:
        width, height = render_grid(samples, args.grid, cell=args.cell)
        print(f"wrote {args.grid}: {len(samples)} samples, {width}x{height} pixels")
    else:
        print(samples_table(samples))
    return 0
