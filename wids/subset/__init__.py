"""``wids subset``: copy some shards of an indexed dataset and a matching index into a directory.

:mod:`.make` copies and verifies; :mod:`.destination` plans and guards the files a subset
writes. Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .make import (
    SubsetReport,
    make_subset,
    select_shards,
)

__all__ = [
    "SubsetReport",
    "make_subset",
    "select_shards",
]
