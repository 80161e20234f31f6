"""Which servers a dataset has seen ignore or honour ``Range`` (:class:`RangeSupport`)."""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

from ..errors import RangeNotSupportedError
from ..storage import RangeFallbackWarning, redact_url

if TYPE_CHECKING:
    from .readers import ShardReader

__all__ = ["RangeSupport", "origin"]


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL, without credentials."""
    scheme, _, rest = redact_url(url).partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


class RangeSupport:
    """The servers one dataset has seen ignore or honour ``Range`` (by origin).

    Owned by the dataset's :class:`~wids.dataset.localcache.LocalCache`, so what one dataset
    learned never steers another (a server replaced on the same port is probed again by the
    next dataset). Forked workers inherit it; a pickled copy keeps what it knew.
    """

    def __init__(self) -> None:
        self.ignoring: set[str] = set()
        self.honouring: set[str] = set()  # servers whose range answer this dataset has seen
        self._lock = threading.Lock()

    def ignores(self, url: str) -> bool:
        """Whether this dataset saw the server of ``url`` ignore ``Range``."""
        return bool(self.ignoring) and origin(url) in self.ignoring

    def note_ignores(self, url: str, cache_dir: str | None) -> None:
        """Remember that the server of ``url`` ignores ``Range``; warn the first time."""
        where = origin(url)
        with self._lock:
            if where in self.ignoring:
                return
            self.ignoring.add(where)
        into = f"into the shard cache at {cache_dir}" if cache_dir else "whole into memory"
        warnings.warn(
            f"{where} ignores Range requests (it answers with the whole file): wids reads each "
            f"shard from it {into} instead of by range",
            RangeFallbackWarning,
            stacklevel=3,
        )

    def probe(self, url: str, reader: ShardReader, cache_dir: str | None) -> bool:
        """Whether the server of ``url`` ignores ``Range``: known, or one range read of ``reader``.

        The first time a server is seen ignoring it, :meth:`note_ignores` warns; one seen
        honouring it is not asked again.
        """
        if self.ignores(url):
            return True
        if reader.source is None or origin(url) in self.honouring:
            return False
        try:
            reader.source.read_range(0, 1)
            with self._lock:
                self.honouring.add(origin(url))
            return False
        except RangeNotSupportedError:
            self.note_ignores(url, cache_dir)
            return True

    def __getstate__(self) -> dict[str, Any]:
        return {"ignoring": set(self.ignoring), "honouring": set(self.honouring)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.ignoring, self.honouring = state["ignoring"], state["honouring"]
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RangeSupport(ignoring={sorted(self.ignoring)})"
