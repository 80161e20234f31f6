"""The member table of one shard, in compact CSR form.

:class:`ShardMembers` holds, for each sample of a shard, its key and its members' field, data
offset and size (numpy arrays, a few dozen bytes per sample), and so its byte span, which one
range request fetches. Every value is checked on construction, whatever backend it came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import IndexFormatError

if TYPE_CHECKING:
    from ..compress import SeekPoints

__all__ = ["BLOCK", "MAX_FIELDS", "MAX_OFFSET", "ShardMembers"]

_SHARED_NAMES: dict[str, str] = {}
"""Field names shared by every table of the process; bounded (not ``sys.intern``, whose
strings are never freed on some Python versions: a hostile index must not grow memory)."""
_SHARED_MAX, _SHARED_MAX_LEN = 4096, 64


def _shared(name: Any) -> Any:
    """The process's one copy of a field name (or the name itself, past the bounds)."""
    if type(name) is not str:
        return name
    got = _SHARED_NAMES.get(name)
    if got is not None:
        return got
    if len(name) <= _SHARED_MAX_LEN and len(_SHARED_NAMES) < _SHARED_MAX:
        return _SHARED_NAMES.setdefault(name, name)
    return name


BLOCK = 512
"""A tar header's size: the least space before each member's data."""
MAX_OFFSET = 1 << 62
"""Offsets and sizes in an index are below this (no storage holds 4 EiB)."""
MAX_FIELDS = 1 << 16
"""Distinct field names in one member table (field ids are 16-bit)."""


def _int64(values: Any, what: str) -> np.ndarray:
    """``values`` as an int64 array, refusing anything that is not integers in range."""
    if isinstance(values, np.ndarray) and values.dtype == np.int64:
        return values
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as e:
        raise IndexFormatError(f"{what}: not an array of integers ({e})") from None
    if arr.ndim != 1:
        raise IndexFormatError(f"{what}: not a flat list of integers")
    if arr.dtype.kind not in "iu":
        if len(arr) == 0:
            return np.zeros(0, dtype=np.int64)
        raise IndexFormatError(f"{what}: not integers (found {arr.dtype.name} values)")
    if arr.dtype.kind == "u" and len(arr) and int(arr.max()) >= MAX_OFFSET:
        raise IndexFormatError(f"{what}: value {int(arr.max())} is too large")
    return arr.astype(np.int64, copy=False)


class ShardMembers:
    """The member table of one shard.

    Sample ``i`` has key ``key_blob[key_offsets[i]:key_offsets[i + 1]]`` (UTF-8) and members
    ``sample_start[i] .. sample_start[i + 1] - 1``; member ``j`` is field
    ``fields[member_field[j]]`` with data at ``member_offset[j]`` of ``member_size[j]`` bytes.
    Members of a sample are consecutive in the tar, so the sample's bytes are one span.
    ``key_text`` is the keys as one ``str`` when they are ASCII (key ``i`` is
    ``key_text[key_offsets[i]:key_offsets[i + 1]]``, no decode), else ``None``.

    A compressed shard's table (``.tar.gz``, ``.tar.zst``) has the same offsets, in the
    decompressed tar, and ``seek``: its :class:`~wids.compress.SeekPoints` (how to reach them
    in the compressed file); ``seek`` is ``None`` for a plain tar.
    """

    __slots__ = (
        "fields",
        "key_blob",
        "key_text",
        "key_offsets",
        "member_field",
        "member_offset",
        "member_size",
        "sample_start",
        "seek",
    )

    def __init__(
        self,
        fields: Sequence[str],
        key_blob: bytes,
        key_offsets: np.ndarray,
        sample_start: np.ndarray,
        member_field: np.ndarray,
        member_offset: np.ndarray,
        member_size: np.ndarray,
        seek: SeekPoints | None = None,
    ) -> None:
        # Shared: each name is then one object in every shard's table, warm in the cache
        # and hashed once when samples are built from any of thousands of shards.
        self.fields = tuple(_shared(f) for f in fields)
        self.key_blob = key_blob
        self.key_offsets = _int64(key_offsets, "key offsets")
        self.sample_start = _int64(sample_start, "sample_start")
        field_ids = _int64(member_field, "member_field")
        self.member_offset = _int64(member_offset, "member_offset")
        self.member_size = _int64(member_size, "member_size")
        self.seek = seek
        problem = self._problem(field_ids)
        if problem:
            raise IndexFormatError(f"inconsistent member table: {problem}")
        self.member_field = field_ids.astype(np.uint16)
        blob = self.key_blob  # ASCII keys (the usual) also as one str: a key is a slice of it
        self.key_text = blob.decode("ascii") if blob.isascii() else None

    def _problem(self, field_ids: np.ndarray) -> str | None:
        """What is wrong with the arrays, or ``None``; every value an index can hold is checked.

        Offsets and sizes are below 2**62; members lie in tar order, each one's data starting at
        least a 512-byte header after the previous one's end; every sample has a member; field
        ids point into ``fields``. All vectorised (see ``tools/bench_index.py`` for the cost).
        """
        n, m = len(self.sample_start) - 1, len(self.member_offset)
        starts, offs, sizes = self.sample_start, self.member_offset, self.member_size
        fields = self.fields
        if not all(isinstance(f, str) for f in fields) or len(set(fields)) != len(fields):
            return "fields must be distinct strings"
        if len(fields) > MAX_FIELDS:
            return f"{len(fields)} fields (limit {MAX_FIELDS})"
        if not isinstance(self.key_blob, bytes):
            return "keys must be bytes"
        if n < 0 or len(self.key_offsets) != n + 1:
            return "sample_start and keys disagree in length"
        if len(field_ids) != m or len(sizes) != m:
            return "member_field, member_offset and member_size differ in length"
        if n == 0:
            return "members without samples" if m else None
        if starts[0] != 0 or starts[-1] != m or not bool(np.all(starts[1:] > starts[:-1])):
            return "sample_start must rise from 0 to the member count, every sample non-empty"
        keys = self.key_offsets
        if keys[0] != 0 or keys[-1] != len(self.key_blob) or bool(np.any(keys[1:] < keys[:-1])):
            return "key offsets must rise from 0 to the length of the keys"
        if int(field_ids.min()) < 0 or int(field_ids.max()) >= len(fields):
            return f"member_field outside the {len(fields)} fields"
        if int(sizes.min()) < 0 or int(sizes.max()) >= MAX_OFFSET:
            return f"member_size outside [0, 2**62): {int(sizes.min())} .. {int(sizes.max())}"
        low, high = int(offs.min()), int(offs.max())  # every one: a middle 2**63-1 wraps
        if low < BLOCK or high >= MAX_OFFSET:
            return f"member_offset outside [512, 2**62): {low} .. {high}"
        # Member j's data starts after member j-1's data and member j's own 512-byte header.
        # (int64 cannot overflow here: every offset and size is below 2**62.)
        if self.seek is not None and high + int(sizes[-1]) > self.seek.uncompressed_size:
            return (
                f"members run to byte {high + int(sizes[-1])} of a compressed shard whose tar "
                f"is {self.seek.uncompressed_size} bytes"
            )
        bad = np.flatnonzero(offs[1:] < offs[:-1] + sizes[:-1] + BLOCK)
        if len(bad):
            j = int(bad[0]) + 1
            return (
                f"member {j} at offset {int(offs[j])} overlaps or precedes member {j - 1} "
                f"({int(offs[j - 1])} + {int(sizes[j - 1])} bytes + a 512-byte header)"
            )
        return None

    def check_extent(self, size: int | None) -> None:
        """Check that every member lies inside a shard of ``size`` bytes, if the size is known.

        Raises:
            IndexFormatError: The last member ends past ``size``.
        """
        if size is None or not self.nmembers:
            return
        if self.seek is not None:  # members are checked against the tar's size on creation
            if self.seek.compressed_size > size:
                raise IndexFormatError(
                    f"compressed data runs to byte {self.seek.compressed_size}, past the "
                    f"shard's recorded size {size}"
                )
            return
        end = int(self.member_offset[-1] + self.member_size[-1])
        if end > size:
            raise IndexFormatError(
                f"member table runs to byte {end}, past the shard's recorded size {size}"
            )

    @classmethod
    def from_samples(
        cls, samples: Sequence[tuple[str, Sequence[tuple[str, int, int]]]]
    ) -> ShardMembers:
        """Build from ``[(key, [(field, offset, size), ...]), ...]`` in tar order.

        This is how a tool that wrote a shard, or parsed it itself, states what it knows.

        Args:
            samples: One entry per sample, in the order the samples lie in the tar: its key
                (the member name up to the first dot of its file name, directories included:
                ``"a/b/000001"``) and its members in tar order, each as ``(field, offset,
                size)``: the field is the rest of the name with its leading dot (``".jpg"``,
                ``".seg.png"``), ``offset`` the byte where the member's data starts (after its
                512-byte header: ``tarfile.TarInfo.offset_data``), ``size`` its data size.

        Returns:
            The table.

        Raises:
            IndexFormatError: An entry is not of that shape, a key or field is not a string,
                a number is not an integer, a size is negative, an offset is below 512, or
                members overlap or are out of tar order (each member's data must start at
                least a 512-byte header after the previous one's end).

        Example:
            >>> ShardMembers.from_samples([("000000", [(".cls", 512, 1), (".jpg", 1536, 90)])])
            ShardMembers(1 samples, 2 members, fields=('.cls', '.jpg'))
        """
        try:
            field_ids: dict[str, int] = {}
            keys = [k.encode("utf-8", "surrogateescape") for k, _ in samples]
            key_offsets = np.zeros(len(samples) + 1, dtype=np.int64)
            np.cumsum([len(k) for k in keys], out=key_offsets[1:])
            sample_start = np.zeros(len(samples) + 1, dtype=np.int64)
            np.cumsum([len(ms) for _, ms in samples], out=sample_start[1:])
            flat = [m for _, ms in samples for m in ms]
            fids = [field_ids.setdefault(f, len(field_ids)) for f, _, _ in flat]
            if len(field_ids) > MAX_FIELDS:
                raise IndexFormatError(f"{len(field_ids)} fields (limit {MAX_FIELDS})")
            offsets = _int64([o for _, o, _ in flat], "member offsets")
            sizes = _int64([s for _, _, s in flat], "member sizes")
        except (TypeError, ValueError, AttributeError) as e:
            if isinstance(e, IndexFormatError):
                raise
            raise IndexFormatError(
                f"samples must be [(key, [(field, offset, size), ...]), ...]: {e}"
            ) from None
        return cls(
            fields=list(field_ids),
            key_blob=b"".join(keys),
            key_offsets=key_offsets,
            sample_start=sample_start,
            member_field=np.array(fids, dtype=np.uint16),
            member_offset=offsets,
            member_size=sizes,
        )

    def to_columns(self) -> dict[str, Any]:
        """Plain lists, for storage: fields, keys, sample_start, member_field/offset/size."""
        return {
            "fields": list(self.fields),
            "keys": self.keys(),
            "sample_start": self.sample_start.tolist(),
            "member_field": self.member_field.tolist(),
            "member_offset": self.member_offset.tolist(),
            "member_size": self.member_size.tolist(),
        }

    @classmethod
    def from_columns(cls, cols: Mapping[str, Any]) -> ShardMembers:
        """Inverse of :meth:`to_columns`.

        Raises:
            IndexFormatError: If a column is missing or the columns disagree.
        """
        try:
            if not isinstance(cols["fields"], list) or not isinstance(cols["keys"], list):
                raise IndexFormatError("'fields' and 'keys' must be lists")
            keys = [k.encode("utf-8", "surrogateescape") for k in cols["keys"]]
            key_offsets = np.zeros(len(keys) + 1, dtype=np.int64)
            np.cumsum([len(k) for k in keys], out=key_offsets[1:])
            return cls(
                fields=cols["fields"],
                key_blob=b"".join(keys),
                key_offsets=key_offsets,
                sample_start=cols["sample_start"],
                member_field=cols["member_field"],
                member_offset=cols["member_offset"],
                member_size=cols["member_size"],
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            if isinstance(e, IndexFormatError):
                raise
            raise IndexFormatError(f"malformed member table: {e!r}") from None

    def __len__(self) -> int:
        return len(self.sample_start) - 1

    @property
    def nmembers(self) -> int:
        """Number of members (fields of all samples)."""
        return len(self.member_offset)

    @property
    def nbytes(self) -> int:
        """Memory held by the table's arrays and keys."""
        arrays = (self.key_offsets, self.sample_start, self.member_field)
        keys = len(self.key_blob) + len(self.key_text or "")
        return keys + sum(a.nbytes for a in arrays) + 16 * self.nmembers

    def key(self, i: int) -> str:
        """The key of sample ``i``."""
        a, b = int(self.key_offsets[i]), int(self.key_offsets[i + 1])
        return self.key_blob[a:b].decode("utf-8", "surrogateescape")

    def keys(self) -> list[str]:
        """All keys, in order (one decode of the whole blob when it is ASCII)."""
        bounds = self.key_offsets.tolist()
        text = self.key_text
        if text is not None:
            return [text[a:b] for a, b in zip(bounds, bounds[1:])]  # noqa: B905 - n+1 bounds
        return [self.key(i) for i in range(len(self))]

    def span(self, i: int) -> tuple[int, int]:
        """Byte range ``(start, end)`` of sample ``i``: first member's data to last one's end."""
        first, last = int(self.sample_start[i]), int(self.sample_start[i + 1]) - 1
        return int(self.member_offset[first]), int(
            self.member_offset[last] + self.member_size[last]
        )

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """All sample spans at once: arrays ``starts`` and ``ends``."""
        if len(self) == 0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        first = self.sample_start[:-1]
        last = self.sample_start[1:] - 1
        return self.member_offset[first], self.member_offset[last] + self.member_size[last]

    def members(self, i: int) -> list[tuple[str, int, int]]:
        """Members of sample ``i`` as ``(field, offset, size)``."""
        a, b = int(self.sample_start[i]), int(self.sample_start[i + 1])
        fields = self.fields
        return [
            (fields[f], int(o), int(s))
            for f, o, s in zip(
                self.member_field[a:b].tolist(),
                self.member_offset[a:b].tolist(),
                self.member_size[a:b].tolist(),
                strict=True,
            )
        ]

    def with_seek(self, seek: SeekPoints | None) -> ShardMembers:
        """The same table for a compressed shard with these seek points (checked)."""
        return ShardMembers(
            self.fields,
            self.key_blob,
            self.key_offsets,
            self.sample_start,
            self.member_field,
            self.member_offset,
            self.member_size,
            seek=seek,
        )

    @property
    def data_end(self) -> int:
        """Where the shard's file must reach: its last member's end, or its compressed data's."""
        if self.seek is not None:
            return self.seek.compressed_size
        if not self.nmembers:
            return 0
        return int(self.member_offset[-1] + self.member_size[-1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardMembers):
            return NotImplemented
        return self.to_columns() == other.to_columns() and self.seek == other.seek

    def __repr__(self) -> str:
        return f"ShardMembers({len(self)} samples, {self.nmembers} members, fields={self.fields})"
