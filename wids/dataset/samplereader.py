"""Raw samples without torch: the dataset's parts, composed for tools (``wids show``).

:class:`~wids.dataset.listdataset.ShardListDataset` subclasses ``torch.utils.data.Dataset``
when torch is installed, so importing it imports torch (seconds). A command that only prints a
few samples has no use for that: :class:`SampleReader` composes the same three parts (a
:class:`~wids.dataset.localcache.LocalCache`, a :class:`~wids.dataset.catalog.Catalog`, a
:class:`~wids.dataset.pool.ReaderPool`) with the dataset's defaults, and returns samples as the
dataset's ``__getitems__`` does with ``transformations=[]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..index import check_url_map
from ..storage import Store, named_by
from .catalog import Catalog
from .localcache import LocalCache
from .pool import ReaderPool

__all__ = ["SampleReader"]

_MERGE_GAP = 1 << 16  # ShardListDataset's default merge_gap


class SampleReader:
    """Undecoded samples of a dataset, in one process, without torch.

    Args:
        shards: As ``ShardListDataset``'s: an index or description path/URL, or shard patterns.
        storage_options: fsspec options for the index and shards.
        cache_dir: Shard cache to read from (and fill), or ``None``.
        offline: Serve only from local files and ``cache_dir``.
        url_map: Mirrors, as for ``ShardListDataset``.
        allow_local_shards: Let a remote index name local files.
    """

    def __init__(
        self,
        shards: Any,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        offline: bool = False,
        url_map: Mapping[str, str] | None = None,
        allow_local_shards: bool = False,
    ) -> None:
        self._local = LocalCache(cache_dir, cache_size=None, keep=False, offline=offline)
        self._catalog = Catalog(
            shards,
            self._local,
            dataset_name=None,
            base=None,
            url_map=check_url_map(url_map),
            allow_local_shards=allow_local_shards,
            store=Store(storage_options, None, named=named_by(shards, None, url_map)),
            duplicates="error",
            verify=True,
        )
        self._pool = ReaderPool(self._catalog, lru_size=10, access="auto", promote_share=0.05)

    def __len__(self) -> int:
        return int(self._catalog.counts().total)

    def read(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The samples at ``indices`` (fields as ``bytes``), read as one batch."""
        located = [self._catalog.locate(i) for i in indices]
        return self._pool.read_batch(located, _MERGE_GAP)

    def close(self) -> None:
        """Close the open readers and files."""
        self._pool.close()
