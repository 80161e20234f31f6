"""This process's storage clients: fsspec filesystems and aiohttp sessions, made after a fork.

A client holds connections that belong to the process (and the event loop) that opened them.
A forked child inherits the parent's client objects, but must never use or close them: closing
an inherited connection in the child unregisters the parent's socket from the epoll instance
both share, and the parent's next request on it hangs until its timeout. So:

- every client wids uses is made here, lazily, and kept under the pid of the process that made
  it: a forked child makes its own on first use, on its own event loop (fsspec starts a new
  one in a child);
- clients of other pids are never dropped, so nothing in a child finalises (closes) them; a
  child keeps its parent's few client objects in memory until it exits;
- filesystems are made with ``skip_instance_cache=True``: fsspec's instance cache drops the
  instances a parent made when a child first makes one (running their finalisers there), but
  not instances it never cached.

Nothing here patches asyncio, aiohttp or fsspec objects, and nothing runs inside ``os.fork``.
The registry is the one piece of process-wide state of :mod:`wids.storage`; it is filled on
first use, never at import.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["filesystem", "gate", "get", "session"]

T = TypeVar("T")

_lock = threading.RLock()
_clients: dict[tuple[Any, ...], Any] = {}
"""Clients by ``(pid, kind, ...)``; entries of other pids stay (see the module)."""


def _token(options: Mapping[str, Any]) -> str:
    """A key for storage options (their ``repr``: options are plain data, compared by value)."""
    return repr(sorted(options.items(), key=lambda kv: str(kv[0])))


def get(key: tuple[Any, ...], make: Callable[[], T]) -> T:
    """The client under ``key`` (its first item the pid), made by ``make()`` on first use."""
    return _get(key, make)


def _get(key: tuple[Any, ...], make: Callable[[], T]) -> T:
    found: T | None = _clients.get(key)
    if found is not None:
        return found
    with _lock:
        found = _clients.get(key)
        if found is None:
            found = _clients[key] = make()
        return found


def filesystem(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    """This process's fsspec filesystem for ``url`` under ``options``, and ``url``'s path on it.

    One filesystem per protocol and options in a process (so one connection pool), whatever
    the number of files read through it; HTTP(S) options that set headers get one per origin
    (:func:`~wids.storage.redirects.confine`: a redirect to another origin drops them).

    Raises:
        ImportError: The backend of ``url``'s protocol is not installed (names its extra).
    """
    from .backends import url_to_fs
    from .redirects import confine

    options = confine(url, options)  # headers stay with their origin on redirects
    pid = os.getpid()
    if "::" in url:  # chained: the filesystem depends on the whole chain
        chained: tuple[Any, str] = _get(
            (pid, "chain", url, _token(options)),
            lambda: url_to_fs(url, {**options, "skip_instance_cache": True}),
        )
        return chained
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    fs = _get(
        (pid, "fs", protocol, _token(options)),
        lambda: url_to_fs(url, {**options, "skip_instance_cache": True})[0],
    )
    import fsspec.core

    path: str = fsspec.core.strip_protocol(url)
    return fs, path


def session(loop: asyncio.AbstractEventLoop, timeout: float) -> Any:
    """This process's plain ``aiohttp.ClientSession`` on ``loop`` (made on first use there).

    For requests wids composes itself with no fsspec session to borrow (GCS's JSON API).
    Call it on ``loop``.
    """
    import aiohttp

    def make() -> Any:
        connector = aiohttp.TCPConnector(limit=64)
        client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=None)
        return aiohttp.ClientSession(connector=connector, timeout=client_timeout)

    return _get((os.getpid(), "session", id(loop), timeout), make)


def gate(name: str, size: int) -> asyncio.Semaphore:
    """A semaphore of ``size`` places named ``name``, one per process and running event loop.

    Call it on the loop that uses it.
    """
    loop = asyncio.get_running_loop()
    return _get((os.getpid(), "gate", name, id(loop)), lambda: asyncio.Semaphore(size))
