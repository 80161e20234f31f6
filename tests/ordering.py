"""The suite's order: files with a test marked ``slow`` first, each file's tests in place.

With two pytest-xdist workers taking a file at a time (``tools/test.sh``), a slow file handed
out last keeps one worker busy while the other has nothing left: started first, the slow files
overlap each other and the many quick files fill in around them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["slow_files_first"]


def slow_files_first(items: list[Any]) -> None:
    """Reorder ``items`` in place: files holding a ``slow`` test first, else as collected."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)  # stable: a file's order is kept
