"""Member tables handed to DataLoader workers through a private file, not through their pipe.

A DataLoader under forkserver or spawn pickles the dataset into each worker's pipe; past the
pipe's buffer (64 KiB on Linux) ``Process.start()`` blocks until the child has imported torch
and unpickled it, so the workers would start one after another. Tables beyond
``PICKLED_BYTES`` therefore do not go in the pickle: the process that holds them writes them
once per catalog to a file in a directory of its own (``tempfile.mkdtemp``, mode 0700), and the
pickle carries a :class:`Ticket` (the file's path, size and SHA-256). A worker reads the file at
its first need of a table, and uses it only if its size and digest are the ticket's; anything
else (a missing, short or altered file) leaves the worker to fetch its tables as it would
without a handoff.

The writing process removes its files when the catalog is collected or at exit
(``weakref.finalize``); another process (a forked worker that inherited the finalizer, or a
spawned one) never removes anything.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..index import ShardMembers

__all__ = [
    "HANDOFF_BYTES",
    "HANDOFF_TABLES",
    "Handoff",
    "Tables",
    "Ticket",
    "handed_tables",
    "read_handoff",
]

log = logging.getLogger(__name__)

HANDOFF_BYTES = 256 << 20
"""Bound on the tables written to a handoff file (their ``nbytes``): every worker reads the
whole file and keeps its tables."""
HANDOFF_TABLES = 4096
"""Bound on how many tables read from the index go to a handoff file (scanned tables, a pass
over a shard each, are bounded by bytes only)."""

_FORMAT, _VERSION = "wids-member-handoff", 1

Tables = dict[int, tuple[ShardMembers, bool]]
"""Shard -> (its member table, whether it came from scanning the shard)."""


Held = dict[int, tuple[ShardMembers, int]]
"""A catalog's tables: shard -> (member table, end of its last member's data)."""


def handed_tables(held: Held, scanned: set[int], first: list[int]) -> Tables:
    """The tables a catalog's copy gets: scanned ones, then ``first``, then the others.

    Scanned tables (a pass over a shard each) within :data:`HANDOFF_BYTES`; the others (read
    from the index) too, at most :data:`HANDOFF_TABLES` of them.
    """
    shards = list(held)  # a snapshot: other threads may add tables meanwhile
    firsts = set(first)
    order = [i for i in shards if i in scanned]
    order += [i for i in first if i in held and i not in scanned]
    order += [i for i in shards if i not in firsts and i not in scanned]
    tables: Tables = {}
    room, count = HANDOFF_BYTES, HANDOFF_TABLES
    for i in order:
        got = held.get(i)
        was_scanned = i in scanned
        if got is None or got[0].nbytes > room or (count <= 0 and not was_scanned):
            continue
        tables[i] = (got[0], was_scanned)
        room -= got[0].nbytes
        count -= not was_scanned
    return tables


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a pickled catalog carries instead of its tables: where they are and their digest."""

    path: str
    size: int
    sha256: bytes


class Handoff:
    """The handoff files of one catalog in the process that writes them.

    Args:
        owner: The catalog; its files are removed when it is collected (or at exit).
        room: Bytes of tables a pickled copy may carry itself (a pipe's room).
    """

    def __init__(self, owner: object, room: int) -> None:
        self.pid = os.getpid()
        self.room = room
        self._dir: str | None = None
        self._paths: list[str] = []  # shared with the finalizer: what this process wrote
        self._shards: frozenset[int] | None = None
        self._ticket: Ticket | None = None
        self._owner = weakref.ref(owner)
        self._lock = threading.Lock()  # two threads pickling the dataset at once

    def hand_over(
        self, held: Held, scanned: set[int], first: list[int]
    ) -> tuple[Held, Ticket | None]:
        """What a pickled copy of a catalog holding ``held`` carries: tables and a ticket.

        Args:
            held: The catalog's tables.
            scanned: Which of them came from scanning their shard.
            first: The tables loaded with the description, in order (they go first).

        Returns:
            The tables for the pickle, and the ticket of the file holding the others (``None``
            when all fit in ``self.room``, or the file could not be written: then as many go in
            the pickle as before there were handoff files: scanned ones all, ``first`` ones
            within ``room``).
        """
        tables, room = handed_tables(held, scanned, first), self.room
        if sum(m.nbytes for m, _ in tables.values()) > room:
            ticket = self.ticket(tables)
            if ticket is not None:  # scanned tables past the file's bound go as before
                return {i: held[i] for i in list(held) if i in scanned and i not in tables}, ticket
        keep = {i: held[i] for i, (_, was_scanned) in tables.items() if was_scanned}
        for i in first:
            got = tables.get(i)
            if got is not None and not got[1] and got[0].nbytes <= room:
                keep[i] = held[i]
                room -= got[0].nbytes
        return keep, None

    def ticket(self, tables: Tables) -> Ticket | None:
        """A ticket for a file holding ``tables``: the last one if it holds the same shards.

        Returns ``None`` when the file cannot be written (the caller pickles what it can).
        """
        with self._lock:
            return self._ticket_for(tables)

    def _ticket_for(self, tables: Tables) -> Ticket | None:
        shards = frozenset(tables)
        if shards == self._shards and self._ticket is not None:
            return self._ticket
        payload = pickle.dumps(
            {"format": _FORMAT, "version": _VERSION, "tables": tables},
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        try:
            path = self._write(payload)
        except OSError as e:
            log.debug("member tables not handed off (%s): they go with the pickle", e)
            return None
        old = self._paths[:-1]
        for stale in old:  # a worker holding its ticket and not yet reading falls back
            _unlink(stale)
            self._paths.remove(stale)
        self._shards = shards
        self._ticket = Ticket(path, len(payload), hashlib.sha256(payload).digest())
        return self._ticket

    def _write(self, payload: bytes) -> str:
        if self._dir is None:
            owner = self._owner()
            if owner is None:
                raise OSError("the catalog is gone")
            self._dir = tempfile.mkdtemp(prefix="wids-handoff-")  # mode 0700
            weakref.finalize(owner, _remove, self.pid, self._dir, self._paths)
        path = os.path.join(self._dir, f"tables-{len(self._paths) + 1}-{os.urandom(4).hex()}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._paths.append(path)  # from here the finalizer removes it, written or not
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
        except OSError:
            self._paths.remove(path)
            _unlink(path)
            raise
        return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _remove(pid: int, directory: str, paths: list[str]) -> None:
    """Remove what process ``pid`` wrote (nothing when called in another process)."""
    if os.getpid() != pid:
        return
    for path in paths:
        try:
            _unlink(path)
        except OSError as e:
            log.debug("handoff file %s not removed: %s", path, e)
    paths.clear()
    try:
        os.rmdir(directory)  # only if empty: nothing but our own files is ever removed
    except OSError as e:
        log.debug("handoff directory %s not removed: %s", directory, e)


def read_handoff(ticket: Ticket) -> Tables | None:
    """The tables of ``ticket``'s file, or ``None`` if the file is not the one it names.

    The bytes are unpickled only after their size and SHA-256 are the ticket's.
    """
    try:
        with open(ticket.path, "rb") as f:
            data = f.read(ticket.size + 1)
    except OSError as e:
        log.debug("handoff file unreadable (%s): the tables are fetched", e)
        return None
    if len(data) != ticket.size or hashlib.sha256(data).digest() != ticket.sha256:
        log.debug(
            "handoff file %s is not the one written (%d bytes, %d expected): the tables are "
            "fetched",
            ticket.path,
            len(data),
            ticket.size,
        )
        return None
    payload: Any = pickle.loads(data)  # noqa: S301 - bytes this dataset's owner wrote (digest)
    if (
        not isinstance(payload, dict)
        or payload.get("format") != _FORMAT
        or payload.get("version") != _VERSION
    ):
        log.debug("handoff file %s has another format: the tables are fetched", ticket.path)
        return None
    tables: Tables = payload["tables"]
    return tables
