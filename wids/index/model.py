"""The index model: what is known about each shard, and what every index backend offers.

- :class:`ShardInfo` — one shard: URL, sample count, and what identifies its bytes (size, etag
  or mtime, md5: its :class:`~wids.index.fingerprint.Fingerprint`) so a changed shard is
  detected later.
- :class:`Component` — one (sub-)dataset of an index and its range of shards.
- :class:`IndexReader` and :class:`IndexWriter` — what every storage backend (JSON, SQLite)
  offers; :mod:`wids.index.registry` picks the backend for a file.
- :func:`check_entry` — what every writer checks before it records a shard, so an index
  written from offsets a tool already knows is as sound as a scanned one.
- :class:`BaseIndexWriter` — what the writers share: that protocol's checks (open, the
  entry), the report, the context manager; :func:`component_rows` for the ones keeping
  components as ranges of shards.
- The member table of a shard is :class:`~wids.index.members.ShardMembers`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..errors import IndexFormatError, NotAnIndexError, UntrustedLocationError
from .fingerprint import Fingerprint
from .members import ShardMembers

__all__ = [
    "REPAIR_HINT",
    "BaseIndexWriter",
    "Component",
    "IndexReader",
    "IndexWriter",
    "MAX_NSAMPLES",
    "MAX_SHARD_SIZE",
    "ShardInfo",
    "check_entry",
    "component_rows",
    "max_samples",
    "with_repair_hint",
]

REPAIR_HINT = "rebuild the index: wids index create SHARDS... -o INDEX --full"
"""What an error about a damaged or outdated index tells the user to do."""
MAX_SHARD_SIZE = 1 << 62
"""A shard's ``filesize`` is below this (the same bound as offsets in a member table)."""
MAX_NSAMPLES = MAX_SHARD_SIZE // 512
"""A shard's ``nsamples`` is at most this: every sample has a 512-byte header."""


def max_samples(size: int | None) -> int:
    """The most samples a tar of ``size`` bytes can hold.

    Each sample has at least one member, and a member takes at least its 512-byte header; the
    archive ends with at least one 512-byte zero block. Without a size, :data:`MAX_NSAMPLES`.
    """
    return MAX_NSAMPLES if size is None else max(0, size // 512 - 1)


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard as the index records it.

    Attributes:
        url: Where the shard is; readers return it resolved (absolute path or full URL).
        nsamples: Number of samples in the shard.
        size: Size in bytes, if known (``filesize`` in the JSON description).
        etag: The storage's etag when the shard was indexed, if it reports one.
        mtime: Modification time (seconds since the epoch) when indexed, if known.
        md5sum: Hex MD5 of the whole shard, if known.
    """

    url: str
    nsamples: int
    size: int | None = None
    etag: str | None = None
    mtime: float | None = None
    md5sum: str | None = None

    @property
    def fingerprint(self) -> Fingerprint:
        """What identifies the shard's bytes: its size, etag, mtime and md5."""
        return Fingerprint(self.size, self.etag, self.mtime, self.md5sum)


@dataclass(frozen=True, slots=True)
class Component:
    """One (sub-)dataset of a description and its range of shards.

    Attributes:
        name: The component's name (``""`` when it has none).
        weight: Its mixing weight, if the description gives one.
        first_shard: Index of its first shard in the description's shard list.
        stop_shard: One past its last shard.
    """

    name: str
    weight: float | None
    first_shard: int
    stop_shard: int

    @property
    def nshards(self) -> int:
        """Number of shards in the component."""
        return self.stop_shard - self.first_shard


def check_entry(
    info: ShardInfo, members: ShardMembers | None, *, tar_size: int | None = None
) -> None:
    """Check a shard's record, and its member table if given, before an index stores them.

    Every index writer calls this in ``add``. A :class:`ShardMembers` has already checked its
    own arrays (members in tar order, each after a 512-byte header, no overlaps, no negative
    sizes); this checks the record's values and that the table fits the record.

    Args:
        info: The shard's record.
        members: Its member table, or ``None``.
        tar_size: A compressed shard's decompressed tar size, when ``members`` is not given
            (a sidecar its build's worker wrote); ``members.seek`` says it otherwise.

    Raises:
        IndexFormatError: ``url`` is not a non-empty string; ``nsamples`` is not an ``int`` in
            ``[0, max_samples(size)]`` (a compressed shard: of its tar's size); ``size`` is
            not ``None`` or an ``int`` in ``[0, 2**62)``; ``etag``/``md5sum`` are not
            strings, ``mtime`` not a finite number; the table's sample count differs from
            ``nsamples``; or a member ends past ``size``.
    """
    if members is not None and members.seek is not None:
        tar_size = members.seek.uncompressed_size
    if tar_size is not None:  # a compressed shard: samples are bounded by its tar's size
        n = getattr(info, "nsamples", None)
        if type(n) is int and n > max_samples(tar_size):
            problem: str | None = (
                f"nsamples must be an int in [0, {max_samples(tar_size)}], got {n!r} (the "
                f"shard's {tar_size}-byte tar holds at most {max_samples(tar_size)} samples)"
            )
        else:
            ok = _entry_ok(info, members, False)
            problem = None if ok else _entry_problem(info, members, False)
    else:
        problem = None if _entry_ok(info, members) else _entry_problem(info, members)
    if problem is not None:
        from ..storage import redact_url

        url = getattr(info, "url", None)
        where = redact_url(url) if isinstance(url, str) and url else None
        raise IndexFormatError(problem, shard=where)
    if members is not None:
        try:
            members.check_extent(info.size)
        except IndexFormatError as e:
            from ..storage import redact_url

            raise IndexFormatError(e.message, shard=redact_url(info.url)) from None


def _entry_ok(info: ShardInfo, members: ShardMembers | None, by_size: bool = True) -> bool:
    """The common case in one expression (an index of 10**6 shards checks each one).

    ``by_size``: bound ``nsamples`` by the file's size (false: a compressed shard, bounded by
    its tar's size by the caller).
    """
    if type(info) is not ShardInfo:
        return False
    n, size, mtime = info.nsamples, info.size, info.mtime
    return bool(
        type(info.url) is str
        and info.url
        and type(n) is int
        and 0 <= n
        and (
            n <= MAX_NSAMPLES
            if size is None
            else type(size) is int
            and 0 <= size < MAX_SHARD_SIZE
            and (not by_size or n <= max(0, size // 512 - 1))
        )
        and (info.etag is None or type(info.etag) is str)
        and (info.md5sum is None or type(info.md5sum) is str)
        and (
            mtime is None
            or (type(mtime) in (int, float) and -MAX_SHARD_SIZE < mtime < MAX_SHARD_SIZE)
        )
        and (members is None or (type(members) is ShardMembers and len(members) == n))
    )


def _entry_problem(
    info: ShardInfo, members: ShardMembers | None, by_size: bool = True
) -> str | None:
    """What is wrong with a shard's record (not its extent), or ``None``."""
    if not isinstance(info, ShardInfo):
        return f"expected a ShardInfo, got {type(info).__name__}"
    url, n, size = info.url, info.nsamples, info.size
    if type(url) is not str or not url:
        return f"url must be a non-empty string, got {url!r}"
    if size is not None and (type(size) is not int or not 0 <= size < MAX_SHARD_SIZE):
        return f"size must be None or an int in [0, 2**62), got {size!r}"
    if type(n) is not int or not 0 <= n <= max_samples(size if by_size else None):
        limit = max_samples(size if by_size else None)
        return f"nsamples must be an int in [0, {limit}], got {n!r}" + (
            f" (a {size}-byte tar holds at most {limit} samples)" if size is not None else ""
        )
    for key in ("etag", "md5sum"):
        value = getattr(info, key)
        if value is not None and type(value) is not str:
            return f"{key} must be None or a string, got {value!r}"
    mtime = info.mtime
    if mtime is not None and (
        type(mtime) not in (int, float) or not -MAX_SHARD_SIZE < mtime < MAX_SHARD_SIZE
    ):
        return f"mtime must be None or a finite number, got {mtime!r}"
    if members is not None:
        if not isinstance(members, ShardMembers):
            return f"members must be a ShardMembers or None, got {type(members).__name__}"
        if len(members) != n:
            return f"member table has {len(members)} samples, nsamples is {n}"
    return None


def with_repair_hint(error: IndexFormatError) -> IndexFormatError:
    """``error`` (a damaged index) with what to do about it: :data:`REPAIR_HINT`."""
    if REPAIR_HINT in error.message or isinstance(error, (UntrustedLocationError, NotAnIndexError)):
        return error  # rebuilding cannot help an index that names local files, or a non-index
    return IndexFormatError(f"{error.message}; to repair, {REPAIR_HINT}", shard=error.shard)


class IndexReader(Protocol):
    """What an opened index offers, whatever its storage."""

    @property
    def name(self) -> str | None:
        """The dataset's name, if the index records one."""

    @property
    def shards(self) -> list[ShardInfo]:
        """All shards, with resolved URLs, in dataset order."""

    @property
    def components(self) -> list[Component]:
        """The (sub-)datasets and their shard ranges."""

    @property
    def report(self) -> dict[str, Any]:
        """The builder's report stored in the index (empty when none)."""

    @property
    def has_members(self) -> bool:
        """Whether any shard has a member table."""

    def shard_extra(self, shard: int) -> dict[str, Any]:
        """Keys recorded with a shard that the index format does not define."""

    def members(self, shard: int) -> ShardMembers | None:
        """The member table of one shard, loaded lazily; ``None`` if not recorded."""

    def close(self) -> None:
        """Release files held open."""


class IndexWriter(Protocol):
    """What every index writer offers: shards added in dataset order, published on close.

    Used as a context manager, a writer publishes on a normal exit and aborts on an error.
    """

    def __enter__(self) -> IndexWriter:
        """The writer itself."""

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """:meth:`close`, or :meth:`abort` if the block raised."""

    def start_component(self, name: str, weight: float | None = None) -> None:
        """Start a sub-dataset; shards added from now on belong to it."""

    def add(
        self,
        info: ShardInfo,
        members: ShardMembers | None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one shard (its ``url`` stored as given) and its member table, if any.

        Raises:
            IndexFormatError: See :func:`check_entry`.
        """

    def set_report(self, report: Mapping[str, Any]) -> None:
        """Store the builder's report (JSON-serialisable) in the index."""

    def close(self) -> None:
        """Publish the index atomically."""

    def abort(self) -> None:
        """Give up: publish nothing more."""


_W = TypeVar("_W", bound="BaseIndexWriter")


class BaseIndexWriter:
    """The part of :class:`IndexWriter` every backend shares; a backend adds the storage.

    A subclass implements ``_start_component``, ``_add`` (called once the writer is known
    open and the entry checked), ``close`` and ``abort``, and sets ``_closed`` in both.

    Args:
        path: Local path of the index to write.
        name: The dataset's name.
    """

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.name = name
        self._report: dict[str, Any] = {}
        self._closed = False

    records_seek = False
    """Whether this format records compressed shards' seek points (others refuse them)."""

    records_seek = False
    """Whether this format records compressed shards' seek points (others refuse them)."""

    def start_component(self, name: str, weight: float | None = None) -> None:
        """Start a sub-dataset; shards added from now on belong to it.

        Args:
            name: The component's name (``__dataset__`` in its samples).
            weight: Its mixing weight, if any.
        """
        self._check_open()
        self._start_component(name, weight)

    def add(
        self,
        info: ShardInfo,
        members: ShardMembers | None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one shard and its member table.

        Args:
            info: The shard; its ``url`` is stored as given (relative to the index's directory
                or absolute).
            members: Its member table, or ``None`` to record the shard without offsets.
            extra: More JSON-serialisable keys to keep with the shard (in a JSON index they
                must not redefine the format's keys).

        Raises:
            IndexFormatError: ``info`` or ``members`` is malformed, or they disagree (see
                :func:`check_entry`).
            ValueError: ``extra`` cannot be stored (a JSON index: it redefines a key).
        """
        self._check_open()
        check_entry(info, members)
        if members is not None and members.seek is not None and not self.records_seek:
            from ..storage import redact_url

            raise IndexFormatError(
                f"a compressed ({members.seek.kind}) shard: its seek points are recorded by "
                "JSON indexes (*.json) only; write the index as .json",
                shard=redact_url(info.url),
            )
        self._add(info, members, extra)

    def set_report(self, report: Mapping[str, Any]) -> None:
        """Store the builder's report (JSON-serialisable) in the index."""
        self._check_open()
        self._report = dict(report)

    def close(self) -> None:
        """Publish the index atomically."""
        raise NotImplementedError

    def abort(self) -> None:
        """Give up: publish nothing more."""
        raise NotImplementedError

    def _start_component(self, name: str, weight: float | None) -> None:
        raise NotImplementedError

    def _add(
        self, info: ShardInfo, members: ShardMembers | None, extra: Mapping[str, Any] | None
    ) -> None:
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: writer is closed")

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def component_rows(
    components: Sequence[tuple[str, float | None, int]], nshards: int
) -> list[tuple[str, float | None, int, int]]:
    """``(name, weight, first_shard, stop_shard)`` of components given by their first shards.

    ``components[0]`` is the main component (shards added before any sub-dataset); when it is
    empty beside sub-datasets, it is no component.
    """
    bounds = [c[2] for c in components[1:]] + [nshards]
    rows = [(*c, stop) for c, stop in zip(components, bounds, strict=True)]
    if len(rows) > 1 and rows[0][2] == rows[0][3]:
        rows = rows[1:]
    return rows
