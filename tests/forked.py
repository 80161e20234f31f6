"""Run a function in a forked child of the test process and get back what it returns."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["in_fork"]


def in_fork(body: Callable[[], str]) -> str:
    """``body()`` in a forked child (``os.fork``, no ``multiprocessing``): its text.

    The child never returns into pytest: it writes the text (or the error it raised, as
    ``"error: ..."``) to a pipe and leaves with ``os._exit``.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                text = body()
            except BaseException as e:  # noqa: BLE001 - handed to the parent as text
                text = f"error: {e!r}"
            os.write(w, text.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    return answer
