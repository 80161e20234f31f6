"""Which downloads of one process fetched again a shard it had fetched shortly before.

A budget smaller than the shards read at once evicts whole-shard copies before their samples
are read, and ``access="shard"`` then downloads them again and again (a random order over a
dataset larger than the budget: 18-37x the dataset per epoch). A pass that reads a shard at a
time downloads each shard once per pass, so a shard downloaded again before as many other
shards were downloaded as this process has seen is a sign of that, not of the next epoch.
"""

from __future__ import annotations

import threading

__all__ = ["Refetches"]


class Refetches:
    """Counts one process's downloads that came too soon after the same shard's last one."""

    def __init__(self) -> None:
        self.downloads = 0
        self.too_soon = 0  # downloads of a shard within a pass over the shards seen
        self._last: dict[str, int] = {}  # url -> its last download's number
        self._mutex = threading.Lock()

    def note(self, url: str) -> None:
        """A download of ``url`` by this process has just finished."""
        with self._mutex:
            last = self._last.get(url)
            if last is not None and self.downloads - last < len(self._last) - 1:
                self.too_soon += 1
            self._last[url] = self.downloads
            self.downloads += 1
