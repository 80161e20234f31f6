"""The member tables of a small local index, parsed when it loads: before workers fork.

A DataLoader worker that is not persistent is forked again every epoch, and parsed each
member table it needed again (a sidecar of 1,000 samples: ~0.5 ms, every shard, every worker,
every epoch), unless the main process had parsed it before the fork. When the dataset's index
is a local file and small (:data:`MAX_SHARDS` shards, :data:`MAX_SAMPLES` samples: a fraction
of a second at most), :func:`parse_local_tables` parses every table when the description loads
(``len(ds)``, which a sampler calls before any worker exists), and forked workers inherit them.
A table that cannot be read is left alone: the first read of its shard raises the error, as
without this. A DataLoader worker that loads the description itself (spawned, or forked before
the main process loaded it) parses only the tables it needs, as before. The per-process
first-touch checks of each shard (its size, mtime and a member header against the index) are
unchanged: a shard changed since is still refused.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import WidsError

if TYPE_CHECKING:
    from .description import Description

__all__ = ["MAX_SAMPLES", "MAX_SHARDS", "parse_local_tables"]

log = logging.getLogger(__name__)

MAX_SHARDS = 1024
"""Indexes of more shards are left to parse each table on first use (per process)."""
MAX_SAMPLES = 1 << 18
"""Indexes of more samples are left to parse each table on first use (per process)."""


def parse_local_tables(loaded: Description, keep: Callable[..., None]) -> None:
    """Parse the member tables of a small local index; ``keep(shard, table, scanned=False)``.

    The caller (the catalog, its description just loaded from a local index) keeps them as
    its own reads of tables do. Nothing is done for shards without tables in the index (each
    is scanned on first use) or above the bounds.
    """
    if loaded.indexed is None or len(loaded.infos) > MAX_SHARDS or loaded.total > MAX_SAMPLES:
        return
    torch_data = sys.modules.get("torch.utils.data")  # not imported: no worker
    if torch_data is not None and torch_data.get_worker_info() is not None:
        return  # loaded in a DataLoader worker (spawned): it forks nothing, reads what it needs
    for shard in range(len(loaded.infos)):
        try:
            members = loaded.indexed(shard)
        except (WidsError, OSError) as exc:  # left for the shard's first read to raise
            log.debug("member table of shard %d not parsed ahead: %s", shard, exc)
            continue
        # A missing table (the shard is scanned on first use) or one that disagrees with the
        # shard's count (an error then) is left alone.
        if members is not None and len(members) == loaded.infos[shard].nsamples:
            keep(shard, members, scanned=False)
