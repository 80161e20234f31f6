"""Public seams only: what must never come back into ``wids/`` (house style rule 14).

The old read plan found the forking DataLoader by walking call-stack frames, fetched member
tables inside ``os.fork``'s before-hook, and detected Accelerate's re-split from the frames
above the sampler. None of that may return.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "wids"

# The one at-fork hook wids keeps, and why it is safe: it raises a counter in the child, and
# does no I/O, takes no lock and starts no thread.
FORK_HOOKS = {"storage/forks.py"}


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_call_stack_walking() -> None:
    found = {
        name: m.group(0)
        for name, text in _sources().items()
        if (m := re.search(r"_getframe|\bf_locals\b|\bf_back\b|inspect\.stack|currentframe", text))
    }
    assert not found, f"call-stack walking in wids/: {found}"


def test_at_fork_hooks_only_where_they_do_no_io() -> None:
    found = {name for name, text in _sources().items() if "register_at_fork" in text}
    assert found <= FORK_HOOKS, f"at-fork hooks outside {FORK_HOOKS}: {found - FORK_HOOKS}"


def test_no_torch_private_attributes() -> None:
    """The DataLoader's own iterator internals (``_index_sampler``, ``DataLoaderIter``)."""
    pattern = r"_index_sampler|DataLoaderIter|_worker_queue|_sampler_iter|_workers_status"
    found = {
        name: m.group(0) for name, text in _sources().items() if (m := re.search(pattern, text))
    }
    assert not found, f"torch's private attributes in wids/: {found}"
