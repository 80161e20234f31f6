"""Whether this is still the process an object was made in, without a system call.

Objects that hold per-process state (open descriptors, readers, threads) must notice a fork
(a DataLoader worker) before they use it. ``os.getpid()`` tells, but it is a system call
(~0.2 µs on Linux: glibc caches no pid), paid on every read of the hot path. Instead an
object keeps :func:`stamp`'s value and compares it with :data:`generation`, which a fork
handler (``os.register_at_fork``, registered by the first :func:`stamp`) raises in every
forked child: a descendant always has a larger generation than its ancestors had when they
stamped, so equal means the same process. A pickled object stamps again when unpickled.

Only a fork through ``os.fork`` (``multiprocessing``, torch's workers) runs the handler; a
child forked by C code that runs Python keeps its parent's generation, as it keeps its pid's
caches everywhere else.

A forked child also inherits fsspec's event loop object, but not the thread that runs it, and
shares that loop's epoll instance and sockets with the parent: a child that closes an inherited
connection (fsspec's finalizer of a parent's filesystem it drops, an aiohttp connector's
``__del__``) unregisters the parent's socket from the parent's epoll, and the parent's next
request on that kept-alive connection waits for its whole timeout. A fork handler marks the
inherited loop closed and not running in the child, so those close nothing there (aiohttp and
fsspec skip a closed loop); the child's fsspec makes its own loop.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

__all__ = ["generation", "lock", "stamp"]

generation = 0
"""Raised by one in every child forked since the first :func:`stamp` (read it, never set it)."""

lock = threading.Lock()
"""This process's lock for an object's check-and-reset after a fork (two threads of a child may
both notice it): a new one in every forked child, as one held by a parent's thread at the fork
would never be released there. Read it as ``forks.lock`` when used, never import the name."""

_registered = False
"""Whether the fork handler is registered (two threads racing may register it twice: then a
fork raises the generation by two, which is as good)."""


def _forked() -> None:
    global generation
    generation += 1


def stamp() -> int:
    """This process's generation, for an object to compare with :data:`generation` later.

    Example:
        >>> from wids.storage import forks
        >>> made = forks.stamp()
        >>> made == forks.generation  # same process
        True
    """
    global _registered
    if not _registered:
        register = getattr(os, "register_at_fork", None)  # no fork without it (Windows)
        if register is not None:
            register(after_in_child=_forked)
        _registered = True
    return generation


_parent_loop: Any = None
"""fsspec's event loop at the moment of a fork (set in the parent just before it)."""


def _before_fork() -> None:
    global _parent_loop
    asyn = sys.modules.get("fsspec.asyn")  # not imported: no loop to retire
    _parent_loop = asyn.loop[0] if asyn is not None else None


def _retire_parent_loop() -> None:
    """In a forked child: the parent's fsspec loop runs nowhere here, so mark it closed.

    Never ``loop.close()``: that unregisters the loop's own sockets from the shared epoll.
    Also gives the child its own :data:`lock` (before any other handler starts a thread).
    """
    global _parent_loop, lock
    lock = threading.Lock()
    loop, _parent_loop = _parent_loop, None
    if loop is not None and hasattr(loop, "_closed") and hasattr(loop, "_thread_id"):
        loop._thread_id = None  # not running: fsspec closes a session's connector directly
        loop._closed = True  # closed: aiohttp's connector then closes no transport


def _after_fork_in_parent() -> None:
    global _parent_loop
    _parent_loop = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_retire_parent_loop,
    )
