"""HTTP/1.1 message heads and bodies relayed as they come, paced: the latency proxy's wire part.

A head is kept raw (start line and headers in order), so a request is forwarded byte for byte
apart from its hop-by-hop headers; a body is copied by its framing (``Content-Length``,
chunked, or until the connection closes), optionally released no faster than a byte rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["CHUNK", "HOP_BY_HOP", "Message", "Pacer", "is_chunked", "relay_body"]

CHUNK = 256 * 1024
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"expect"}


class Message:
    """A request's or response's head: start line and headers (raw, order kept).

    Parsed once: a name -> value map (lowercase names, the first of repeats) for lookups, and
    the raw head kept to forward unchanged when it has no hop-by-hop header to drop.
    """

    __slots__ = ("_hop", "by_name", "headers", "raw", "start")

    def __init__(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.raw = head
        self.start = lines[0]
        self.headers: list[tuple[bytes, bytes]] = []
        self.by_name: dict[bytes, bytes] = {}
        hop = False
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(b":")
                name, value = name.strip(), value.strip()
                self.headers.append((name, value))
                low = name.lower()
                self.by_name.setdefault(low, value)
                hop = hop or low in HOP_BY_HOP
        self._hop = hop

    def get(self, name: bytes) -> bytes | None:
        return self.by_name.get(name.lower())

    def encode(self, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
        """The head with hop-by-hop headers replaced by ``extra``."""
        if not self._hop and not extra:
            return self.raw if self.raw.endswith(b"\r\n\r\n") else self.raw + b"\r\n\r\n"
        kept = [(k, v) for k, v in self.headers if k.lower() not in HOP_BY_HOP]
        lines = [self.start] + [k + b": " + v for k, v in kept + (extra or [])]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def closes(self) -> bool:
        """The sender asked to close the connection after this message."""
        value = (self.by_name.get(b"connection") or b"").lower()
        return b"close" in value or self.start.endswith(b"HTTP/1.0") and b"keep-alive" not in value


# uvloop keeps timers in whole milliseconds, rounded to the nearest: a sleep may end up to
# 0.5 ms early. Every wait that is a lower bound (the delay, a paced byte) adds this margin.
TIMER_MARGIN = 0.001


class Pacer:
    """Releases a body at ``rate`` bytes/s: byte ``n`` no earlier than ``t0 + n / rate``."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.t0 = time.monotonic()
        self.sent = 0

    async def wait(self, nbytes: int) -> None:
        """Wait until a chunk of ``nbytes`` may be complete at the client."""
        self.sent += nbytes
        if self.rate > 0:
            due = self.t0 + self.sent / self.rate - time.monotonic()
            if due > 0:
                await asyncio.sleep(due + TIMER_MARGIN)


def is_chunked(message: Message) -> bool:
    return b"chunked" in (message.get(b"transfer-encoding") or b"").lower()


async def relay_body(
    message: Message,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    pacer: Pacer | None,
    count: Callable[[int], None],
) -> None:
    """Copy ``message``'s body (by its framing) from ``reader`` to ``writer``.

    ``count`` gets each piece's payload bytes before the piece is written (so the counters
    are up to date by the time the client has the bytes).
    """

    async def put(data: bytes, payload: int) -> None:
        if pacer is not None:
            await pacer.wait(len(data))
        count(payload)
        writer.write(data)
        await writer.drain()

    length = message.get(b"content-length")
    if length is not None:
        left = int(length)
        while left > 0:
            try:  # whole pieces: one pacing wait and one write each
                data = await reader.readexactly(min(CHUNK, left))
            except asyncio.IncompleteReadError:
                raise ConnectionError("body ended early") from None
            left -= len(data)
            await put(data, len(data))
        return
    if is_chunked(message):
        while True:  # relay the chunked encoding as it is, counting payload bytes
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            await put(line, 0)
            if size == 0:
                while True:  # trailers, up to the empty line
                    line = await reader.readuntil(b"\r\n")
                    await put(line, 0)
                    if line == b"\r\n":
                        return
            got = 0
            while got < size + 2:  # the chunk and its CRLF
                data = await reader.readexactly(min(CHUNK, size + 2 - got))
                payload = max(0, min(got + len(data), size) - got)
                got += len(data)
                await put(data, payload)
    if message.start.startswith(b"HTTP/"):  # a response without framing: until EOF
        while data := await reader.read(CHUNK):
            await put(data, len(data))
