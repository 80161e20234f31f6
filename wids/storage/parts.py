"""Whole-file downloads as concurrent ranged parts (HTTP, S3), each checked, written in place.

One connection to an object store carries far less than a process can take in (S3's guidance:
~85-90 MB/s per connection, and parallel byte-range GETs for throughput), so :func:`download`
fetches a file of ``size`` bytes in parts of ``clamp(size / connections, PART_MIN, PART_MAX)``
bytes, at most ``connections`` of them in flight, and at most :data:`CONNECTIONS` for all the
downloads through one filesystem in a process, first come first served: the parts of the
download that started first go first, so a process that reads its shards one after another
gets the first one whole soonest and reads it while the next arrives. Every part is a checked
range read (:func:`wids.storage.answer.check_answer`): its ``Content-Range`` must be the part
asked for
and its total the file's size, and it carries ``If-Match`` (S3 ``IfMatch``) the etag every part
is pinned to, so a file replaced midway fails with
:class:`~wids.errors.IndexMismatchError` instead of mixing two versions. Each part has its own
retries and is written at its offset into ``dest`` as it arrives; memory holds at most
:data:`CONNECTIONS` parts per filesystem. ``dest`` is removed on any failure; publishing it
(atomically) is the caller's job, as for :meth:`Source.download
<wids.storage.source.Source.download>`.

Over a plain ``http(s)://`` URL (:mod:`wids.storage.http1`) the parts go on the plain client's
blocking connections, in this process's :data:`CONNECTIONS` part threads (a queue, so first
come first served as well; each thread keeps its connection between downloads), with the same
checks: about 0.6x the CPU per MB and the wall time of aiohttp's parts through a latency proxy
(``python tools/bench_download.py``), and a process that promotes shards never imports aiohttp.

No stat precedes the parts when the size is known (from the index): the index's etag, or else
the first answer's, pins the others; otherwise one stat gives them. Files whose answers do not
say their size and etag (GCS, chained URLs), local files, and files without an etag are
downloaded sequentially (:func:`wids.storage.streams.download`).

:func:`read_whole` reads a small whole file (an index, a member-table sidecar) into memory
with one request, not a stat and then a read: one round trip fewer for each index file a
process opens (every DataLoader worker loads the member tables of its shards).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from functools import partial
from typing import Any, Protocol

from .answer import Pin, check_answer, too_large
from .clients import gate as process_gate
from .clients import get as process_client
from .http1 import PlainTransport
from .objectstores import GcsTransport, S3Transport
from .retry import Attempts, retry_async, retry_sync
from .stats import FileStat, IOStats
from .streams import Readable
from .streams import download as download_stream
from .transport import HttpTransport, Transport

__all__ = ["CONNECTIONS", "PART_MAX", "PART_MIN", "download", "part_spans", "read_whole"]

PART_MIN = 4 << 20  # below this a part's round trip costs more than its transfer at the cap
PART_MAX = 8 << 20  # bounds the memory of a download: CONNECTIONS parts at most
CONNECTIONS = 8  # parts in flight per download, and per filesystem in a process


class Partable(Readable, Protocol):
    """What a parted download reads: a :class:`~wids.storage.source.Source`."""

    etag: str | None

    @property
    def answers_with_stat(self) -> bool:
        """Whether each range read's answer says the file's size and etag."""
        ...

    def _filesystem(self) -> tuple[Any, str]: ...

    def transport(self) -> Transport:
        """This process's transport of the file."""
        ...


def part_spans(
    size: int, connections: int = CONNECTIONS, part_size: int | None = None
) -> list[tuple[int, int]]:
    """The ``[start, end)`` parts of a file of ``size`` bytes (none for an empty file)."""
    if part_size is None:
        part_size = min(PART_MAX, max(PART_MIN, -(-size // max(1, connections))))
    return [(s, min(s + part_size, size)) for s in range(0, size, part_size)]


def download(
    source: Partable,
    dest: str,
    stats: IOStats | None,
    expected_size: int | None = None,
    *,
    connections: int = CONNECTIONS,
    part_size: int | None = None,
    limit: int | None = None,
) -> FileStat:
    """Copy the whole file to local path ``dest`` in concurrent checked parts (see the module).

    Args:
        source: The file.
        dest: Where the copy goes; removed again if anything fails.
        stats: I/O counters (every part is a request).
        expected_size: The size the index records: an answer announcing another is refused.
        connections: Parts in flight at most.
        part_size: Bytes per part (the module's rule when ``None``).
        limit: The most bytes accepted (``None``: no bound); a larger file is refused before
            any part is fetched (:class:`~wids.errors.TooLargeError`).

    Returns:
        What the download knows of the file (its ``mtime`` only when a stat was needed).

    Raises:
        IndexMismatchError: The file's size is not ``expected_size``, or it changed midway.
        ShortReadError, CorruptReadError, ShardNotFoundError, PermanentRemoteError,
            RetriesExhaustedError: As for a range read.
    """
    if connections < 1:
        raise ValueError(f"connections must be >= 1, got {connections!r}")
    if limit is not None and expected_size is not None and expected_size > limit:
        raise too_large(source.url, expected_size, limit)
    if source.is_local or not source.answers_with_stat:
        return download_stream(source, dest, stats, expected_size, limit)
    transport = source.transport()
    # parts need checked answers: on an event loop (the obstore transport's too), or on the
    # plain client's blocking connections in threads (no aiohttp: storage/http1.py)
    parted = getattr(transport, "parted", False) or _threaded(transport)
    if not parted and not isinstance(transport, (HttpTransport, S3Transport, GcsTransport)):
        http = getattr(transport, "http", None)  # plain connections: aiohttp's for downloads
        if not isinstance(http, HttpTransport):
            return download_stream(source, dest, stats, expected_size, limit)
        transport = http
    if expected_size is None:  # the parts need the size: one stat
        stat = source.info(stats)
        if limit is not None and stat.size > limit:
            raise too_large(source.url, stat.size, limit)
        if stat.etag is None:  # nothing ties parts to one version: one sequential pass
            return download_stream(source, dest, stats, expected_size, limit)
    else:  # no stat: the first answer's etag pins the others (each answer is compared)
        stat = FileStat(expected_size, source.etag, None)
    gcs = isinstance(transport, GcsTransport) or getattr(transport, "gcs", False)
    etag = None if gcs else stat.etag  # GCS: its generation
    pin = Pin(source.url, stat.size, etag, indexed=expected_size is not None)
    spans = part_spans(stat.size, connections, part_size)
    _fetch_all(pin, transport, spans, dest, connections, source, stats)
    if not pin.pinned and len(spans) > 1:  # no etag, no date: parts may mix versions
        return download_stream(source, dest, stats, expected_size, limit)
    # the version's date: a stat's, or what the first answer said (Last-Modified) where the
    # server gives no etag, which a cache entry records (wids.cache.entries)
    version = stat.etag if gcs else pin.etag
    return FileStat(stat.size, version, stat.mtime if stat.mtime is not None else pin.since)


def _fetch_all(
    pin: Pin,
    transport: Transport,
    spans: list[tuple[int, int]],
    dest: str,
    connections: int,
    source: Partable,
    stats: IOStats | None,
) -> None:
    """Fetch ``spans`` of the file into ``dest`` (created), which is removed on failure."""
    if _threaded(transport):
        _fetch_threaded(pin, transport, spans, dest, connections, source, stats)
        return
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    owner = _Descriptor(fd)
    try:
        if spans:
            jobs = [
                (s, e, source.attempts(f"could not read bytes {s}-{e}", stats)) for s, e in spans
            ]
            loop = transport.fs.loop
            import fsspec.asyn  # here, not at import: local reads never need it

            fsspec.asyn.sync(loop, _fetch_parts, jobs, pin, transport, owner, connections)
    except BaseException:
        try:
            os.unlink(dest)
        except FileNotFoundError:
            pass
        raise
    finally:
        owner.release_unused()


class _Descriptor:
    """The temp file's one descriptor, opened by the caller and closed exactly once.

    The parts write through it, never through ``dest``'s path: a caller interrupted before
    the coroutine started (or while parts are in flight) removes ``dest``, and a new file at
    that path never receives a late part. Whoever comes second closes it: the coroutine when
    it ends, or the caller if the coroutine never started (it then writes nothing).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        self._started = self._closed = False

    def start(self) -> bool:
        """Called by the coroutine first: whether it may write (the caller has not given up)."""
        with self._lock:
            self._started = not self._closed
            return self._started

    def close(self) -> None:
        """Called by the coroutine when it ends (it started)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fd)

    def release_unused(self) -> None:
        """Called by the caller when it stops waiting: close it unless the coroutine has it."""
        with self._lock:
            if not self._started and not self._closed:
                self._closed = True
                os.close(self.fd)


def _nbytes(data: bytes) -> int:
    return len(data)


def _threaded(transport: Transport) -> bool:
    """Whether ``transport``'s parts go on blocking connections in threads (plain HTTP)."""
    return isinstance(transport, PlainTransport) and transport.pool is not None


def _part_threads() -> _Threads:
    """This process's :data:`CONNECTIONS` threads for plain parts (made on first use).

    Shared by every download of the process, first come first served (a queue): each
    thread keeps its own kept-alive connection to a server between downloads.
    """
    return process_client((os.getpid(), "parts-threads"), lambda: _Threads(CONNECTIONS))


class _Threads:
    """At most ``size`` daemon threads running submitted calls in order (a FIFO queue).

    Daemon threads, unlike a ``ThreadPoolExecutor``'s: a process exiting while a download
    is queued (a warm-up's, a promotion's) does not wait for it, as it never waited for the
    event loop's parts (fsspec's loop thread is a daemon too).
    """

    def __init__(self, size: int) -> None:
        self._size, self._started = size, 0
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Semaphore(0)  # threads done with their call, not yet given one

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` in a thread when one is free; its future.

        A thread is started only when none is idle (at most ``size``): downloads one after
        another reuse the same threads, and their kept-alive connections.
        """
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        if self._idle.acquire(blocking=False):
            return future
        with self._lock:
            if self._started < self._size:
                self._started += 1
                name = f"wids-parts-{self._started}"
                threading.Thread(target=self._run, name=name, daemon=True).start()
        return future

    def _run(self) -> None:
        while True:
            future, fn, args = self._queue.get()
            if not future.set_running_or_notify_cancel():
                self._idle.release()
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the submitter's to see
                self._idle.release()  # idle before its submitter hears: a next call reuses it
                future.set_exception(exc)
            else:
                self._idle.release()
                future.set_result(result)


class _Parts:
    """One threaded download: its spans, the descriptor they are written through, errors.

    ``connections`` runners (jobs of :func:`_part_threads`) take the next span in file order
    until none is left or one failed. The descriptor is closed by whoever is last: the
    caller, or a runner still writing after the caller stopped waiting (interrupted); a
    runner never starts a part after that.
    """

    def __init__(
        self,
        fd: int,
        pin: Pin,
        transport: Transport,
        jobs: list[tuple[int, int, Attempts]],
    ) -> None:
        self.fd, self.pin, self.transport = fd, pin, transport
        self.jobs, self.next = jobs, 0
        self.errors: list[tuple[int, BaseException]] = []
        self.stopped = False
        self.holders = 1  # the caller; each runner once submitted (hold())
        self._lock = threading.Lock()

    def hold(self) -> None:
        """One more holder of the descriptor (a runner about to be submitted)."""
        with self._lock:
            self.holders += 1

    def take(self) -> tuple[int, int, int, Attempts] | None:
        """The next part ``(number, start, end, attempts)``, or ``None`` (done, or stopped)."""
        with self._lock:
            if self.stopped or self.next >= len(self.jobs):
                return None
            number = self.next
            self.next += 1
        return (number, *self.jobs[number])

    def run(self) -> None:
        """A runner: fetch and write parts until none is left; the first error stops all."""
        try:
            while (job := self.take()) is not None:
                number, start, end, attempts = job
                try:
                    data = retry_sync(attempts, partial(self._get, start, end), _nbytes)
                    _write_at(self.fd, data, start)
                except BaseException as exc:  # handed to the caller; the others stop
                    with self._lock:
                        self.errors.append((number, exc))
                        self.stopped = True
                    return
        finally:
            self.release()

    def _get(self, start: int, end: int) -> bytes:
        answer = self.transport.get_sync(start, end, self.pin)
        return check_answer(self.pin, answer, start, end)

    def stop(self) -> None:
        """No part starts from now on (parts in flight are still written)."""
        with self._lock:
            self.stopped = True

    def release(self) -> None:
        """One holder is done with the descriptor: the last one closes it."""
        with self._lock:
            self.holders -= 1
            last = self.holders == 0
        if last:
            os.close(self.fd)


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _fetch_threaded(
    pin: Pin,
    transport: Transport,
    spans: list[tuple[int, int]],
    dest: str,
    connections: int,
    source: Partable,
    stats: IOStats | None,
) -> None:
    """:func:`_fetch_all` on the plain client: parts on blocking connections in threads.

    The same parts, checks (:func:`~wids.storage.answer.check_answer` against one pin), bounds
    (``connections`` per download, :data:`CONNECTIONS` per process, first come first served)
    and clean-up (``dest`` removed on failure) as the event loop's.
    """
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    jobs = [(s, e, source.attempts(f"could not read bytes {s}-{e}", stats)) for s, e in spans]
    runners = min(connections, len(jobs))
    parts = _Parts(fd, pin, transport, jobs)
    try:
        threads = _part_threads()
        futures = []
        for _ in range(runners):
            parts.hold()
            try:
                futures.append(threads.submit(parts.run))
            except BaseException:  # (an interpreter shutting down): it never runs
                parts.release()
                raise
        wait(futures)
        if parts.errors:  # the first part (in file order) that failed
            raise min(parts.errors, key=lambda found: found[0])[1]
    except BaseException:
        parts.stop()
        try:
            os.unlink(dest)
        except FileNotFoundError:
            pass
        raise
    finally:
        parts.release()


async def _fetch_parts(
    jobs: list[tuple[int, int, Attempts]],
    pin: Pin,
    transport: Transport,
    dest: _Descriptor,
    connections: int,
) -> None:
    """Fetch every part (``connections`` at once) and write it at its offset; first error wins.

    The descriptor is closed when this coroutine ends, not by a caller that stopped waiting
    (interrupted): it is never closed under a part still being written.
    """
    if not dest.start():
        return
    try:
        await _write_parts(jobs, pin, transport, dest.fd, connections)
    finally:
        dest.close()


async def _write_parts(
    jobs: list[tuple[int, int, Attempts]],
    pin: Pin,
    transport: Transport,
    fd: int,
    connections: int,
) -> None:
    gate = asyncio.Semaphore(connections)
    # the parts in flight of every download through this filesystem in this process (FIFO)
    shared = process_gate(f"parts-{id(transport.fs)}", CONNECTIONS)
    await transport.prepare()

    async def one(start: int, end: int, attempts: Attempts) -> None:
        async with gate, shared:

            async def op() -> bytes:
                return check_answer(pin, await transport.get(start, end, pin), start, end)

            data = await retry_async(attempts, op, _nbytes, None)
        _write_at(fd, data, start)

    tasks = [asyncio.ensure_future(one(*job)) for job in jobs]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:  # the first part (in file order) that failed, not one cancelled for it
        if t in done and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


def read_whole(source: Partable, stats: IOStats | None = None, limit: int | None = None) -> bytes:
    """The whole (small) file, read with one request (plus retries); locally with a stat.

    Args:
        source: The file.
        stats: I/O counters.
        limit: The most bytes accepted (``None``: no bound). A larger file is refused from its
            announced size, or once its body passes the bound, never read whole; an encoded
            answer (``Content-Encoding``) is refused, as decoding could expand it without bound.

    Raises:
        TooLargeError: The file is larger than ``limit``.
        ShardNotFoundError, PermanentRemoteError, RetriesExhaustedError: As for a range read.
    """
    if source.is_local:
        size = source.info(stats).size
        if limit is not None and size > limit:
            raise too_large(source.url, size, limit)
        return source.read_range(0, size, stats)
    transport = source.transport()
    attempts = source.attempts("could not read it", stats)
    if transport.asynchronous and not transport.direct:

        def op() -> Any:
            return transport.get_whole(limit)

        import fsspec.asyn  # here, not at import: local reads never need it

        data: bytes = fsspec.asyn.sync(
            transport.fs.loop, retry_async, attempts, op, _nbytes, transport.prepare
        )
        return data
    return retry_sync(attempts, lambda: transport.get_whole_sync(limit), _nbytes)
