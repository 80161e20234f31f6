"""Is this file still the shard the index recorded? The one answer, used everywhere.

- :class:`Fingerprint` — what identifies a shard's bytes (size, etag, mtime, md5) with one
  rule, :meth:`Fingerprint.mismatch` / :meth:`Fingerprint.matches`, for comparing it with what
  the storage says now. The dataset's first touch, ``wids index verify``, incremental builds,
  the scan cache, the shard cache's entries and subset copies all compare through it. A
  recorded MD5 tells a copy with new timestamps from a same-size rewrite:
  :meth:`Fingerprint.needs_content` says when only the bytes can
  (:mod:`wids.index.contents` reads them once and asks :meth:`Fingerprint.mismatch` again),
  and an S3 etag that is an MD5 is compared with it (:func:`etag_md5`).
- :func:`header_mismatch_at_spot` — the tar header of one recorded member, read back: a shard
  replaced by another of the same size with its modification time restored passes the
  fingerprint but not this.
- :func:`unchanged` — both, strictly: whether a member table recorded earlier may be reused
  for a file without rescanning it (incremental builds, a resumed :class:`~wids.ShardWriter`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from ..errors import WidsError
from ..storage import comparable_etag
from .members import BLOCK, ShardMembers

__all__ = [
    "Fingerprint",
    "Observed",
    "etag_md5",
    "header_mismatch_at_spot",
    "spot_member",
    "unchanged",
]


class Observed(Protocol):
    """What a stat of the file says now (a :class:`~wids.storage.FileStat`, a fingerprint)."""

    @property
    def size(self) -> int | None: ...  # noqa: D102

    @property
    def etag(self) -> str | None: ...  # noqa: D102

    @property
    def mtime(self) -> float | None: ...  # noqa: D102


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What identifies a shard's bytes, as recorded when it was indexed (or fetched).

    Attributes:
        size: Size in bytes, if known.
        etag: The storage's etag, if it reported one (compared through
            :func:`wids.storage.comparable_etag`).
        mtime: Modification time (seconds since the epoch), if known.
        md5: Hex MD5 of the whole file, if known.
    """

    size: int | None = None
    etag: str | None = None
    mtime: float | None = None
    md5: str | None = None

    @classmethod
    def of(cls, stat: Observed) -> Fingerprint:
        """The fingerprint a stat gives (a :class:`~wids.storage.FileStat`: no md5)."""
        if isinstance(stat, Fingerprint):
            return stat
        return cls(stat.size, stat.etag, stat.mtime, getattr(stat, "md5", None))

    def matches(self, now: Observed, *, data_end: int | None = None, strict: bool = False) -> bool:
        """Whether ``now`` is the same file: :meth:`mismatch` finds nothing."""
        return self.mismatch(now, data_end=data_end, strict=strict) is None

    def mismatch(
        self, now: Observed, *, data_end: int | None = None, strict: bool = False
    ) -> str | None:
        """What differs between this recorded fingerprint and the file as it is ``now``.

        The rule, in order:

        1. The size must be the recorded one (and hold ``data_end``).
        2. MD5s, when both sides know one, decide: equal bytes are the shard, whatever else
           changed (a copy with new timestamps, an upload's new etag).
        3. Etags, when both sides have one, equal: the shard.
        4. A recorded MD5 and an etag that is a plain MD5 (32 hex digits, no ``-N``
           multipart suffix: an S3 object uploaded in one part) decide as 2. (An object
           encrypted with SSE-KMS or SSE-C has such an etag that is no MD5: its index must
           record its etag, ``wids index create s3://...``.)
        5. Etags that differ: not the shard.
        6. A store without etags (local files, HTTP servers that send none): the
           modification time. One that differs is a copy with new timestamps or a rewrite;
           with a recorded MD5 the file's bytes can tell (:meth:`needs_content`), without
           one the message says so.
        7. A store that gives an etag where the record has neither etag nor MD5 holds a copy
           made elsewhere (a local dataset uploaded to S3): its modification time is the
           upload's, so only the size is compared (and the member header, see
           :func:`header_mismatch_at_spot`).

        Args:
            now: What the storage says now (a :class:`~wids.storage.FileStat`: ``size``,
                ``etag``, ``mtime``, maybe ``md5``), or another fingerprint.
            data_end: End of the shard's last member's data, when a member table is at hand:
                the file must be at least this long.
            strict: Require a positive identification (a size and an etag, mtime or MD5 to
                compare), as reusing a member table without rescanning does; otherwise what
                cannot be compared passes.

        Returns:
            ``None`` when the file is the recorded one, else what differs, for an error message.
        """
        now = Fingerprint.of(now)
        if self.size is not None and now.size is not None and now.size != self.size:
            return f"its size is {now.size} bytes where the index says {self.size}"
        if data_end is not None and now.size is not None and data_end > now.size:
            return f"it is {now.size} bytes but the index has members up to byte {data_end}"
        sized = None if self.size is not None or not strict else "the index records no size"
        if self.md5 is not None and now.md5 is not None:
            if self.md5.lower() != now.md5.lower():
                return (
                    f"its contents changed (same size, other bytes): its md5 is {now.md5} "
                    f"where the index says {self.md5}"
                )
            return sized
        if self.etag is not None and now.etag is not None:
            if comparable_etag(now.etag) == comparable_etag(self.etag):
                return sized
        tag_md5 = etag_md5(now.etag)
        if self.md5 is not None and tag_md5 is not None:
            if tag_md5 != self.md5.lower():
                return (
                    f"its etag {now.etag!r} (the MD5 of an object uploaded in one part) is not "
                    f"the md5 {self.md5} the index records: its contents changed (or the "
                    "bucket encrypts with SSE-KMS/SSE-C, whose etags are no MD5s: then index "
                    "the uploaded shards, wids index create s3://...)"
                )
            return sized
        if self.etag is not None and now.etag is not None:
            return f"its etag is {now.etag!r} where the index says {self.etag!r}"
        if self.mtime is not None and now.mtime is not None and now.etag is None:
            if not _same_mtime(float(now.mtime), float(self.mtime)):
                return _modified(now.mtime, self.mtime, self.md5 is not None)
            return sized
        if strict:
            return "the index records neither an etag nor a modification time to compare"
        return None

    def needs_content(self, now: Observed, *, data_end: int | None = None) -> bool:
        """Whether only the file's bytes can settle :meth:`mismatch`: a copy or a rewrite?

        True when the only difference is the modification time (same size, no etag) and
        the record has an MD5 that ``now`` lacks: read the file, and ask :meth:`mismatch`
        again with its MD5 (:func:`wids.index.contents.settle`).
        """
        now = Fingerprint.of(now)
        return (
            self.md5 is not None
            and now.md5 is None
            and now.etag is None
            and self.mismatch(now, data_end=data_end) is not None
            and self.mismatch(replace(now, mtime=self.mtime), data_end=data_end) is None
        )


def etag_md5(etag: str | None) -> str | None:
    """The MD5 an etag is, when it looks like one: 32 hex digits, strong, no ``-N`` suffix.

    S3 gives an object uploaded in one part the MD5 of its bytes as its etag (unless it is
    encrypted with SSE-KMS or SSE-C); a multipart upload's etag ends in ``-<parts>``.
    """
    if etag is None or etag.strip().startswith("W/"):
        return None
    tag = comparable_etag(etag) or ""
    return tag.lower() if _MD5_HEX.fullmatch(tag) else None


_MD5_HEX = re.compile(r"[0-9a-fA-F]{32}")


def _modified(now: float, then: float, has_md5: bool) -> str:
    said = f"it was modified at {_when(now)} where the index says {_when(then)}"
    if has_md5:
        return f"{said} (same size; its contents were not compared)"
    return (
        f"{said}, and the index records no md5 to tell a copy with new timestamps (cp -r, "
        "rsync without -t, docker COPY) from a rewrite of the same size"
    )


def _same_mtime(a: float, b: float) -> bool:
    # HTTP's Last-Modified has whole seconds where a file system has nanoseconds: when either
    # side is whole, compare at that resolution.
    if a.is_integer() or b.is_integer():
        return int(a) == int(b)
    return abs(a - b) <= 1e-6


def _when(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f" UTC ({t!r})"
    except (OverflowError, OSError, ValueError):
        return repr(t)


def spot_member(members: ShardMembers) -> tuple[str, int, int] | None:
    """The member whose tar header is checked when a shard is opened: ``(name, offset, size)``.

    The last sample's first member: near the end of the shard, and fixed, so every process
    checks the same bytes. ``None`` for a shard without samples.
    """
    n = len(members)
    if n == 0:
        return None
    j = int(members.sample_start[n - 1])
    name = members.key(n - 1) + members.fields[int(members.member_field[j])]
    return name, int(members.member_offset[j]), int(members.member_size[j])


def header_mismatch_at_spot(members: ShardMembers, read: Callable[[int, int], bytes]) -> str | None:
    """Check the tar header of the shard's :func:`spot_member` with one 512-byte read.

    A shard replaced by another of the same size with its modification time restored passes
    :meth:`Fingerprint.mismatch`; its members' headers do not match the index.

    Args:
        members: The shard's member table.
        read: ``read(start, end)`` returns exactly those bytes of the shard.

    Returns:
        ``None`` when the header is the recorded member's, else what is wrong.
    """
    spot = spot_member(members)
    if spot is None:
        return None
    from ..tar import header_mismatch

    name, offset, size = spot
    if offset < BLOCK:
        return f"member {name!r} at byte {offset} leaves no room for its header"
    problem = header_mismatch(read(offset - BLOCK, offset), name, size)
    if problem is None:
        return None
    return f"at byte {offset - BLOCK}, {problem}"


def unchanged(
    recorded: Fingerprint,
    members: ShardMembers,
    now: Observed,
    read: Callable[[int, int], bytes],
) -> bool:
    """Whether a file is positively the shard recorded earlier: fingerprint and a header.

    What reusing a member table without rescanning needs (strict: a size and an etag or mtime
    must match); a file that cannot be read is not positively the shard.

    Args:
        recorded: The shard's fingerprint when its ``members`` were recorded.
        members: The member table recorded then.
        now: What the storage says of the file now.
        read: ``read(start, end)`` returns exactly those bytes of the file.
    """
    if recorded.mismatch(now, strict=True) is not None:
        return False
    try:
        return header_mismatch_at_spot(members, read) is None
    except WidsError:
        return False
