"""Splitting member names into sample keys and fields, and grouping members into samples.

WebDataset convention: the *key* of a member is its path up to the first dot of its basename
(directories included), the *field* is the rest with its leading dot::

    "train/000017.seg.png"  ->  key "train/000017", field ".seg.png"

Members whose basename has no dot (``README``) or starts with a dot (``.hidden``, macOS
``._x`` files) belong to no sample: they are skipped, counted, and logged once per shard.
Members of one sample are consecutive in the tar.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Literal

from .errors import SampleLayoutError
from .tar import TarMember

__all__ = [
    "DUPLICATE_POLICIES",
    "DuplicatePolicy",
    "GroupedSamples",
    "group_members",
    "group_regular",
    "split_name",
]

logger = logging.getLogger(__name__)

DuplicatePolicy = Literal["error", "split", "keep_first"]
DUPLICATE_POLICIES: tuple[str, ...] = ("error", "split", "keep_first")

# One sample: its key and its members as (field, data offset, size).
Sample = tuple[str, list[tuple[str, int, int]]]


def split_name(name: str) -> tuple[str, str] | None:
    """Split a member name into ``(key, field)``.

    Args:
        name: Path of the member inside the tar.

    Returns:
        ``(key, field)`` with the field's leading dot kept, or ``None`` when the basename has
        no dot or starts with one (such members belong to no sample).

    Example:
        >>> split_name("a/b/0001.seg.png")
        ('a/b/0001', '.seg.png')
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        return None
    return name[:dot], name[dot:]


class GroupedSamples(list[Sample]):
    """The samples of one shard, in tar order, plus what grouping skipped.

    Attributes:
        skipped: Names of regular members that belong to no sample.
        dropped: Members dropped by the ``keep_first`` policy, as ``(key, field)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.skipped: list[str] = []
        self.dropped: list[tuple[str, str]] = []


def group_members(
    members: Iterable[TarMember],
    *,
    duplicates: DuplicatePolicy = "error",
    shard: str | None = None,
) -> GroupedSamples:
    """Group a shard's regular members into samples.

    Args:
        members: The shard's entries in tar order; non-regular ones are ignored.
        duplicates: What to do when a key reappears after other keys, or a field appears
            twice in one sample. ``"error"`` raises; ``"split"`` starts a new sample (the
            grouping webdataset's iterable pipeline does, so one key may name two samples);
            ``"keep_first"`` keeps the first member of a repeated field and drops the rest
            (a key reappearing after other keys still starts a new sample).
        shard: Shard URL for error messages.

    Returns:
        The samples in order, each ``(key, [(field, offset, size), ...])``.

    Raises:
        SampleLayoutError: On a duplicate, with ``duplicates="error"``.
        ValueError: For an unknown policy.
    """
    regular = ((m.name, m.offset, m.size) for m in members if m.isreg)
    return group_regular(regular, duplicates=duplicates, shard=shard)


def group_regular(
    members: Iterable[tuple[str, int, int]],
    *,
    duplicates: DuplicatePolicy = "error",
    shard: str | None = None,
) -> GroupedSamples:
    """Like :func:`group_members`, for regular members given as ``(name, offset, size)``.

    The index builder's hot path: it skips building a ``TarMember`` per member.
    """
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}, not {duplicates!r}")
    out = GroupedSamples()
    seen: set[str] = set()
    key: str | None = None
    fields: list[tuple[str, int, int]] = []
    names: set[str] = set()
    for name, offset, size in members:
        slash = name.rfind("/")
        dot = name.find(".", slash + 1)
        if dot <= slash + 1:  # inlined split_name: this loop runs once per member
            out.skipped.append(name)
            continue
        k, field = name[:dot], name[dot:]
        if k == key and field not in names:
            fields.append((field, offset, size))
            names.add(field)
            continue
        if k == key:  # the same field twice in one sample
            if duplicates == "error":
                raise SampleLayoutError(
                    f"field {field!r} appears twice in sample {k!r} (member at byte "
                    f"{offset}); pass duplicates='split' or 'keep_first' to accept this",
                    shard=shard,
                )
            if duplicates == "keep_first":
                out.dropped.append((k, field))
                continue
        elif k in seen and duplicates == "error":
            raise SampleLayoutError(
                f"key {k!r} reappears after other samples (member at byte {offset}); "
                "pass duplicates='split' to index it as a separate sample",
                shard=shard,
            )
        if key is not None:
            out.append((key, fields))
            seen.add(key)
        key, fields, names = k, [(field, offset, size)], {field}
    if key is not None:
        out.append((key, fields))
    if out.skipped:
        logger.info(
            "%s: %d member(s) without a key.field name skipped, e.g. %r",
            shard,
            len(out.skipped),
            out.skipped[0],
        )
    return out
