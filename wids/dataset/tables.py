"""One open shard's member table, for the hot path, and the one place a sample dict is built.

:class:`MemberTable` is a thin view over a shard's ``ShardMembers`` arrays (the catalog's),
read one sample at a time as Python lists. :meth:`MemberTable.sample` assembles a sample from
bytes read from the shard: every read of the dataset (``ds[i]``, a batch, ``get_shard``) ends
there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..index import ShardMembers

__all__ = ["MemberTable"]

Rows = tuple[list[int], list[int], list[int]]


class MemberTable:
    """One open shard's member table, read one sample at a time.

    A thin view over the shard's ``ShardMembers`` arrays: building it costs nothing, so
    reopening a shard (random access over more shards than ``lru_size``) stays cheap. Each
    sample's rows are taken with small slices; keys are decoded when their sample is read.
    """

    __slots__ = ("blob", "dataset", "fields", "fid", "ko", "off", "size", "ss", "url")

    def __init__(self, members: ShardMembers, url: str, dataset: str) -> None:
        self.url = url
        self.dataset = dataset
        self.fields = members.fields
        self.blob = members.key_blob
        self.ko = members.key_offsets
        self.ss = members.sample_start
        self.fid = members.member_field
        self.off = members.member_offset
        self.size = members.member_size

    def key(self, j: int) -> str:
        """The key of sample ``j``."""
        a, b = self.ko[j : j + 2].tolist()
        return self.blob[a:b].decode("utf-8", "surrogateescape")

    def rows(self, j: int) -> Rows:
        """Sample ``j``'s members: field ids, data offsets and sizes, as lists."""
        first, stop = self.ss[j : j + 2].tolist()
        return (
            self.fid[first:stop].tolist(),
            self.off[first:stop].tolist(),
            self.size[first:stop].tolist(),
        )

    def first_member(self, j: int) -> tuple[str, int]:
        """Sample ``j``'s first member: its name (key + field) and size, to check its header."""
        first = int(self.ss[j])
        return self.key(j) + self.fields[int(self.fid[first])], int(self.size[first])

    def span(self, j: int) -> tuple[int, int]:
        """The byte span ``(start, end)`` of sample ``j``'s members in the shard."""
        first, stop = self.ss[j : j + 2].tolist()
        return int(self.off[first]), int(self.off[stop - 1] + self.size[stop - 1])

    def sample(
        self, j: int, index: int, buf: bytes, base: int, rows: Rows | None = None
    ) -> dict[str, Any]:
        """Sample ``j`` of this shard as the dataset returns it (before transformations).

        Args:
            j: The sample's index in the shard.
            index: Its global index in the dataset (``__index__``).
            buf: Bytes of the shard holding the sample's members, starting at byte ``base``.
            base: Offset of ``buf`` in the shard.
            rows: ``rows(j)``, if the caller has them already.

        Returns:
            The fields (keys with the leading dot) and ``__key__``, ``__index__``,
            ``__shard__``, ``__shardindex__``, ``__dataset__``.
        """
        fields = self.fields
        fids, offs, sizes = self.rows(j) if rows is None else rows
        sample: dict[str, Any] = {}
        for f, o, n in zip(fids, offs, sizes, strict=True):
            a = o - base
            sample[fields[f]] = buf[a : a + n]
        sample["__key__"] = self.key(j)
        sample["__index__"] = index
        sample["__shard__"] = self.url
        sample["__shardindex__"] = j
        sample["__dataset__"] = self.dataset
        return sample
