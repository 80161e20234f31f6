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

A forked child also inherits the parent's storage clients (connections): those are kept by
:mod:`wids.storage.clients` under the pid that made them, so a child neither uses nor closes
them; nothing here touches them.
"""

from __future__ import annotations

import os
import threading

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
    global generation, lock
    generation += 1
    lock = threading.Lock()


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
