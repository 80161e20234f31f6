"""The ``wids`` command.

Each subcommand is an ``_add_<name>(subparsers)`` function that registers its parser and sets
``func``; errors reach the user as one line (``--debug`` shows the traceback). Environment
variables only supply defaults here, and every one is named in ``--help``.

Everything the command prints, and every log line (wids' and, with ``--debug``, those of
fsspec, s3fs, gcsfs, aiohttp, botocore and urllib3), passes through :mod:`wids.storage.redact`:
credentials never reach the terminal, and control characters from shards are escaped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from .storage import RedactingFilter, _secret_values, escape_controls, redact_text, redact_url

__all__ = ["main"]

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

    Dotted keys nest: ``client_kwargs.endpoint_url=http://...``.
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
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _storage_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-s",
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option (repeatable; dotted keys nest, values parse as JSON)",
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


def _url_map_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url-map",
        action="append",
        metavar="OLD=NEW",
        help="read shards whose URL starts with OLD from NEW instead: a mirror or proxy with the "
        "same bytes (repeatable; the longest matching OLD wins)",
    )


def _allow_local_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-local-shards",
        action="store_true",
        help="let an index read from a remote location (http, s3, gs ...) name local files; "
        "refused by default, so a crafted index cannot read your files",
    )


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# ---------------------------------------------------------------------------------- index


def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build, inspect, verify and convert member-offset indexes")
    isub = p.add_subparsers(dest="index_command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter

    c = isub.add_parser(
        "create",
        help="scan shards once and write an index (JSON or SQLite)",
        formatter_class=fmt,
        epilog="examples:\n"
        "  wids index create data/train-{000000..000031}.tar -o data/train.json\n"
        "  wids index create s3://bucket/train-{000000..000999}.tar -o train.sqlite -j 32\n"
        "  wids index create @shards.txt -o train.json --skip-bad\n"
        "  wids index create s3://bucket/train-{000000..000999}.tar -o s3://bucket/train.json\n",
    )
    c.add_argument("shards", nargs="+", help="paths/URLs, brace patterns, or @listfile")
    c.add_argument(
        "-o",
        "--output",
        required=True,
        help="OUT.json or OUT.sqlite: a path or a writable URL (s3://, gs://, ...)",
    )
    c.add_argument("-j", "--jobs", type=int, default=None, help="shards scanned at once")
    c.add_argument("--skip-bad", action="store_true", help="record bad shards and go on")
    c.add_argument(
        "--duplicates",
        choices=["error", "split", "keep_first"],
        default="error",
        help="what to do with a repeated key or field (default: error)",
    )
    c.add_argument("--full", action="store_true", help="rescan every shard (not incremental)")
    c.add_argument("--name", help="dataset name stored in the index")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _storage_flag(c)
    c.set_defaults(func=_cmd_index_create)

    i = isub.add_parser(
        "info",
        help="shards, samples, bytes and fields of an index",
        formatter_class=fmt,
        epilog="example:\n  wids index info data/train.json\n",
    )
    i.add_argument("index")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    _allow_local_flag(i)
    _storage_flag(i)
    i.set_defaults(func=_cmd_index_info)

    v = isub.add_parser(
        "verify",
        help="check every shard's fingerprint (size, etag or mtime) and a recorded member "
        "header, and load every member table (--deep: rescan the shards)",
        formatter_class=fmt,
        epilog="examples:\n  wids index verify data/train.json --deep\n"
        "  wids index verify train.json --url-map https://old.example/data/=s3://new-bucket/data/\n",
    )
    v.add_argument("index")
    v.add_argument("--deep", action="store_true", help="rescan shards and compare offsets")
    _url_map_flag(v)
    _allow_local_flag(v)
    _storage_flag(v)
    v.set_defaults(func=_cmd_index_verify)

    cv = isub.add_parser(
        "convert",
        help="convert an index between JSON and SQLite",
        formatter_class=fmt,
        epilog="example:\n  wids index convert train.json train.sqlite\n",
    )
    cv.add_argument("source")
    cv.add_argument("dest", help="OUT.json or OUT.sqlite: a path or a writable URL (s3://, gs://)")
    _storage_flag(cv)
    cv.set_defaults(func=_cmd_index_convert)


def _cmd_index_create(args: argparse.Namespace) -> int:
    from .index import build_index

    report = build_index(
        args.shards,
        args.output,
        storage_options=parse_storage_options(args.storage_option),
        jobs=args.jobs,
        skip_bad=args.skip_bad,
        duplicates=args.duplicates,
        incremental=not args.full,
        name=args.name,
        progress=not args.quiet and sys.stderr.isatty(),
    )
    rate = report.samples / report.seconds if report.seconds else 0.0
    print(
        f"{redact_url(report.output)}: {report.shards} shards, {report.samples} samples, "
        f"{_human(report.bytes)} ({report.scanned} scanned, {report.reused} unchanged) "
        f"in {report.seconds:.2f} s ({rate:.0f} samples/s)"
    )
    for url, err in report.bad:
        print(f"  skipped bad shard {url}: {err}")
    return 1 if report.bad else 0


def _cmd_index_info(args: argparse.Namespace) -> int:
    import numpy as np

    from .index import open_index

    idx = open_index(
        args.index,
        parse_storage_options(args.storage_option),
        allow_local_shards=args.allow_local_shards,
    )
    try:
        fields: dict[str, int] = {}
        missing = 0
        for k in range(len(idx.shards)):
            members = idx.members(k)
            if members is None:
                missing += 1
                continue
            counts = np.bincount(members.member_field, minlength=len(members.fields))
            for fname, n in zip(members.fields, counts.tolist(), strict=True):
                fields[fname] = fields.get(fname, 0) + n
        info: dict[str, Any] = {
            "index": redact_url(args.index),
            "name": idx.name,
            "shards": len(idx.shards),
            "samples": sum(s.nsamples for s in idx.shards),
            "bytes": sum(s.size or 0 for s in idx.shards),
            "fields": dict(sorted(fields.items())),
            "shards_without_offsets": missing,
            "components": [c.name for c in idx.components],
        }
    finally:
        idx.close()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['index']}  name={escape_controls(repr(info['name']))}")
    print(f"  shards   {info['shards']}")
    print(f"  samples  {info['samples']}")
    print(f"  bytes    {info['bytes']} ({_human(info['bytes'])})")
    for f, n in info["fields"].items():
        print(f"  field    {escape_controls(f):<16} {n}")
    if missing:
        print(f"  {missing} shard(s) have no member offsets (reference index): scanned on use")
    return 0


def _cmd_index_verify(args: argparse.Namespace) -> int:
    from .errors import WidsError
    from .index import REPAIR_HINT, open_index
    from .storage import Source, redact_url

    options = parse_storage_options(args.storage_option)
    idx = open_index(
        args.index,
        options,
        url_map=parse_url_map(args.url_map),
        allow_local_shards=args.allow_local_shards,
    )
    bad = 0
    try:
        shards = idx.shards
        for k, info in enumerate(shards):
            try:
                members = idx.members(k)  # every member table: a damaged one is reported
            except WidsError as e:
                bad += 1
                print(f"DAMAGED {redact_url(info.url)}: its member table: {e}")
                continue
            problem = _verify_shard(Source(info.url, options), info, members, deep=args.deep)
            if problem:
                bad += 1
                print(f"CHANGED {redact_url(info.url)}: {problem}")
    finally:
        idx.close()
    print(f"{len(shards) - bad} of {len(shards)} shards match the index")
    if bad:
        print(f"to repair, {REPAIR_HINT}")
    return 1 if bad else 0


def _verify_shard(src: Any, info: Any, members: Any, *, deep: bool) -> str | None:
    """What is wrong with one shard against its index entry and member table, if anything."""
    from .errors import WidsError
    from .index import header_mismatch_at_spot, scan_shard, shard_mismatch

    try:
        stat = src.info()
        end = None if members is None else int(members.spans()[1].max(initial=0))
        problem = shard_mismatch(info, stat, data_end=end)
        if problem is None and members is not None:
            problem = header_mismatch_at_spot(members, src.read_range)
        if problem is None and deep:
            _, now, _ = scan_shard(src)
            if members is not None and now != members:
                problem = "its member offsets differ from the index (found by rescanning)"
            elif len(now) != info.nsamples:
                problem = f"it has {len(now)} samples where the index says {info.nsamples}"
    except WidsError as e:
        return e.message
    finally:
        src.close()
    return problem


def _cmd_index_convert(args: argparse.Namespace) -> int:
    from .index import convert_index

    convert_index(
        args.source, args.dest, storage_options=parse_storage_options(args.storage_option)
    )
    print(f"wrote {redact_url(args.dest)}")
    return 0


# ------------------------------------------------------------------------- subset, cache

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


def _parse_slice(text: str) -> slice:
    try:
        parts = [int(x) if x.strip() else None for x in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1 and parts[0] is not None:
        return slice(parts[0], parts[0] + 1)
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"not a shard range: {text!r} (e.g. 0:4, 10:, :8:2)")
    return slice(*parts)


def _add_subset(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "subset",
        help="copy some shards and a matching index into a directory (works offline)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  wids subset s3://bucket/train.json --shards 0:4 --to ~/data/train-small\n"
        "  wids subset https://host/train.json --samples 5000 --to small/\n"
        "then: ShardListDataset('small/train.json')  # no network needed\n",
    )
    p.add_argument("index", help="path/URL of the dataset's index or description")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--shards", type=_parse_slice, help="a slice of the shard list: 0:4")
    which.add_argument("--samples", type=int, help="the shards holding the first N samples")
    p.add_argument(
        "--to",
        required=True,
        help="destination directory (local); must not hold files of the names the subset "
        "writes, and is created only once the index opened",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace files of the names the subset writes (other files are never touched; "
        "the source index and shards are never replaced)",
    )
    p.add_argument("-j", "--jobs", type=int, default=8, help="shards copied at once (8)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _allow_local_flag(p)
    _storage_flag(p)
    p.set_defaults(func=_cmd_subset)


def _cmd_subset(args: argparse.Namespace) -> int:
    from .subset import make_subset

    report = make_subset(
        args.index,
        args.to,
        shards=args.shards,
        samples=args.samples,
        storage_options=parse_storage_options(args.storage_option),
        jobs=args.jobs,
        progress=not args.quiet and sys.stderr.isatty(),
        force=args.force,
        allow_local_shards=args.allow_local_shards,
    )
    print(
        f"{redact_url(report.index)}: {report.shards} shards, {report.samples} samples, "
        f"{_human(report.bytes)} ({report.copied} copied) in {report.seconds:.2f} s"
    )
    return 0


def _add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="list, size and clean the local shard cache",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  wids cache ls\n  wids cache du\n"
        "  wids cache clean --older-than 7d\n  wids cache clean --max-size 50G\n\n" + EPILOG_ENV,
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="the cache directory (default: $WIDS_CACHE_DIR or the per-user cache directory)",
    )
    csub = p.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter
    ls = csub.add_parser(
        "ls",
        help="cached shards, least recently used first",
        formatter_class=fmt,
        epilog="example:\n  wids cache --cache-dir /data/wids-cache ls --json\n",
    )
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    csub.add_parser(
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
    p.set_defaults(func=_cmd_cache)


def _cmd_cache(args: argparse.Namespace) -> int:
    from .cache import MARKER, ShardCache, cache_state
    from .errors import CacheDirError

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
        return _cache_ls(cache, args.json)
    if args.cache_command == "du":
        print(_cache_du(cache))
        return 0
    before = cache.total_bytes()
    removed = cache.clean(older_than=args.older_than, max_bytes=args.max_size)
    left = cache.total_bytes()
    print(
        f"removed {len(removed)} shards, freed {_human(before - left)}; {_human(left)} left "
        "(member tables in scans/ and index copies in indexes/ are kept)"
    )
    return 0


def _cache_ls(cache: Any, as_json: bool) -> int:
    import time

    entries = cache.entries()
    if as_json:
        print(json.dumps([{k: getattr(e, k) for k in e.__slots__} for e in entries], indent=2))
        return 0
    if not entries:
        print(f"no cached shards in {cache.cache_dir}")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_access))
        print(f"{when}  {_human(e.size):>9}  {redact_url(e.url)}")
    return 0


def _cache_du(cache: Any) -> str:
    from .cache import count_files

    parts = [f"{_human(cache.total_bytes())} in {len(cache.entries())} shards"]
    for sub, what in (("scans", "member tables"), ("indexes", "index copies")):
        n, nbytes = count_files(cache.cache_dir, sub)
        if n:
            parts.append(f"{_human(nbytes)} in {n} {what}")
    return f"{', '.join(parts)}  {cache.cache_dir}"


# ------------------------------------------------------------------------------------ show


def _add_show(sub: argparse._SubParsersAction) -> None:
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
    _url_map_flag(p)
    _allow_local_flag(p)
    _storage_flag(p)
    p.set_defaults(func=_cmd_show)


def _cmd_show(args: argparse.Namespace) -> int:
    from .show import read_samples, render_grid, samples_table

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


# ----------------------------------------------------------------------------------- main

_SUBCOMMANDS = (_add_index, _add_subset, _add_cache, _add_show)


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
    parser.add_argument("--version", action="version", version=f"wids {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


# Libraries whose loggers --debug turns on; their records carry URLs, headers and signatures.
_LIBRARY_LOGGERS = ("fsspec", "s3fs", "gcsfs", "aiohttp", "botocore", "urllib3")


def _secrets_of(args: argparse.Namespace) -> list[str]:
    try:
        return _secret_values(parse_storage_options(getattr(args, "storage_option", None)))
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``wids`` command; returns the exit status."""
    import traceback

    parser = build_parser()
    args = parser.parse_args(argv)
    secrets = _secrets_of(args)
    handler, old_level = _start_logging(args.debug, secrets)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("wids: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one clear line unless --debug
        if args.debug:
            trace = redact_text(traceback.format_exc(), secrets).splitlines()
            print("\n".join(escape_controls(line) for line in trace), file=sys.stderr)
        from .errors import IndexFormatError
        from .index import with_repair_hint

        if isinstance(e, IndexFormatError):
            e = with_repair_hint(e)
        text = escape_controls(redact_text(str(e) or type(e).__name__, secrets))
        print(f"wids: error: {text}", file=sys.stderr)
        return 2
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(old_level)
