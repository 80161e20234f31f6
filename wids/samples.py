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
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .errors import SampleLayoutError
from .tar import BLOCK, LocalHeaders, TarMember

__all__ = [
    "DUPLICATE_POLICIES",
    "DuplicatePolicy",
    "GroupedColumns",
    "GroupedSamples",
    "SampleColumns",
    "group_columns",
    "group_headers",
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


def _check_policy(duplicates: str) -> None:
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}, not {duplicates!r}")


def _repeated(
    duplicates: DuplicatePolicy, key: str, field: str | None, offset: int, shard: str | None
) -> bool:
    """Apply the duplicate policy to a member repeating ``field`` in its sample, or ``key``.

    ``field`` is ``None`` when ``key`` names an earlier sample. Returns whether the member is
    dropped (``keep_first``, a repeated field); otherwise it starts a new sample. Raises
    ``SampleLayoutError`` with ``duplicates="error"``.
    """
    if duplicates != "error":
        return field is not None and duplicates == "keep_first"
    if field is not None:
        problem = f"field {field!r} appears twice in sample {key!r} (member at byte {offset})"
        raise SampleLayoutError(problem, shard=shard, policies=("split", "keep_first"))
    problem = f"key {key!r} reappears after other samples (member at byte {offset})"
    raise SampleLayoutError(problem, shard=shard, policies=("split",), sortable=True)


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
    _check_policy(duplicates)
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
            if _repeated(duplicates, k, field, offset, shard):
                out.dropped.append((k, field))
                continue
        elif k in seen:
            _repeated(duplicates, k, None, offset, shard)
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


_REGULAR = frozenset(("0", "7", "\0"))


@dataclass
class GroupedColumns:
    """The samples of one shard as columns (the member table's layout), in tar order.

    Attributes:
        fields: Distinct fields in order of first appearance.
        keys: One key per sample.
        sample_start: ``n + 1`` positions: sample ``i``'s members are
            ``[sample_start[i], sample_start[i + 1])``.
        member_field: Per member, its field's position in ``fields``.
        member_offset: Per member, its data offset.
        member_size: Per member, its size.
        skipped: Names of regular members that belong to no sample.
        dropped: Members dropped by the ``keep_first`` policy, as ``(key, field)``.
    """

    fields: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    sample_start: list[int] = field(default_factory=list)
    member_field: list[int] = field(default_factory=list)
    member_offset: list[int] = field(default_factory=list)
    member_size: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)


def group_columns(
    rows: Iterable[tuple[str, int, int, str, int]],
    *,
    duplicates: DuplicatePolicy = "error",
    shard: str | None = None,
) -> GroupedColumns:
    """Like :func:`group_members`, straight into columns, from ``tar.scan_local_rows`` rows.

    The index builder's hot path: one loop over the scanner's rows, no tuple per member, no
    ``(key, fields)`` per sample and no second pass to flatten them.

    Args:
        rows: ``(name, offset, size, type, header_offset)`` per entry in tar order (as
            ``tar.scan_local_rows`` gives them); entries that are not regular files are
            ignored.
        duplicates: As for :func:`group_members`.
        shard: Shard URL for error messages.

    Raises:
        SampleLayoutError: On a duplicate, with ``duplicates="error"``.
        ValueError: For an unknown policy.
    """
    _check_policy(duplicates)
    out = GroupedColumns()
    keys, starts, skipped = out.keys, out.sample_start, out.skipped
    fids: dict[str, int] = {}
    fid_of = fids.get
    mf, mo, ms = out.member_field, out.member_offset, out.member_size
    add_field, add_offset, add_size = mf.append, mo.append, ms.append
    seen: set[str] = set()
    key: str | None = None
    names: list[str] = []  # the current sample's fields: a few, a list is the fastest
    regular = _REGULAR
    for name, offset, size, typ, _ in rows:
        if typ not in regular:
            continue
        slash = name.rfind("/")
        dot = name.find(".", slash + 1)
        if dot <= slash + 1:  # inlined split_name
            skipped.append(name)
            continue
        k, f = name[:dot], name[dot:]
        if k == key:
            if f not in names:
                names.append(f)
                fid = fid_of(f)
                add_field(fid if fid is not None else fids.setdefault(f, len(fids)))
                add_offset(offset)
                add_size(size)
                continue
            if _repeated(duplicates, k, f, offset, shard):
                out.dropped.append((k, f))
                continue
        elif k in seen:
            _repeated(duplicates, k, None, offset, shard)
        if key is not None:
            seen.add(key)
        key, names = k, [f]
        keys.append(k)
        starts.append(len(mo))
        fid = fid_of(f)
        add_field(fid if fid is not None else fids.setdefault(f, len(fids)))
        add_offset(offset)
        add_size(size)
    starts.append(len(mo))
    out.fields = list(fids)
    if skipped:
        logger.info(
            "%s: %d member(s) without a key.field name skipped, e.g. %r",
            shard,
            len(skipped),
            skipped[0],
        )
    return out


@dataclass
class SampleColumns:
    """A shard's samples as member-table arrays (what :func:`group_headers` gives).

    Attributes:
        fields: Distinct fields in order of first appearance.
        key_blob: The samples' keys, UTF-8 (surrogateescape), concatenated.
        key_offsets: ``n + 1`` positions of the keys in ``key_blob``.
        sample_start: ``n + 1`` member positions, as in :class:`GroupedColumns`.
        member_field: Per member, its field's position in ``fields``.
        member_offset: Per member, its data offset.
        member_size: Per member, its size.
        skipped: How many regular members belong to no sample.
    """

    fields: list[str]
    key_blob: bytes
    key_offsets: np.ndarray
    sample_start: np.ndarray
    member_field: np.ndarray
    member_offset: np.ndarray
    member_size: np.ndarray
    skipped: int


def group_headers(
    headers: LocalHeaders, *, duplicates: DuplicatePolicy = "error", shard: str | None = None
) -> SampleColumns | None:
    """Like :func:`group_columns`, vectorised, for ``tar.scan_local_headers``' members.

    Returns ``None`` when a key or field repeats (then :func:`group_columns` applies the
    policy): without repeats every policy groups alike.

    Raises:
        ValueError: For an unknown policy.
    """
    _check_policy(duplicates)
    names, name_len = headers.name, headers.name_len
    n, width = names.shape
    col = np.arange(width)
    is_slash = names == 47
    slash = np.full(n, -1)
    if is_slash.any():
        slash = np.where(is_slash.any(1), width - 1 - is_slash[:, ::-1].argmax(1), -1)
    dots = (names == 46) & (col > slash[:, None])
    dot = np.where(dots.any(1), dots.argmax(1), -1)
    valid = dot > slash + 1  # as split_name: a dot in the basename, not its first byte
    skipped = np.flatnonzero(~valid)
    example = names[skipped[0], : name_len[skipped[0]]].tobytes() if len(skipped) else b""
    if len(skipped):
        names, name_len, dot = names[valid], name_len[valid], dot[valid]
    keys = names * (col < dot[:, None])
    new = np.ones(len(keys), dtype=bool)
    new[1:] = (keys[1:] != keys[:-1]).any(1)
    starts = np.flatnonzero(new)
    nsamples = len(starts)
    member_field, fields = _field_ids(names, dot, name_len)
    key_rows = np.ascontiguousarray(keys[starts]).view(f"V{width}").ravel()
    if not _distinct_fields(member_field, starts, len(fields)) or (
        len(np.unique(key_rows)) != nsamples
    ):
        return None  # a field twice in a sample, or a key in two places
    key_len = dot[starts].astype(np.int64)
    key_offsets = np.zeros(nsamples + 1, dtype=np.int64)
    np.cumsum(key_len, out=key_offsets[1:])
    sample_start = np.append(starts, len(keys)).astype(np.int64)
    if len(skipped):
        logger.info(
            "%s: %d member(s) without a key.field name skipped, e.g. %r",
            shard,
            len(skipped),
            example.decode("utf-8", "surrogateescape"),
        )
    return SampleColumns(
        fields=fields,
        key_blob=keys[starts][col < key_len[:, None]].tobytes(),
        key_offsets=key_offsets,
        sample_start=sample_start,
        member_field=member_field,
        member_offset=headers.header_offset[valid] + BLOCK,
        member_size=headers.size[valid],
        skipped=int(n - len(keys)),
    )


def _field_ids(
    names: np.ndarray, dot: np.ndarray, name_len: np.ndarray
) -> tuple[np.ndarray, list[str]]:
    """Per member, its field's position in the fields (in order of first appearance)."""
    width = names.shape[1]
    tails = names * (np.arange(width) >= dot[:, None])  # equal rows: equal dots and fields
    weights = np.arange(1, width + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) | 1
    code = (tails.astype(np.uint64) * weights).sum(1)  # a hash; collisions checked below
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if not bool((tails == tails[first[inverse]]).all()):
        rows = np.ascontiguousarray(tails).view(f"V{width}").ravel()
        _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    ids: dict[str, int] = {}
    field_of = np.empty(len(first), dtype=np.int64)
    for k in np.argsort(first).tolist():
        i = int(first[k])
        name = names[i, dot[i] : name_len[i]].tobytes().decode("utf-8", "surrogateescape")
        field_of[k] = ids.setdefault(name, len(ids))
    return field_of[inverse], list(ids)


def _distinct_fields(member_field: np.ndarray, starts: np.ndarray, nfields: int) -> bool:
    """Whether no field appears twice in one sample (samples begin at ``starts``)."""
    if not len(member_field):
        return True
    if nfields < 63:  # one bit per field: a repeat makes the sum differ from the union
        bits = np.left_shift(np.int64(1), member_field)
        return bool((np.bitwise_or.reduceat(bits, starts) == np.add.reduceat(bits, starts)).all())
    sample = np.cumsum(np.isin(np.arange(len(member_field)), starts)) - 1
    return len(np.unique(sample * nfields + member_field)) == len(member_field)
