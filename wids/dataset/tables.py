"""One open shard's member table, for the hot path, and the one place a sample dict is built.

:class:`MemberTable` holds a shard's ``ShardMembers`` arrays (the catalog's) as zero-copy
memoryviews: indexing one gives a Python ``int`` without a numpy scalar, the cheapest read of
one row. :meth:`MemberTable.sample` assembles a sample from bytes read from the shard: every
read of the dataset (``ds[i]``, a batch, ``get_shard``, the local fast path's
:class:`~wids.dataset.localread.LocalShard`, a subclass) ends there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..tar import header_fits, header_mismatch

if TYPE_CHECKING:
    from ..index import ShardMembers

__all__ = ["HEADER", "MemberTable"]

HEADER = 512
"""Bytes of a tar header: every read of a sample starts this much before its first member."""


def _view(values: np.ndarray) -> memoryview:
    """A flat, native, contiguous view of an integer array (copied only if it is not one)."""
    if not (values.flags.c_contiguous and values.dtype.isnative and values.ndim == 1):
        values = np.ascontiguousarray(values.ravel(), dtype=np.int64)
    return memoryview(values)  # type: ignore[arg-type]  # numpy arrays are buffers


class MemberTable:
    """One open shard's member table, read one sample at a time.

    Memoryviews of the shard's ``ShardMembers`` arrays: building it costs five views, so
    reopening a shard (random access over more shards than ``lru_size``) stays cheap. Keys
    are decoded when their sample is read.
    """

    __slots__ = (
        "blob",
        "dataset",
        "fields",
        "fid",
        "ko",
        "off",
        "raws",
        "size",
        "ss",
        "text",
        "url",
    )

    def __init__(self, members: ShardMembers, url: str, dataset: str) -> None:
        self.url = url
        self.dataset = dataset
        self.fields = members.fields
        # each field's name as bytes and a NUL: what ends a member's name in its tar header
        self.raws = [f.encode("utf-8", "surrogateescape") + b"\0" for f in members.fields]
        self.blob = members.key_blob
        self.text = members.key_text  # ASCII keys as one str (a key is a slice), else None
        self.ko = _view(members.key_offsets)
        self.ss = _view(members.sample_start)
        self.fid = _view(members.member_field)
        self.off = _view(members.member_offset)
        self.size = _view(members.member_size)

    def key(self, j: int) -> str:
        """The key of sample ``j``."""
        ko, text = self.ko, self.text
        if text is not None:
            return text[ko[j] : ko[j + 1]]
        return self.blob[ko[j] : ko[j + 1]].decode("utf-8", "surrogateescape")

    def first_member(self, j: int) -> tuple[str, int]:
        """Sample ``j``'s first member: its name (key + field) and size, to check its header."""
        first = self.ss[j]
        return self.key(j) + self.fields[self.fid[first]], self.size[first]

    def span(self, j: int) -> tuple[int, int]:
        """The byte span ``(start, end)`` of sample ``j``'s members in the shard."""
        first, last = self.ss[j], self.ss[j + 1] - 1
        return self.off[first], self.off[last] + self.size[last]

    def check(self, j: int, first: int, end: int, buf: bytes, base: int) -> None:
        """Raise unless ``buf`` holds the tar header of each member ``first .. end - 1``.

        A sample's members follow each other in the tar (header, data, padding, next
        header), so the read of a sample from its first member's header on holds every
        member's header: each must be there, 512 bytes before the member's data, and name the
        member (key + field) with its recorded size (:func:`~wids.tar.header_mismatch`). This
        is what keeps a wrong (hostile, corrupt) member table from returning wrong bytes.

        Args:
            j: The sample's index in the shard.
            first: Its first member's row.
            end: One past its last member's row.
            buf: Bytes of the shard from ``base`` on.
            base: Offset of ``buf`` in the shard.

        Raises:
            IndexMismatchError: A member is not where (or not what) the table says, naming
                the shard, the member and what is wrong.
        """
        off, size, fid, raws = self.off, self.size, self.fid, self.raws
        ko = self.ko
        kb = self.blob[ko[j] : ko[j + 1]]
        n = len(buf)
        for m in range(first, end):
            a = off[m] - base
            s = size[m]
            if HEADER <= a and 0 <= s and a + s <= n and header_fits(buf, a, kb + raws[fid[m]], s):
                continue
            name = self.key(j) + self.fields[fid[m]]
            if a < HEADER or s < 0 or a + s > n:
                problem = (
                    f"member {name!r} at byte {off[m]} ({s} bytes) is not within its sample's "
                    f"members (bytes {base + HEADER} to {base + n} with their headers)"
                )
            else:
                found = header_mismatch(buf[a - HEADER : a], name, s)
                if found is None:
                    continue
                problem = f"at byte {off[m] - HEADER}, where member {name!r} begins, {found}"
            from ..index.contents import mismatch_error

            raise mismatch_error(problem, self.url)

    def sample(self, j: int, index: int, buf: bytes, base: int) -> dict[str, Any]:
        """Sample ``j`` of this shard as the dataset returns it (before transformations).

        The one place a sample dict is built (the hot path of every read: keep it flat).

        Args:
            j: The sample's index in the shard.
            index: Its global index in the dataset (``__index__``).
            buf: Bytes of the shard holding the sample's members and their tar headers,
                starting at byte ``base`` (at or before the first member's header).
            base: Offset of ``buf`` in the shard.

        Returns:
            The fields (keys with the leading dot) and ``__key__``, ``__index__``,
            ``__shard__``, ``__shardindex__``, ``__dataset__``.
        """
        fields, fid, off, size = self.fields, self.fid, self.off, self.size
        first, end = self.ss[j], self.ss[j + 1]
        self.check(j, first, end, buf, base)
        sample: dict[str, Any] = {}
        for m in range(first, end):
            a = off[m] - base
            sample[fields[fid[m]]] = buf[a : a + size[m]]
        sample["__key__"] = self.key(j)
        sample["__index__"] = index
        sample["__shard__"] = self.url
        sample["__shardindex__"] = j
        sample["__dataset__"] = self.dataset
        return sample
