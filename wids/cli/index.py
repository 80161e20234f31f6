"""``wids index``: build, inspect, verify and convert member-offset indexes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..storage import escape_controls, redact_url
from .cluster import dask_flag
from .options import (
    allow_local_flag,
    human,
    parse_storage_options,
    parse_url_map,
    storage_flag,
    url_map_flag,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``wids index`` (create, info, verify, convert) to the subcommands."""
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
        "  wids index create s3://bucket/train-{000000..000999}.tar -o s3://bucket/train.json\n"
        "  wids index create data/*.tar -o train.json --column json:width --column size:.jpg\n",
    )
    c.add_argument(
        "shards", nargs="+", help="paths/URLs, brace patterns, @listfile, or an index (its shards)"
    )
    c.add_argument(
        "-o",
        "--output",
        required=True,
        help="OUT.json, OUT.sqlite or OUT.widx: a path or a writable URL (s3://, gs://, ...)",
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
    c.add_argument(
        "--no-md5",
        dest="md5",
        action="store_false",
        help="do not record each local shard's md5 (recorded by default: it tells a copy with "
        "new timestamps, cp -r, from a rewrite; it reads every byte, the scan only headers)",
    )
    c.add_argument(
        "--seek-spacing",
        type=int,
        default=1 << 20,
        metavar="BYTES",
        help=".tar.gz shards: uncompressed bytes between seek points, where a random read "
        "starts decoding (default: 1 MiB; each point costs about 32 KiB of index); .tar.zst "
        "without a seek table: the least bytes between its frames' points (a table's frames "
        "are kept)",
    )
    c.add_argument("--name", help="dataset name stored in the index")
    c.add_argument(
        "--column",
        action="append",
        metavar="SPEC",
        help="collect a per-sample metadata column into the index (repeatable; a local index): "
        "json:KEY (a number, bool or string of the sample's .json; KEY may be a.b), size:.EXT "
        "(the member's size), has:.EXT (whether it has one); NAME=SPEC names it (default: KEY "
        "with dots as _, size_EXT, has_EXT). See ds.column, ds.where, wids subset --where",
    )
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    dask_flag(c)
    storage_flag(c)
    c.set_defaults(func=_cmd_index_create)

    i = isub.add_parser(
        "info",
        help="shards, samples, bytes and fields of an index",
        formatter_class=fmt,
        epilog="examples:\n  wids index info data/train.json\n"
        "  wids index info train.widx --shard 5 --json\n"
        "  wids index info train.json --columns\n",
    )
    i.add_argument("index")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument(
        "--all",
        action="store_true",
        help="count the fields of every shard's member table (default: of every shard up to "
        "1000 shards, else of the first and last 5)",
    )
    i.add_argument(
        "--columns",
        action="store_true",
        help="summarise each metadata column: type, values, missing, min/max and a histogram "
        "(reads every shard's entry; of the kept samples when INDEX.exclude is beside it)",
    )
    i.add_argument(
        "--shard",
        type=int,
        action="append",
        metavar="K",
        help="also list shard K's record (repeatable; negative: from the end)",
    )
    allow_local_flag(i)
    storage_flag(i)
    i.set_defaults(func=_cmd_index_info)

    v = isub.add_parser(
        "verify",
        help="check every shard's fingerprint (size, etag or mtime, md5 where only it can "
        "tell a copy from a rewrite) and a recorded member header, and load every member "
        "table (--deep: rescan the shards)",
        formatter_class=fmt,
        epilog="examples:\n  wids index verify data/train.json --deep\n"
        "  wids index verify train.json --url-map https://old.example/data/=s3://new-bucket/data/\n",
    )
    v.add_argument("index")
    v.add_argument(
        "--deep",
        action="store_true",
        help="rescan shards and compare offsets; read local shards whole to compare their md5",
    )
    v.add_argument(
        "--cache-dir",
        help="also report cached copies in this shard cache that are not the indexed version "
        "(a dataset fetches those again instead of reading them)",
    )
    url_map_flag(v)
    dask_flag(v)
    allow_local_flag(v)
    storage_flag(v)
    v.set_defaults(func=_cmd_index_verify)

    cv = isub.add_parser(
        "convert",
        help="convert an index between JSON, SQLite and the shard table (.widx)",
        formatter_class=fmt,
        epilog="examples:\n  wids index convert train.json train.sqlite\n"
        "  wids index convert description.json -o train.widx   # 10^5+ shards: opens at once\n",
    )
    cv.add_argument("source", help="an index or a reference wids-shard-index-v1 description")
    dest_help = "OUT.json, OUT.sqlite or OUT.widx: a path or a writable URL (s3://, gs://)"
    cv.add_argument("dest", nargs="?", help=dest_help)
    cv.add_argument("-o", "--output", help="the same as DEST")
    storage_flag(cv)
    cv.set_defaults(func=_cmd_index_convert)


def _cmd_index_create(args: argparse.Namespace) -> int:
    from .cluster import dask_executor

    with dask_executor(args.dask) as executor:
        report = _create(args, executor)
    rate = report.samples / report.seconds if report.seconds else 0.0
    print(
        f"{redact_url(report.output)}: {report.shards} shards, {report.samples} samples, "
        f"{human(report.bytes)} ({report.scanned} scanned, {report.reused} unchanged) "
        f"in {report.seconds:.2f} s ({rate:.0f} samples/s)"
    )
    for url, err in report.bad:
        shown = escape_controls(f"{redact_url(url)}: {err}")
        print(f"  skipped bad shard {shown}")
    return 1 if report.bad else 0


def _create(args: argparse.Namespace, executor: Any) -> Any:
    from ..index import build_index

    return build_index(
        args.shards,
        args.output,
        storage_options=parse_storage_options(args.storage_option),
        jobs=args.jobs,
        skip_bad=args.skip_bad,
        duplicates=args.duplicates,
        incremental=not args.full,
        name=args.name,
        progress=not args.quiet and sys.stderr.isatty(),
        executor=executor,
        md5=args.md5,
        columns=args.column,
        seek_spacing=args.seek_spacing,
    )


def _cmd_index_info(args: argparse.Namespace) -> int:
    from ..index import open_index
    from ..index.summary import index_summary

    idx = open_index(
        args.index,
        parse_storage_options(args.storage_option),
        allow_local_shards=args.allow_local_shards,
    )
    try:
        info: dict[str, Any] = {"index": redact_url(args.index)}
        info.update(index_summary(idx, all_shards=args.all, detail=args.shard or ()))
        from ..dataset import index_exclusion
        from ..errors import ExclusionError

        try:
            excluded = index_exclusion(args.index, idx)  # INDEX.exclude, as opening applies it
        except ExclusionError as e:  # opening the dataset refuses it too: say so, go on
            excluded = None
            info["exclusion_error"] = str(e)
        if excluded is not None:
            info["excluded"] = len(excluded)
        if args.columns:
            from ..index.colsummary import column_summaries

            info["columns"] = column_summaries(idx, excluded)
    except IndexError as e:
        raise SystemExit(f"wids index info: {e}") from None
    finally:
        idx.close()
    for d in info["shard_detail"]:
        d["url"] = redact_url(d["url"])
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['index']}  name={escape_controls(repr(info['name']))}")
    print(f"  shards   {info['shards']}")
    print(f"  samples  {info['samples']}")
    if "excluded" in info:
        kept = info["samples"] - info["excluded"]
        print(f"  excluded {info['excluded']} by {info['index']}.exclude ({kept} samples kept)")
    if "exclusion_error" in info:
        print(f"  excluded ? ({escape_controls(info['exclusion_error'])}; opening refuses it too)")
    print(f"  bytes    {info['bytes']} ({human(info['bytes'])})")
    if info["fields_from"] < info["shards"]:
        print(f"  fields of the first and last shards ({info['fields_from']}; --all: every shard)")
    for f, n in info["fields"].items():
        print(f"  field    {escape_controls(f):<16} {n}")
    for d in info["shard_detail"]:
        size = "?" if d["size"] is None else human(d["size"])
        url = escape_controls(d["url"])
        print(f"  shard    {d['shard']:<8} {d['nsamples']} samples, {size}  {url}")
    missing = info["shards_without_offsets"]
    if missing:
        print(f"  {missing} shard(s) have no member offsets (reference index): scanned on use")
    elif missing is None:
        print("  shards without member offsets: not counted (--all reads every table)")
    if args.columns:
        from ..index.colsummary import render

        if not info["columns"]:
            print("  no metadata columns (wids index create --column)")
        for line in render(info["columns"]):
            print(escape_controls(line))
    return 0


def _cmd_index_verify(args: argparse.Namespace) -> int:
    from ..index import REPAIR_HINT, verify_index
    from ..storage import Store, named_by
    from .cluster import dask_executor

    url_map = parse_url_map(args.url_map)
    store = Store(parse_storage_options(args.storage_option), named=named_by(args.index, url_map))
    notes: list[Any] = []
    with dask_executor(args.dask) as executor:
        total, problems = verify_index(
            args.index,
            store,
            deep=args.deep,
            url_map=url_map,
            allow_local_shards=args.allow_local_shards,
            executor=executor,
            notes=notes,
        )
    for n in notes:
        print(f"OK ({n.kind.lower()}) {n.url}: {n.message}")
    for p in problems:
        print(f"{p.kind} {escape_controls(p.url)}: {escape_controls(p.message)}")
    print(f"{total - len(problems)} of {total} shards match the index")
    if args.cache_dir is not None:
        stale = _stale_copies(args.index, store, url_map, args)
        for url, why in stale.items():
            print(
                f"STALE-COPY {escape_controls(url)}: the cached copy is not the indexed "
                f"version ({escape_controls(why)}); a dataset fetches it again"
            )
        print(f"{len(stale)} cached copies in {args.cache_dir} are not the indexed version")
    if any(p.kind == "MISSING" for p in problems):
        print(
            "to repair, put the missing shards back where the index names them (--url-map: "
            "a mirror), or index the shards there are: wids index create SHARDS... -o INDEX"
        )
    if any(p.kind != "MISSING" for p in problems):
        print(f"to repair, {REPAIR_HINT}")
    return 1 if problems else 0


def _stale_copies(index: str, store: Any, url_map: Any, args: argparse.Namespace) -> dict[str, str]:
    """Cached copies in ``args.cache_dir`` that are not what ``index`` records."""
    from ..cache import ShardCache
    from ..dataset.compressed import cache_versions
    from ..index import count_shards, open_index, shard_getter

    idx = open_index(index, store, url_map=url_map, allow_local_shards=args.allow_local_shards)
    get = shard_getter(idx)
    shards = (get(k) for k in range(count_shards(idx)))
    return ShardCache(args.cache_dir).stale(
        v for i in shards for v in cache_versions(i.url, i.fingerprint)
    )


def _cmd_index_convert(args: argparse.Namespace) -> int:
    from ..index import convert_index

    if (args.dest is None) == (args.output is None):
        raise SystemExit("wids index convert: give the destination once: DEST or -o OUTPUT")
    dest = args.dest if args.dest is not None else args.output
    convert_index(args.source, dest, storage_options=parse_storage_options(args.storage_option))
    print(f"wrote {redact_url(dest)}")
    return 0
