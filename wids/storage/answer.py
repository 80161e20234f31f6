"""What one ranged read's answer says, the version a file's reads are pinned to, and the check.

Every transport (:mod:`wids.storage.transport`) returns an :class:`Answer`: the bytes and what
the answer said of the file (its total size, its version: an etag, or GCS's generation, and
its modification time) and of itself (the range it holds). :func:`check_answer` is the one
check of an answer against what was asked and against the file's :class:`Pin`:

- the body is exactly as long as the range (short: :class:`~wids.errors.ShortReadError`,
  retried; longer: the server ignores ``Range``, :class:`~wids.errors.RangeNotSupportedError`);
- the answer's ``Content-Range`` is the range asked for (else
  :class:`~wids.errors.CorruptReadError`, retried); a whole file (HTTP 200) for a range that
  does not start at 0 is refused the same way;
- its total size, version and (when it has no version) modification time are the pinned ones:
  else :class:`~wids.errors.IndexMismatchError`, never bytes of two versions.

A :class:`Pin` is the version of one file this process reads: the index's size and etag (or
mtime) when the index records them, completed by the first answer that says more; it is owned
by the file's :class:`~wids.storage.source.Store` (one per URL), so every reader of the file in
the process shares it. Transports make their requests conditional on it (``If-Match`` the
etag, else ``If-Unmodified-Since`` the first answer's ``Last-Modified``; S3 ``IfMatch``; GCS
``generation=``): a replaced file is refused by the server where it can, by the check where
it cannot. The tar-header check of the bytes stays with the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate

from ..errors import (
    CorruptReadError,
    IndexMismatchError,
    RangeNotSupportedError,
    ShortReadError,
    TooLargeError,
)
from .redact import redact_url
from .stats import FileStat, comparable_etag

Check = Callable[[bytes], "str | None"]
"""A check of the bytes of one range read: ``None`` if they are right, else what is wrong."""

__all__ = [
    "Answer",
    "Check",
    "Pin",
    "RangeFallbackWarning",
    "changed",
    "check_answer",
    "check_length",
    "check_range",
    "checked",
    "ignores_range",
    "too_large",
]


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer to a ranged read.

    Attributes:
        data: The body.
        size: The file's total size the answer announces (``Content-Range`` total, or the
            length of a whole-file answer), if it says.
        version: The file's version it announces: an etag (HTTP, S3) or a generation (GCS).
        mtime: The file's modification time it announces (``Last-Modified``), if any.
        span: The ``[start, end)`` the answer says it holds (``Content-Range``); ``None`` if it
            does not say (a whole-file answer, or a transport that shows no headers).
        whole: The answer is the whole file (HTTP 200), not a range.
        raw_range: The ``Content-Range`` as sent, for messages (``""`` if none).
    """

    data: bytes
    size: int | None = None
    version: str | None = None
    mtime: float | None = None
    span: tuple[int, int] | None = None
    whole: bool = False
    raw_range: str = ""


def parse_content_range(value: str | None) -> tuple[tuple[int, int] | None, int | None, bool]:
    """``(span, total, valid)`` of a ``Content-Range`` value (``bytes a-b/N``, ``bytes */N``)."""
    if not value:
        return None, None, True
    unit, _, rest = value.strip().partition(" ")
    span_text, _, total_text = rest.partition("/")
    total = _decimal(total_text)
    if unit != "bytes" or (total is None and total_text.strip() != "*"):
        return None, total, False
    if span_text.strip() == "*":
        return None, total, True
    first, _, last = (_decimal(text) for text in span_text.partition("-"))
    if first is None or last is None:
        return None, total, False
    return (first, last + 1), total, True


def _decimal(text: str) -> int | None:
    """The plain decimal number ``text`` holds (at most 19 ASCII digits), else ``None``.

    A server's number: ``int`` alone takes signs, ``_`` and other scripts' digits, and raises
    ``ValueError`` past 4,300 digits (a hostile ``Content-Range`` then crashed the read).
    """
    text = text.strip()
    return int(text) if 0 < len(text) <= 19 and text.isascii() and text.isdigit() else None


class Pin:
    """The version of one file that this process reads (see the module).

    Args:
        url: The file.
        size: Its size, if known (the index's).
        etag: Its etag, if known (the index's); a GCS generation is learnt from answers.
        mtime: Its modification time, if known (the index's): compared only with answers
            that carry no version, as :meth:`wids.index.Fingerprint.mismatch` does.
        indexed: Whether ``size``/``etag``/``mtime`` come from an index (messages then say
            that the file is not the indexed one, until an answer has matched them).
    """

    __slots__ = ("_lock", "confirmed", "etag", "indexed", "mtime", "since", "size", "url")

    def __init__(
        self,
        url: str,
        size: int | None = None,
        etag: str | None = None,
        mtime: float | None = None,
        *,
        indexed: bool = False,
    ) -> None:
        self.url, self.size, self.etag, self.mtime = url, size, etag, mtime
        self.since: float | None = None  # Last-Modified of an answer without a version
        self.indexed = indexed and (size is not None or etag is not None or mtime is not None)
        self.confirmed = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Pin({redact_url(self.url)!r}, size={self.size}, etag={self.etag!r})"

    @property
    def wants_date(self) -> bool:
        """Whether the next answer's date is needed even if it has an etag (none known yet)."""
        return self.mtime is None and self.since is None

    @property
    def pinned(self) -> bool:
        """Whether answers are tied to one version (an etag or generation, else a date)."""
        return self.etag is not None or self.since is not None

    def if_match(self) -> str | None:
        """The ``If-Match`` value: the pinned etag quoted; ``None`` for none or a weak one.

        Also ``None`` for an etag no header can carry (control or non-ASCII characters, from
        a hostile index or server): sent, a line break would add headers of its choosing.
        Every answer's etag is still compared with the pinned one (:func:`check_answer`).
        """
        etag = self.etag
        if etag is None or etag.strip().startswith("W/"):
            return None
        if not (etag.isascii() and etag.isprintable()):
            return None
        return f'"{comparable_etag(etag)}"'

    def if_unmodified_since(self) -> str | None:
        """The ``If-Unmodified-Since`` value while no etag pins the file (its first date)."""
        if self.etag is not None or self.since is None:
            return None
        return formatdate(self.since, usegmt=True)

    def stat(self) -> FileStat | None:
        """What the pin knows of the file as a stat (``None`` without a size)."""
        if self.size is None:
            return None
        return FileStat(self.size, self.etag, self.since if self.since is not None else self.mtime)

    def expect(self, size: int | None, etag: str | None, mtime: float | None) -> bool:
        """Add what another reader of the file expects; ``False`` if it contradicts the pin."""
        with self._lock:
            if size is not None and self.size is not None and size != self.size:
                return False
            if etag is not None and self.etag is not None:
                if comparable_etag(etag) != comparable_etag(self.etag):
                    return False
            if size is not None and self.size is None:
                self.size, self.indexed = size, True
            if etag is not None and self.etag is None:
                self.etag, self.since, self.indexed = etag, None, True
            if mtime is not None and self.mtime is None:
                self.mtime = mtime
            return True

    def differs(self, what: str) -> IndexMismatchError:
        """The error for an answer that is not the pinned version (``what`` differs)."""
        if self.indexed and not self.confirmed:
            return IndexMismatchError(
                f"not the shard the index describes: {what}; it changed after indexing, so "
                "rebuild the index",
                shard=redact_url(self.url),
            )
        return changed(self.url, what)

    def learn(self, size: int | None, version: str | None, mtime: float | None) -> None:
        """Compare what an answer says of the file with the pin, and pin what it adds.

        Raises:
            IndexMismatchError: Another size, version, or (without a version) date.
        """
        with self._lock:
            was = "the index says" if self.indexed and not self.confirmed else "it was"
            if size is not None:
                if self.size is None:
                    self.size = size
                elif size != self.size:
                    raise self.differs(f"its size is {size} bytes where {was} {self.size}")
            if version is not None:
                if self.etag is None:
                    self.etag = version
                    self.since = None
                elif comparable_etag(version) != comparable_etag(self.etag):
                    raise self.differs(f"its etag is {version!r} where {was} {self.etag!r}")
                if self.mtime is None and mtime is not None:  # the pinned version's date, for
                    self.mtime = mtime  # a later answer without an etag (a server that drops it)
            elif mtime is not None:
                known = self.since if self.since is not None else self.mtime
                if known is not None and not _same_time(mtime, known):
                    raise self.differs(
                        f"it was modified at {formatdate(mtime, usegmt=True)} where {was} "
                        f"{formatdate(known, usegmt=True)}"
                    )
                if self.etag is None and self.since is None:
                    self.since = mtime
            self.confirmed = True

    def refused(self, condition: str) -> IndexMismatchError:
        """The error for a conditional request the server refused (412 and the like)."""
        if "If-Unmodified-Since" in condition:
            return self.differs(f"it was modified since it was pinned ({condition})")
        return self.differs(f"its etag is not {self.etag!r} any more ({condition})")


def _same_time(a: float, b: float) -> bool:
    # Last-Modified has whole seconds where a file system has nanoseconds
    if float(a).is_integer() or float(b).is_integer():
        return int(a) == int(b)
    return abs(a - b) <= 1e-6


def changed(url: str, what: str) -> IndexMismatchError:
    """The error for a file that changed while it was read (``what`` says how we know)."""
    return IndexMismatchError(
        f"the file changed while it was read ({what}); rebuild the index if the change is intended",
        shard=redact_url(url),
    )


class RangeFallbackWarning(UserWarning):
    """A server ignores ``Range``: wids reads its shards whole instead (once per server).

    Not an error: the dataset, member handles and ``wids index verify`` read such a shard with
    one streaming request (into the shard cache when there is one), and say so once.
    """


def ignores_range(url: str, start: int, end: int, got: int) -> RangeNotSupportedError:
    """The error for an answer longer than the range ``[start, end)`` asked for."""
    return RangeNotSupportedError(
        f"range {start}-{end}: got {got} bytes for {end - start}; the server ignores Range",
        shard=redact_url(url),
    )


def too_large(url: str, size: int, limit: int) -> TooLargeError:
    """The error for a whole-file read of more than ``limit`` bytes."""
    return TooLargeError(
        f"is {size} bytes or more, over the limit of {limit} bytes for this kind of file "
        "(raise it with wids.ReadLimits if the file is meant to be this large)",
        shard=redact_url(url),
    )


def check_length(url: str, data: bytes, start: int, end: int) -> bytes:
    """``data`` if it is exactly the range ``[start, end)`` long, else the error it is."""
    n = end - start
    if len(data) < n:
        raise ShortReadError(
            f"range {start}-{end}: got {len(data)} of {n} bytes", shard=redact_url(url)
        )
    if len(data) > n:
        raise ignores_range(url, start, end, len(data))
    return data


def check_answer(pin: Pin, answer: Answer, start: int, end: int) -> bytes:
    """The bytes of ``answer`` to the range ``[start, end)``, checked (see the module).

    The file's part first (size, version), so a replaced file is reported as such, not as a
    bad range; then the answer's own (whole file, ``Content-Range``, length).
    """
    pin.learn(answer.size, answer.version, answer.mtime)
    url = pin.url
    if answer.whole and start > 0 and len(answer.data) == end - start:
        raise CorruptReadError(
            f"asked for bytes {start}-{end} and got a whole file (HTTP 200) of that length",
            shard=redact_url(url),
        )
    check_length(url, answer.data, start, end)
    if answer.span is not None and answer.span != (start, end):
        raise CorruptReadError(
            f"asked for bytes {start}-{end}, the answer's Content-Range is "
            f"{answer.raw_range or answer.span!r}",
            shard=redact_url(url),
        )
    return answer.data


def checked(url: str, data: bytes, start: int, end: int, check: Check | None) -> bytes:
    """``data`` if ``check`` accepts it (or there is none), else :class:`CorruptReadError`."""
    if check is not None:
        problem = check(data)
        if problem is not None:
            raise CorruptReadError(
                f"bytes {start}-{end} are not the ones asked for: {problem}",
                shard=redact_url(url),
            )
    return data


def check_range(start: int, end: int) -> None:
    """Refuse a range that is not ``0 <= start <= end`` in ints."""
    if not (isinstance(start, int) and isinstance(end, int)):
        raise TypeError(f"start and end must be int, not {type(start)} and {type(end)}")
    if start < 0 or end < start:
        raise ValueError(f"bad range {start}-{end}")
