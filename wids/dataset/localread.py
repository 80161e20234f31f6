"""The fast path of local shards: global index -> span -> one ``os.pread`` -> a sample dict.

A local shard is read in place, and random access over local files is bounded by Python, not
by the disk: a :class:`LocalShard` is made once per shard and process, when its reader opens
(after the first-touch checks), and holds what a read needs: the member table's memoryviews
and its file's :class:`~wids.storage.descriptors.Descriptor` from the dataset's
:class:`~wids.storage.DescriptorPool`, read without the pool's lock or a look-up by path.
:meth:`LocalShard.read` is one sample with one ``pread``; :func:`read_local_batch` reads a
batch of local samples, one ``pread`` per run of samples that follow each other in a shard.
Anything unusual (a descriptor not open yet or dropped by the pool, a short read) goes through
the shard's reader, which raises the right error.

:class:`LocalShard` is a :class:`~wids.dataset.tables.MemberTable`: its batches' samples are
built by :meth:`~wids.dataset.tables.MemberTable.sample`, as every other read's; ``ds[i]``'s
(:meth:`LocalShard.read`) by an inlined copy of it, held to the same samples by a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..storage import DescriptorPool
from .tables import HEADER, MemberTable

if TYPE_CHECKING:
    from ..index import ShardMembers
    from ..storage import IOStats
    from .readers import LocalReader

__all__ = ["LOCAL_GAP", "LocalShard", "read_local_batch"]

Located = Sequence[tuple[int, int, int]]

LOCAL_GAP = 1024
"""In a batch, local samples of one shard at most this many bytes apart share a ``pread``.

Samples that follow each other in a tar file are less than 1,024 bytes apart (a header and
padding). A wider ``merge_gap`` is not used locally: copying the gap costs more than a
``pread``.
"""


class LocalShard(MemberTable):
    """One local shard's member table (a :class:`MemberTable`) and its ``pread``.

    The pool keeps it as the shard's member table too: one object per shard and process.

    Args:
        reader: The shard's open reader (opened and checked by the pool); reads that do not
            come back whole go through it.
        members: The shard's member table.
        url: The shard's URL (``__shard__``).
        dataset: The name of its dataset component (``__dataset__``).
        stats: The dataset's I/O counters (one request per ``pread``).

    Attributes:
        reads: Samples read by this shard's fast path: pool look-ups (``accesses``), and
            samples returned but for the ``failed`` ones; the pool adds them to its counts
            (one slot increment a read instead of two of the pool's dict).
        failed: Reads that raised.
        names: When every sample has the same one to three fields in the same order (the
            usual shard): their names, in order; else ``()``.
    """

    __slots__ = (
        "descriptor",
        "descriptors",
        "failed",
        "names",
        "path",
        "reader",
        "reads",
        "stats",
    )

    def __init__(
        self,
        reader: LocalReader,
        members: ShardMembers,
        url: str,
        dataset: str,
        stats: IOStats,
    ) -> None:
        super().__init__(members, url, dataset)
        self.reader = reader
        self.path = reader.path
        # the pool checks its process before it makes a LocalShard (reset_process), and the
        # dataset before every read: no getpid() here
        self.descriptors = reader.descriptors
        self.descriptor = DescriptorPool.GONE  # opened by the first read
        self.names = _uniform_names(members)
        self.stats = stats
        self.reads = self.failed = 0

    def pread(self, start: int, end: int) -> bytes:
        """Exactly the bytes ``[start, end)`` of the shard: one ``pread`` (the reader's if not)."""
        n = end - start
        try:
            data = self.descriptor.pread(n, start)
        except OSError:
            data = b""
        if len(data) != n:
            return self.reread(start, end)
        stats = self.stats
        stats.requests += 1
        stats.bytes_read += n
        return data

    def reread(self, start: int, end: int) -> bytes:
        """``[start, end)`` by the reader: after a short read, or when the descriptor is gone.

        A descriptor the pool dropped (or the first read's) is taken again for the next reads;
        the reader raises the right error (or reads the bytes after all).
        """
        if self.descriptor.dropped:
            try:
                self.descriptor = self.descriptors.descriptor(self.path)
            except OSError:
                pass
        return self.reader.read_span(start, end, self.stats)

    def read(self, index: int, j: int) -> dict[str, Any]:
        """Sample ``j`` of the shard (global index ``index``), as the dataset returns it raw.

        The hot path of local random access: :meth:`pread` and
        :meth:`~wids.dataset.tables.MemberTable.sample` inlined (a call each is ~5% of a
        read; ``tests/test_dataset_localread.py`` holds the two to the same samples). When
        every sample has the same one to three fields in the same order (:attr:`names`), the
        dict is one display: no loop, no look-up of a member's field, no resize (~5% more).
        """
        self.reads += 1
        off, size, names = self.off, self.size, self.names
        if names:
            first = j * len(names)
            end = first + len(names)
        else:
            first = self.ss[j]
            end = self.ss[j + 1]
        start = off[first] - HEADER  # from the first member's tar header: all are checked
        if start < 0:  # the check names the member that leaves no room for it
            start = 0
        n = off[end - 1] + size[end - 1] - start
        try:
            buf = self.descriptor.pread(n, start)
        except OSError:
            buf = b""
        if len(buf) == n:
            stats = self.stats
            stats.requests += 1
            stats.bytes_read += n
        else:
            try:
                buf = self.reread(start, start + n)
            except BaseException:
                self.failed += 1
                raise
        # every member's tar header: header_fits's tests inlined (a call a member is ~10% of a
        # read); the first that does not pass them goes to the exact check, which raises
        # (or passes the members: a writer's other rendering of a header)
        ko, raws, fid = self.ko, self.raws, self.fid
        kb = self.blob[ko[j] : ko[j + 1]]
        for m in range(first, end):
            h = off[m] - start - 512
            s = size[m]
            name0 = kb + raws[fid[m]]
            if not (
                0 <= h
                and h + 512 + s <= n
                and len(name0) <= 100
                and buf[h : h + len(name0)] == name0
                and buf[h + 124 : h + 136] == b"%011o\0" % s
                and buf[h + 156] in (0, 48)
                and not buf[h + 345]
            ):
                try:
                    self.check(j, first, end, buf, start)
                except BaseException:
                    self.failed += 1
                    raise
                break
        text = self.text
        if text is not None:
            key = text[ko[j] : ko[j + 1]]
        else:
            key = self.blob[ko[j] : ko[j + 1]].decode("utf-8", "surrogateescape")
        a = off[first] - start
        if len(names) == 3:
            b, c = off[first + 1] - start, off[first + 2] - start
            return {
                names[0]: buf[a : a + size[first]],
                names[1]: buf[b : b + size[first + 1]],
                names[2]: buf[c : c + size[first + 2]],
                "__key__": key,
                "__index__": index,
                "__shard__": self.url,
                "__shardindex__": j,
                "__dataset__": self.dataset,
            }
        if len(names) == 2:
            b = off[first + 1] - start
            return {
                names[0]: buf[a : a + size[first]],
                names[1]: buf[b : b + size[first + 1]],
                "__key__": key,
                "__index__": index,
                "__shard__": self.url,
                "__shardindex__": j,
                "__dataset__": self.dataset,
            }
        fields, fid = self.fields, self.fid
        sample: dict[str, Any] = {}
        for m in range(first, end):
            a = off[m] - start
            sample[fields[fid[m]]] = buf[a : a + size[m]]
        sample["__key__"] = key
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


def read_local_batch(shards: dict[int, LocalShard], located: Located) -> list[dict[str, Any]]:
    """The samples ``(global index, shard, index in shard)`` of local shards, in order.

    Every shard must be in ``shards``; its reads are counted (``LocalShard.reads``). The
    spans are sorted by shard and offset, and samples at most :data:`LOCAL_GAP` bytes apart
    share one ``pread``. A batch of which no sample follows another (a random order) is read
    sample by sample, as ``ds[i]``: nothing to merge, no spans to sort.
    """
    seen = {(shard, j) for _, shard, j in located}
    if not any((shard, j - 1) in seen for _, shard, j in located):
        return [shards[shard].read(i, j) for i, shard, j in located]
    spans = []
    for pos, (i, shard, j) in enumerate(located):
        ls = shards[shard]
        ls.reads += 1
        ss, off = ls.ss, ls.off
        first = ss[j]
        last = ss[j + 1] - 1
        start = max(0, off[first] - HEADER)  # every member's tar header too: all are checked
        spans.append((shard, start, off[last] + ls.size[last], pos, i, j))
    spans.sort()
    out: list[Any] = [None] * len(spans)
    k, n = 0, len(spans)
    while k < n:
        shard, start, end = spans[k][:3]
        m = k + 1
        while m < n and spans[m][0] == shard and spans[m][1] <= end + LOCAL_GAP:
            end = max(end, spans[m][2])
            m += 1
        ls = shards[shard]
        buf = ls.pread(start, end)
        for _, _, _, pos, i, j in spans[k:m]:
            out[pos] = ls.sample(j, i, buf, start)
        k = m
    return out
