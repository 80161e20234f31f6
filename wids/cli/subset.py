"""``wids subset``: copy some shards and a matching index into a local directory."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..storage import redact_url
from .cluster import dask_flag
from .options import allow_local_flag, human, parse_storage_options, storage_flag

__all__ = ["register"]


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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``wids subset`` to the subcommands."""
    p = sub.add_parser(
        "subset",
        help="copy some shards and a matching index into a directory (works offline)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  wids subset s3://bucket/train.json --shards 0:4 --to ~/data/train-small\n"
        "  wids subset train.json --shards : --where 'width >= 256' --to big/\n"
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
    p.add_argument(
        "--exclude",
        metavar="FILE",
        help="leave these samples out of the subset's index (the shards are copied whole): one "
        "entry per line, KEY, SHARD/KEY (SHARD ending in .tar, .tgz, .tar.gz, .tar.zst) or "
        "SHARD<TAB>KEY; "
        "'#' comment lines and blank lines skipped. Written beside the index as "
        "<index>.exclude, which opening that index applies",
    )
    p.add_argument(
        "--exclude-samples",
        metavar="FILE",
        help="as --exclude, with global sample numbers of the source (one integer per line)",
    )
    p.add_argument(
        "--where",
        metavar="EXPR",
        help="keep only the samples for which EXPR holds over the index's metadata columns "
        '(e.g. "width >= 256 and height >= 256"; wids index create --column): the others are '
        "excluded as --exclude excludes (added to it), no shard rewritten",
    )
    p.add_argument(
        "--exclude-strict",
        action="store_true",
        help="refuse exclusions naming no sample of the subset (default: ignored, counted)",
    )
    p.add_argument("-j", "--jobs", type=int, default=8, help="shards copied at once (8)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    dask_flag(p)
    allow_local_flag(p)
    storage_flag(p)
    p.set_defaults(func=_cmd_subset)


def _cmd_subset(args: argparse.Namespace) -> int:
    from ..subset import make_subset
    from .cluster import dask_executor

    with dask_executor(args.dask) as executor:
        report = _subset(args, executor, make_subset)
    excluded = f" ({report.excluded} excluded)" if report.excluded else ""
    print(
        f"{redact_url(report.index)}: {report.shards} shards, {report.samples} samples{excluded}, "
        f"{human(report.bytes)} ({report.copied} copied) in {report.seconds:.2f} s"
    )
    return 0


def _exclusions(args: argparse.Namespace) -> list[Any] | None:
    """The entries of ``--exclude`` and ``--exclude-samples``, or ``None``."""
    if args.exclude is None and args.exclude_samples is None:
        return None
    from ..dataset import parse_exclude, read_exclude_file

    entries: list[Any] = []
    if args.exclude is not None:
        entries += read_exclude_file(args.exclude)
    if args.exclude_samples is not None:
        for n, text in enumerate(read_exclude_file(args.exclude_samples), 1):
            try:
                entries.append(int(text))
            except ValueError:
                raise SystemExit(
                    f"wids subset: {args.exclude_samples}: entry {n} is not a sample number: "
                    f"{text!r}"
                ) from None
    parse_exclude(entries)  # a malformed entry fails before anything is copied
    return entries


def _subset(args: argparse.Namespace, executor: Any, make_subset: Any) -> Any:
    return make_subset(
        args.index,
        args.to,
        shards=args.shards,
        samples=args.samples,
        storage_options=parse_storage_options(args.storage_option),
        jobs=args.jobs,
        progress=not args.quiet and sys.stderr.isatty(),
        force=args.force,
        allow_local_shards=args.allow_local_shards,
        executor=executor,
        exclude=_exclusions(args),
        exclude_strict=args.exclude_strict,
        where=args.where,
    )
