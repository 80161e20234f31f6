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

from ..errors import TarFormatError
from ..tar import header_fits, header_mismatch, record_name

if TYPE_CHECKING:
    from ..index import ShardMembers

__all__ = ["HEADER", "MemberTable"]

HEADER = 512
"""Bytes of a tar header: every read of a sample starts this much before its first member."""
MAX_GAP = 64 << 10
"""The most bytes between two members walked to find a long name's record (else not compared).

A GNU ``L`` or pax ``path`` record of the longest name (4,096 bytes) takes about 5 KiB.
"""


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

    Attributes:
        names: When every sample has the same one to three fields in the same order (the
            usual shard): their names, in order; else ``()``. Sample ``j``'s members are then
            ``k * j .. k * j + k - 1`` (``k`` the count).
        raws_of_names: Those names as their tar headers hold them: bytes and a NUL.
        short: Every member's name (key + field) and a NUL fit a header's 100-byte name
            field, so the fast check of a header (:func:`~wids.tar.header_fits`'s tests)
            needs no length test.
    """

    __slots__ = (
        "blob",
        "dataset",
        "fields",
        "fid",
        "ko",
        "off",
        "names",
        "raws",
        "raws_of_names",
        "short",
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
        self.raws = tuple(f.encode("utf-8", "surrogateescape") + b"\0" for f in members.fields)
        keys = members.key_offsets
        longest = int((keys[1:] - keys[:-1]).max()) if len(keys) > 1 else 0
        # every member's name and a NUL fit a header's 100-byte name field: no length to check
        self.short = longest + max(map(len, self.raws), default=0) <= 100
        self.names = _uniform_names(members)
        fids = members.member_field[: len(self.names)].tolist()
        self.raws_of_names = tuple(self.raws[f] for f in fids)
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
        member (key + field) with its recorded size (:func:`~wids.tar.header_mismatch`). A
        name the header cannot hold (longer than 100 bytes, or not ASCII) is compared with
        the GNU ``L`` or pax ``path`` record before the header where that is in ``buf`` (or,
        for a local shard, read: :meth:`before`). This is what keeps a wrong (hostile,
        corrupt) member table from returning wrong bytes.

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
                    found = self._record_mismatch(m, name, buf, base)
                    if found is None:
                        continue
                problem = f"at byte {off[m] - HEADER}, where member {name!r} begins, {found}"
            from ..index.contents import mismatch_error

            raise mismatch_error(problem, self.url)

    def _record_mismatch(self, m: int, name: str, buf: bytes, base: int) -> str | None:
        """What the name of member ``m`` is in the tar, against ``name``, or ``None``.

        Only for a name its header's name field cannot hold as it is (longer than 100 bytes,
        or not ASCII), which :func:`~wids.tar.header_mismatch` does not compare: the GNU ``L``
        or pax ``path`` record before the header (:func:`~wids.tar.record_name`) names it, or
        else the header itself (a ustar prefix and name). The records are walked from where
        the previous member's data and padding end (a header boundary once that member is
        checked) to ``m``'s header. Not compared (``None``) when those bytes are not in ``buf``
        and :meth:`before` does not read them, or more than :data:`MAX_GAP` bytes lie between.
        """
        raw = name.encode("utf-8", "surrogateescape")
        if len(raw) <= 100 and raw.isascii():
            return None  # the header holds it as it is: compared by header_mismatch
        off = self.off
        end = off[m] - HEADER
        start = 0
        if m:
            start = off[m - 1] + self.size[m - 1]
            start += -start % HEADER
        if not 0 <= end - start <= MAX_GAP:
            return None
        gap = buf[start - base : end - base] if start >= base else self.before(start, end)
        if gap is None:
            return None
        try:
            got = record_name(gap)
        except TarFormatError as e:
            return f"the records before its header are not a tar's ({e})"
        if got is None:  # no record: the header's own name (ustar: prefix/name)
            h = buf[end - base : end - base + HEADER]
            field = h[:100].partition(b"\0")[0]
            if h[345]:
                field = h[345:500].partition(b"\0")[0] + b"/" + field
            got = field.decode("utf-8", "surrogateescape")
            if got == name:
                return None
            return f"the header names {got!r} where the index says {name!r}"
        if got == name:
            return None
        return f"the name record before the header names {got!r} where the index says {name!r}"

    def before(self, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of the shard outside a read, if cheap to get (here: never).

        :meth:`check` asks for the records before a sample's first member; a local shard
        (:class:`~wids.dataset.localread.LocalShard`) reads them.
        """
        return None

    def sample(
        self, j: int, index: int, buf: bytes, base: int, checked: bool = False
    ) -> dict[str, Any]:
        """Sample ``j`` of this shard as the dataset returns it (before transformations).

        The one place a sample dict is built (the hot path of every read: keep it flat).

        Args:
            j: The sample's index in the shard.
            index: Its global index in the dataset (``__index__``).
            buf: Bytes of the shard holding the sample's members and their tar headers,
                starting at byte ``base`` (at or before the first member's header).
            base: Offset of ``buf`` in the shard.
            checked: These bytes' headers were checked already (a local shard's once per
                sample and open file): not again.

        Returns:
            The fields (keys with the leading dot) and ``__key__``, ``__index__``,
            ``__shard__``, ``__shardindex__``, ``__dataset__``.
        """
        fields, fid, off, size = self.fields, self.fid, self.off, self.size
        first, end = self.ss[j], self.ss[j + 1]
        if not checked:
            # header_fits's tests a member, inline (LocalShard.read has the same); a member
            # that does not pass them sends the sample to the exact check, which raises (or
            # passes it: a writer's other rendering of a header, a long name). The table was
            # validated as it loaded (ShardMembers: offsets from 512 on, in tar order, each
            # after the previous member's data and a header), so with the first header and
            # the last member's data in ``buf``, every header is.
            ko = self.ko
            kb = self.blob[ko[j] : ko[j + 1]]
            h = off[first] - base - HEADER
            fits = self.short and h >= 0 and off[end - 1] + size[end - 1] - base <= len(buf)
            k = len(self.names)
            if fits and k:  # unrolled: every sample has these fields
                r = self.raws_of_names
                fits = (
                    buf.startswith(kb + r[0], h)
                    and buf[h + 124 : h + 136] == b"%011o\0" % size[first]
                    and buf[h + 156] in (0, 48)
                    and not buf[h + 345]
                )
                if fits and k > 1:
                    h = off[first + 1] - base - HEADER
                    fits = (
                        buf.startswith(kb + r[1], h)
                        and buf[h + 124 : h + 136] == b"%011o\0" % size[first + 1]
                        and buf[h + 156] in (0, 48)
                        and not buf[h + 345]
                    )
                    if fits and k > 2:
                        h = off[first + 2] - base - HEADER
                        fits = (
                            buf.startswith(kb + r[2], h)
                            and buf[h + 124 : h + 136] == b"%011o\0" % size[first + 2]
                            and buf[h + 156] in (0, 48)
                            and not buf[h + 345]
                        )
            elif fits:
                raws = self.raws
                for m in range(first, end):
                    h = off[m] - base - HEADER
                    if not (
                        buf.startswith(kb + raws[fid[m]], h)
                        and buf[h + 124 : h + 136] == b"%011o\0" % size[m]
                        and buf[h + 156] in (0, 48)
                        and not buf[h + 345]
                    ):
                        fits = False
                        break
            if not fits:
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


def _uniform_names(members: ShardMembers) -> tuple[str, ...]:
    """The fields of every sample, in order, if all samples have the same 1-3; else ``()``.

    Sample ``j``'s members are then ``k * j .. k * j + k - 1`` (``k`` the count).
    """
    starts, fid = members.sample_start, members.member_field
    k = int(starts[1]) if len(starts) > 1 else 0
    if not 1 <= k <= 3 or len(fid) != k * (len(starts) - 1):
        return ()
    if not (np.array_equal(np.diff(starts), np.full(len(starts) - 1, k))):
        return ()
    if not bool(np.all(fid.reshape(-1, k) == fid[:k])):
        return ()
    names = tuple(members.fields[f] for f in fid[:k].tolist())
    return names if len(set(names)) == k else ()  # a field twice: the loop keeps the last
