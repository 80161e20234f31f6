"""``--dask ADDRESS``: run a subcommand's per-shard work on a Dask cluster's workers."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from concurrent.futures import Executor

__all__ = ["dask_executor", "dask_flag"]


def dask_flag(p: argparse.ArgumentParser) -> None:
    """Add ``--dask ADDRESS``."""
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run the per-shard work on a Dask cluster's workers (scheduler address, e.g. "
        "tcp://scheduler:8786; needs dask[distributed]; the workers must reach the shards "
        "and the output)",
    )


@contextlib.contextmanager
def dask_executor(address: str | None) -> Iterator[Executor | None]:
    """A connected ``distributed.Client``'s executor, or ``None`` without an address."""
    if not address:
        yield None
        return
    try:
        from distributed import Client
    except ImportError as e:
        from ..extras import missing

        raise missing("distributed", "--dask", e) from None
    with Client(address) as client:
        yield client.get_executor()
