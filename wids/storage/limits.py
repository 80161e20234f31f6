"""How large a file read whole may be, per kind: bounded work on a hostile or careless index.

An index description, a member-table sidecar, a SQLite index or a ``.widx`` table comes from
wherever the user (or an index) points; without a bound a 200 MB description is read whole,
a small gzip-encoded answer inflates without limit and an endless chunked answer runs until
the attempt's timeout. Each whole-file read names its kind and is refused
(:class:`~wids.errors.TooLargeError`) past that kind's bound: from the announced size, or once
the body passes it, never read whole. Encoded answers are refused as well (``Accept-Encoding:
identity`` is asked for; decoding could expand them without bound).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReadLimits"]

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """The most bytes a whole-file read of each kind may bring (``None``: no bound).

    Args:
        description: An index description (``*.json``) read into memory.
        members: One member-table sidecar read into memory.
        sqlite: A remote SQLite index downloaded to a temporary file.
        table: A remote ``.widx`` shard table downloaded whole (a snapshot).

    Example:
        >>> from wids import ReadLimits, ShardListDataset
        >>> ds = ShardListDataset("https://host/train.json",
        ...                       read_limits=ReadLimits(description=1 << 30))  # doctest: +SKIP
    """

    description: int | None = 256 * MiB
    members: int | None = 64 * MiB
    sqlite: int | None = 16384 * MiB
    table: int | None = 16384 * MiB

    def __post_init__(self) -> None:
        for name in ("description", "members", "sqlite", "table"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, not {value!r}")
