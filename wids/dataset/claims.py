"""Claims on a plan's positions, and prefetched batches handed between sibling processes.

The DataLoader's workers of one iteration read ahead from the same plan (:mod:`wids.plan`),
and which of them gets a batch is the DataLoader's choice (with ``in_order=False``: whichever
has room). So a batch read ahead by one worker is often given to another. :class:`Claims`
makes that cost nothing but a local copy:

- a process *claims* a position before it reads the batch there ahead: it binds a Unix socket
  whose name (Linux's abstract namespace) is the dataset, the iteration and the position. A
  name is bound once, so no two siblings read the same batch ahead;
- the process that gets the batch asks for it (:meth:`Claims.take`): its own prefetch, else
  the sibling that claimed it sends the bytes over the socket once they are read; unclaimed,
  it binds the name itself (a *tombstone*), so no sibling reads ahead a batch already read;
- a claim's reads start when the claimer's window has room for them (its own batches go
  first): it then binds a second name. The process given a batch whose reads have not started
  binds that name itself and reads the batch at once; the claimer then does not read it;
- names are released by the process that bound them when its iteration has moved on, and by
  the kernel when the process ends: nothing is left behind, on disk or in shared memory.

Only processes of the same user are served or believed (``SO_PEERCRED``). The bytes a sibling
sends were read and checked by it exactly as the receiver's own prefetches are (same blocks,
same checks); the receiver takes only blocks identical to the ones it plans. Without the
abstract namespace (not Linux) there are no claims: every process reads ahead for itself.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping

from .readers import Block

__all__ = ["Claims", "decode", "encode", "shared"]

log = logging.getLogger(__name__)

_ROW = struct.Struct("<4q")  # shard, start, end, length of the bytes
_CRED = struct.Struct("3i")  # pid, uid, gid (SO_PEERCRED)

Prefetched = dict[Block, bytes]

STARTED = "-r"  # the second name of a claim whose reads went out


def shared() -> bool:
    """Whether this platform has the abstract socket namespace claims need (Linux)."""
    return sys.platform.startswith("linux")


def encode(blocks: Mapping[Block, bytes]) -> list[bytes]:
    """The frame of prefetched blocks: a count, a row per block, then their bytes."""
    head = [struct.pack("<q", len(blocks))]
    head += [_ROW.pack(b.shard, b.start, b.end, len(d)) for b, d in blocks.items()]
    return [b"".join(head), *blocks.values()]


def decode(frame: bytes | bytearray | memoryview) -> Prefetched:
    """The blocks of a frame made by :func:`encode`; ``ValueError`` if it is not one."""
    view = memoryview(frame)
    if len(view) < 8:
        raise ValueError("short hand-off frame")
    (count,) = struct.unpack_from("<q", view)
    at = 8 + count * _ROW.size
    if count < 0 or at > len(view):
        raise ValueError("bad hand-off frame")
    out: Prefetched = {}
    for k in range(count):
        shard, start, end, n = _ROW.unpack_from(view, 8 + k * _ROW.size)
        if n < 0 or at + n > len(view):
            raise ValueError("bad hand-off frame")
        out[Block(shard, start, end)] = bytes(view[at : at + n])
        at += n
    if at != len(view):
        raise ValueError("bad hand-off frame")
    return out


def _same_user(sock: socket.socket) -> bool:
    _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return bool(uid == os.getuid())


class _Claim:
    """A claimed position: its listening socket, whether its reads are out, its bytes."""

    __slots__ = ("blocks", "pending", "ready", "served", "sock", "started")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.started: socket.socket | None = None  # its reads are out (a second name)
        self.ready = False  # its reads ended: ``blocks`` (empty if they failed)
        self.blocks: Mapping[Block, bytes] | None = None
        self.served = False  # a sibling asked (or this process took it): asked once
        self.pending: socket.socket | None = None  # a sibling waiting for its bytes


class Claims:
    """This process's claims on positions of one dataset's plans, and the server of its own.

    Args:
        key: Names the dataset (siblings over another dataset never meet its claims).
        timeout: Seconds a taker waits for a sibling's bytes (then it reads them itself).
        keep: Names bound at most at once (the oldest tombstones are released first).
    """

    def __init__(self, key: str, *, timeout: float = 60.0, keep: int = 64) -> None:
        self.key, self.timeout, self.keep = key, timeout, keep
        self._claims: dict[tuple[int, int], _Claim] = {}
        # names bound only to keep siblings off: (token, position, tag) -> socket
        self._tombstones: dict[tuple[int, int, str], socket.socket] = {}
        self._mutex = threading.Lock()
        self._selector: selectors.BaseSelector | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.sent = self.received = 0  # batches handed over, for tests and benchmarks

    def _name(self, token: int, position: int, tag: str = "") -> bytes:
        return f"\0wids-ahead-{self.key}-{token:x}-{position}{tag}".encode()

    def _bind(self, token: int, position: int, tag: str = "") -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self._name(token, position, tag))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return None
            raise
        return sock

    def claim(self, token: int, position: int) -> bool:
        """Claim the batch at ``position`` of iteration ``token``: ``False`` if a sibling has."""
        if self._closed:
            return False
        sock = self._bind(token, position)
        if sock is None:
            return False
        sock.listen(4)
        sock.setblocking(False)
        claim = _Claim(sock)
        with self._mutex:
            self._claims[(token, position)] = claim
            # the server thread wakes only when a sibling asks (epoll sees it registered)
            self._serving().register(sock, selectors.EVENT_READ, claim)
        return True

    def start(self, token: int, position: int) -> bool:
        """The claimed batch's reads go out now; ``False``: the sibling given it reads it."""
        sock = self._bind(token, position, STARTED)
        if sock is None:
            return False
        with self._mutex:
            claim = self._claims.get((token, position))
            if claim is None or self._closed:
                sock.close()
                return False
            claim.started = sock
        return True

    def serve(self, token: int, position: int, blocks: Mapping[Block, bytes] | None) -> None:
        """The claimed batch's reads ended (``None``: failed): hand its bytes to who asks."""
        with self._mutex:
            claim = self._claims.get((token, position))
            if claim is None or claim.ready:
                return
            claim.ready = True
            conn, claim.pending = claim.pending, None
            if conn is None:  # kept until a sibling asks (or this process takes it)
                claim.blocks = None if claim.served else (blocks or {})
                return
        self._send(conn, blocks or {})

    def served(self, token: int, position: int) -> bool:
        """Whether the claimed batch was handed to a sibling."""
        with self._mutex:
            claim = self._claims.get((token, position))
            return claim is not None and claim.served

    def taken(self, token: int, position: int) -> None:
        """The claimed batch was given to this process: its name stays bound, its bytes go."""
        with self._mutex:
            claim = self._claims.get((token, position))
            if claim is not None:
                claim.served = True
                claim.blocks = None

    def release(self, token: int, position: int) -> None:
        """Give up a claim or tombstone (its name may be bound again)."""
        with self._mutex:
            claim = self._claims.pop((token, position), None)
            if claim is not None:
                self._unregister(claim)
        if claim is not None:
            _close(claim)

    def release_where(self, token: int, before: int) -> None:
        """Release the names of other iterations, and of ``token``'s positions before ``before``."""
        with self._mutex:
            stale = [k for k in self._claims if k[0] != token or k[1] < before]
            dead = [k for k in self._tombstones if k[0] != token or k[1] < before]
            socks = [self._tombstones.pop(k) for k in dead]
        for token_, position in stale:
            self.release(token_, position)
        for sock in socks:
            sock.close()

    def take(self, token: int, position: int) -> Prefetched | None:
        """The batch at ``position``, from the sibling that claimed it; else ``None``.

        Unclaimed, the name is bound here as a tombstone: no sibling claims the batch later.
        Claimed but not started, it is marked started here: the sibling does not read it, and
        this process reads it directly (sooner than the sibling's turn would come). Started,
        this waits for the sibling's bytes (at most ``timeout``).
        """
        if self._closed:
            return None
        for _ in range(3):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.settimeout(self.timeout)
                try:
                    conn.connect(self._name(token, position))
                except ConnectionRefusedError:  # unclaimed, or its claim not listening yet
                    if self._tombstone(token, position, ""):
                        return None
                    time.sleep(0.001)
                    continue
                if self._tombstone(token, position, STARTED):  # not started: read here
                    return None
                return self._receive(conn)
            except OSError as exc:  # the sibling went away or took too long: read directly
                log.debug("hand-off of position %d failed: %s", position, exc)
                return None
            finally:
                conn.close()
        return None

    def _receive(self, conn: socket.socket) -> Prefetched | None:
        if not _same_user(conn):
            return None
        chunks = []
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        if not chunks:  # the sibling's read failed, or it was served already
            return None
        try:
            got = decode(b"".join(chunks))
        except ValueError as exc:
            log.debug("bad hand-off: %s", exc)
            return None
        self.received += 1
        return got

    def _tombstone(self, token: int, position: int, tag: str) -> bool:
        """Bind a name only to keep siblings off it (the oldest released beyond ``keep``)."""
        sock = self._bind(token, position, tag)
        if sock is None:
            return False
        with self._mutex:
            self._tombstones[(token, position, tag)] = sock
            excess = len(self._tombstones) - self.keep
            old = [self._tombstones.pop(k) for k in list(self._tombstones)[: max(0, excess)]]
        for sock in old:
            sock.close()
        return True

    # -- the server: one daemon thread, started by the first claim; it wakes when asked -------

    def _serving(self) -> selectors.BaseSelector:
        """The selector of claims (under the mutex), its thread started on first use."""
        if self._selector is None:
            self._selector = selectors.DefaultSelector()
            self._wake = socket.socketpair()
            self._wake[0].setblocking(False)
            self._selector.register(self._wake[0], selectors.EVENT_READ, None)
            # a daemon thread: a DataLoader worker's exit must not wait for it
            self._thread = threading.Thread(
                target=self._serve_forever, name="wids-claims", daemon=True
            )
            self._thread.start()
        return self._selector

    def _unregister(self, claim: _Claim) -> None:
        if self._selector is not None:
            try:
                self._selector.unregister(claim.sock)
            except (KeyError, ValueError):
                pass

    def _serve_forever(self) -> None:
        selector, wake = self._selector, self._wake
        if selector is None or wake is None:  # closed before this thread ran: nothing to serve
            return
        while not self._closed:
            try:
                events = selector.select()
            except (OSError, ValueError):  # closed under it
                return
            for key, _ in events:
                claim = key.data
                if claim is None:  # woken to stop
                    continue
                self._answer(claim)

    def _answer(self, claim: _Claim) -> None:
        """A sibling asks for a claimed batch: its bytes now, or once its reads end."""
        try:
            conn, _ = claim.sock.accept()
        except OSError:  # released meanwhile, or no connection after all
            return
        conn.setblocking(True)
        conn.settimeout(self.timeout)
        try:
            same = _same_user(conn)
        except OSError:
            same = False
        with self._mutex:
            if not same or claim.served:  # another user's, or asked already: nothing
                blocks = None
            elif not claim.ready:  # sent by serve() when the reads end
                claim.served, claim.pending = True, conn
                return
            else:
                claim.served = True
                blocks, claim.blocks = claim.blocks, None
        if blocks is None:
            conn.close()
        else:
            self._send(conn, blocks)

    def _send(self, conn: socket.socket, blocks: Mapping[Block, bytes]) -> None:
        with conn:
            try:
                if blocks:
                    for part in encode(blocks):
                        conn.sendall(part)
                    self.sent += 1
            except OSError as exc:
                log.debug("hand-off failed: %s", exc)

    def close(self) -> None:
        """Release every name and stop the server thread."""
        with self._mutex:
            self._closed = True
            claims, self._claims = list(self._claims.values()), {}
            tombstones, self._tombstones = list(self._tombstones.values()), {}
            selector, self._selector = self._selector, None
            wake, self._wake = self._wake, None
        for claim in claims:
            _close(claim)
        for sock in tombstones:
            sock.close()
        if wake is not None:
            try:
                wake[1].send(b"x")
            except OSError:
                pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if selector is not None:
            selector.close()
        if wake is not None:
            wake[0].close()
            wake[1].close()


def _close(claim: _Claim) -> None:
    claim.sock.close()
    for sock in (claim.started, claim.pending):
        if sock is not None:
            sock.close()
