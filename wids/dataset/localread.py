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
        checked: One byte a sample: its members' tar headers were checked in bytes read
            through :attr:`descriptor` (the file this process opened, checked on first touch
            and holds open), so a read of it again checks none. Cleared when the descriptor is
            replaced (the pool dropped it: the path may name another file now). Bytes the
            reader reads instead are checked every time.
    """

    __slots__ = (
        "checked",
        "descriptor",
        "descriptors",
        "failed",
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
        self.checked = bytearray(len(members))  # samples whose headers this descriptor gave
        self.stats = stats
        self.reads = self.failed = 0

    def pread(self, start: int, end: int) -> tuple[bytes, bytearray | None]:
        """Exactly the bytes ``[start, end)`` of the shard: one ``pread`` (the reader's if not).

        Returns:
            The bytes, and the samples whose headers were checked in bytes of the same open
            file (:attr:`checked`), or ``None`` when they come from the reader.
        """
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
        return data, self.checked

    def reread(self, start: int, end: int) -> tuple[bytes, bytearray | None]:
        """``[start, end)`` after a short read, or when the descriptor is gone.

        A descriptor the pool dropped (or the first read's) is taken again, with a new
        :attr:`checked` (maybe another file at the path now: every header again), and read;
        otherwise the reader reads, and raises the right error (or reads the bytes after all).

        Returns:
            The bytes, and :attr:`checked` if they come from the descriptor (else ``None``).
        """
        if self.descriptor.dropped:
            self.checked = bytearray(len(self.checked))
            try:
                self.descriptor = self.descriptors.descriptor(self.path)
                data = self.descriptor.pread(end - start, start)
            except OSError:
                data = b""
            if len(data) == end - start:
                stats = self.stats
                stats.requests += 1
                stats.bytes_read += end - start
                return data, self.checked
        return self.reader.read_span(start, end, self.stats), None

    def before(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the shard (the records before a sample's first member)."""
        return self.pread(start, end)[0]

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
        # the table was validated as it loaded (ShardMembers: offsets from 512 on, in tar
        # order): the read from the first member's header holds every member's header; a
        # sample checked in bytes of this descriptor already is read without it
        checked: bytearray | None = self.checked
        done = self.checked[j]
        start = off[first] if done else off[first] - HEADER
        n = off[end - 1] + size[end - 1] - start
        try:
            buf = self.descriptor.pread(n, start)
        except OSError:
            buf = b""
        if len(buf) == n:
            stats = self.stats
            stats.requests += 1
            stats.bytes_read += n
        else:  # a descriptor taken again (a new checked), or the reader's bytes (None)
            start = off[first] - HEADER
            try:
                buf, checked = self.reread(start, off[end - 1] + size[end - 1])
            except BaseException:
                self.failed += 1
                raise
            done = 0
        ko = self.ko
        if not done:
            # every member's tar header, once per sample and descriptor (the bytes of a file
            # held open): header_fits's tests inlined (a call a member is ~10% of a read); a
            # member that does not pass them sends the sample to the exact check, which
            # raises (or passes it: a writer's other rendering of a header, a long name)
            kb = self.blob[ko[j] : ko[j + 1]]
            k = len(names)
            if not self.short:
                fits = False
            elif k:  # unrolled: every sample has these fields (~15% of the check's time)
                r = self.raws_of_names
                fits = (
                    buf.startswith(kb + r[0])
                    and buf[124:136] == b"%011o\0" % size[first]
                    and buf[156] in (0, 48)
                    and not buf[345]
                )
                if fits and k > 1:
                    h = off[first + 1] - start - HEADER
                    fits = (
                        buf.startswith(kb + r[1], h)
                        and buf[h + 124 : h + 136] == b"%011o\0" % size[first + 1]
                        and buf[h + 156] in (0, 48)
                        and not buf[h + 345]
                    )
                    if fits and k > 2:
                        h = off[first + 2] - start - HEADER
                        fits = (
                            buf.startswith(kb + r[2], h)
                            and buf[h + 124 : h + 136] == b"%011o\0" % size[first + 2]
                            and buf[h + 156] in (0, 48)
                            and not buf[h + 345]
                        )
            else:
                raws, fid = self.raws, self.fid
                fits = True
                for m in range(first, end):
                    h = off[m] - start - HEADER
                    if not (
                        buf.startswith(kb + raws[fid[m]], h)
                        and buf[h + 124 : h + 136] == b"%011o\0" % size[m]
                        and buf[h + 156] in (0, 48)
                        and not buf[h + 345]
                    ):
                        fits = False
                        break
            if not fits:
                try:
                    self.check(j, first, end, buf, start)
                except BaseException:
                    self.failed += 1
                    raise
            if checked is not None:
                checked[j] = 1
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
        buf, checked = ls.pread(start, end)
        for _, _, _, pos, i, j in spans[k:m]:
            if checked is None:
                out[pos] = ls.sample(j, i, buf, start)
            else:
                out[pos] = ls.sample(j, i, buf, start, bool(checked[j]))
                checked[j] = 1
        k = m
    return out
