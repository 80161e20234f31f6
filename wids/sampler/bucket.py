"""The bucketing batch sampler: every batch holds samples of one bucket, read shard by shard.

A *bucket* is a range of a per-sample key (an aspect ratio, a length in tokens): bucket ``k``
holds the samples with ``boundaries[k - 1] <= key < boundaries[k]``. Training on images of
many shapes or on texts of many lengths wants batches whose samples share a bucket (one
resize, little padding), and wids wants reads that stay inside one shard. One epoch:

1. The dataset is cut into *chunks* exactly as :class:`~wids.ChunkedSampler` does: never
   across a shard boundary, at most ``chunksize`` samples. The chunk order is shuffled.
2. Inside each chunk the samples are grouped by bucket and shuffled within their group; each
   group gives ``len // batch_size`` full batches, all from that chunk (one shard).
3. A group's remainder (fewer than ``batch_size`` samples) waits in its bucket's *pool*, in
   chunk order; whenever a pool holds ``batch_size`` samples they become a batch, emitted
   after the batches of the chunk that completed it (a batch of a few shards; its reads are
   in index order, so it switches shard at most once per shard it holds).
4. At the end of the epoch each bucket's pool holds fewer than ``batch_size`` samples: they
   are *dropped* for this epoch (at most ``num_buckets * (batch_size - 1)`` samples; with
   ``shuffle`` different ones every epoch). Every batch has exactly ``batch_size`` samples.

The epoch then has ``T = sum(bucket_size // batch_size)`` batches whatever the seed, so
lengths are exact: rank ``r`` of ``R`` takes batches ``[r * L, (r + 1) * L)`` of that global
sequence (a contiguous stretch of the chunk order: shard-local), with ``L = T // R`` and the
last ``T mod R`` batches dropped (``drop_last=True``), or ``L = ceil(T / R)`` and the
positions past ``T`` wrapping around to the epoch's first batches (``drop_last=False``: at
most ``R - 1`` batches repeat). No sample is in two batches of an epoch except those repeats.

Every rank computes the whole epoch's batches from ``seed`` and the epoch (numpy, a few
arrays of the dataset's size) and keeps its own. Epochs advance after each full pass as in
the other samplers (``auto_epoch``); ``state_dict`` / ``load_state_dict`` resume mid-epoch,
also on another world size: the batches each old rank had not consumed, in rank order, are cut
into equal slices for the new ranks (the state lists the epoch's *stages*, see
:meth:`BucketBatchSampler.load_state_dict`).
Over remote shards the batches carry the read plan (:mod:`wids.plan`), as the other samplers'
indices do, so a DataLoader's workers read ahead the same way.
"""

from __future__ import annotations

import itertools
import operator
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import SamplerStateError
from ..plan import first_plan, planned_order
from .chunked import _shard_lengths
from .chunks import _boundaries, _cuts_crc
from .resplit import refuse_resplit

__all__ = ["BucketBatchSampler"]

_STATE_FORMAT = "wids-bucket-sampler-state"
_STATE_VERSION = 1
_BLOCK = 1024  # batches turned into Python lists at a time
# state fields that must match for its batches to be this sampler's (any world size)
_STATE_CHECKED = ("seed", "batch_size", "drop_last", "shuffle", "chunksize", "layout", "buckets")
_STATE_NAMES = {"layout": "shard layout", "buckets": "bucket of each sample"}
# a state is input: loading works per rank of every stage, so bound what it may ask for
_MAX_RANKS = 1 << 22  # all stages' ranks together
_MAX_STAGES = 1024


def _key_values(dataset: Any, keys: Any, n: int) -> np.ndarray:
    """The per-sample keys as a 1-d numeric array of length ``n``."""
    if isinstance(keys, str):
        column = getattr(dataset, "column", None)
        if not callable(column):
            raise TypeError(
                f"keys={keys!r} names a column, but {type(dataset).__name__} has no "
                ".column(name): pass the keys as an array aligned with the dataset"
            )
        keys = column(keys)
    values = np.asarray(keys)
    if values.ndim != 1 or len(values) != n:
        raise ValueError(
            f"keys must be one value per sample: {n} for this dataset, got shape {values.shape}"
        )
    if values.dtype.kind not in "biuf":
        raise TypeError(f"keys must be numbers, got dtype {values.dtype}")
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values)
        if bad.any():
            first = int(np.argmax(bad))
            raise ValueError(
                f"keys must be finite: {int(bad.sum())} are not, the first is sample {first} "
                f"({values[first]!r}); exclude those samples (ShardListDataset(exclude=...)) "
                "or give them a value"
            )
    return values


def _check_boundaries(boundaries: Sequence[float]) -> np.ndarray:
    edges = np.asarray(boundaries, dtype=np.float64)
    if edges.ndim != 1 or not np.isfinite(edges).all() or (np.diff(edges) <= 0).any():
        raise ValueError(
            f"boundaries must be finite and strictly increasing, got {list(boundaries)!r}"
        )
    return edges


def quantile_boundaries(values: Any, num_buckets: int) -> np.ndarray:
    """Boundaries that cut ``values`` into ``num_buckets`` buckets of about equal counts.

    Each boundary is a value that occurs (``np.quantile(method="higher")``), so samples with
    equal keys share a bucket; ties can leave fewer buckets than asked for (never an empty
    one). With at most ``num_buckets`` distinct values, each value is a bucket of its own.
    """
    if operator.index(num_buckets) < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    values = np.asarray(values)
    if num_buckets == 1 or len(values) == 0:
        return np.zeros(0, dtype=np.float64)
    ordered = np.sort(values)  # one sort for both answers
    distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))].astype(np.float64)
    if len(distinct) <= num_buckets:  # a bucket for each value (aspect ratios often are few)
        each: np.ndarray = distinct[1:]
        return each
    # np.quantile(values, q, method="higher"): the value at rank ceil(q * (n - 1))
    ranks = np.ceil(np.arange(1, num_buckets) / num_buckets * (len(ordered) - 1)).astype(np.int64)
    edges = np.unique(ordered[ranks].astype(np.float64))
    above: np.ndarray = edges[edges > distinct[0]]
    return above


def _bucket_of(values: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    """Each value's bucket (the number of boundaries <= it), in the smallest unsigned type."""
    dtype = np.uint8 if len(boundaries) < 255 else np.uint16 if len(boundaries) < 65535 else None
    if dtype is None:
        return np.searchsorted(boundaries, values, side="right").astype(np.int64)
    bucket: np.ndarray = np.zeros(len(values), dtype=dtype)
    for edge in boundaries.tolist():  # a compare per boundary beats a binary search per value
        np.add(bucket, values >= edge, out=bucket)
    return bucket


def _chunk_bounds(cuts: np.ndarray, chunksize: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` of every chunk: shards (``cuts``) cut into pieces of ``chunksize``."""
    counts = -(-np.diff(cuts) // chunksize)
    total = int(counts.sum())
    first = np.cumsum(counts) - counts
    lo = np.repeat(cuts[:-1], counts) + (np.arange(total) - np.repeat(first, counts)) * chunksize
    return lo, np.minimum(lo + chunksize, np.repeat(cuts[1:], counts))


def _epoch_batches(
    bucket: np.ndarray,
    nbuckets: int,
    chunks: tuple[np.ndarray, np.ndarray],
    batch_size: int,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """All of an epoch's batches, ``(T, batch_size)``, in order; ``rng=None``: no shuffle."""
    B = batch_size
    chunk_lo, chunk_hi = chunks
    nchunks = len(chunk_lo)
    order = rng.permutation(nchunks) if rng is not None else np.arange(nchunks)
    lo, sizes = chunk_lo[order], chunk_hi[order] - chunk_lo[order]
    n = int(sizes.sum())
    # the samples chunk by chunk (in chunk order), each tagged with its (chunk, bucket) group
    seq = np.arange(n, dtype=np.int64) + np.repeat(lo - (np.cumsum(sizes) - sizes), sizes)
    group = np.repeat(np.arange(nchunks, dtype=np.int64), sizes) * nbuckets + bucket[seq]
    # group by group, shuffled inside each group (else in index order): one key per sample
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    if (nchunks * nbuckets + 1) * (n + 1) < 1 << 62:
        sort = np.argsort(group * n + tie)  # unique keys: no stable sort needed, and 9x faster
    else:
        sort = np.lexsort((tie, group))
    seq, group = seq[sort], group[sort]
    counts = np.bincount(group, minlength=nchunks * nbuckets)
    within = np.arange(n) - (np.cumsum(counts) - counts)[group]
    full = within < (counts - counts % B)[group]
    own = seq[full].reshape(-1, B)  # a group's full batches: consecutive slices of it
    own_chunk = group[full][::B] // nbuckets
    # remainders: per bucket, in chunk order, cut into batches (the last partial one dropped)
    rest, rest_group = seq[~full], group[~full]
    rest_bucket = rest_group % nbuckets
    by_bucket = np.argsort(rest_bucket, kind="stable")
    rest, rest_bucket, rest_chunk = (
        rest[by_bucket],
        rest_bucket[by_bucket],
        rest_group[by_bucket] // nbuckets,
    )
    pool = np.bincount(rest_bucket, minlength=nbuckets)
    place = np.arange(len(rest)) - (np.cumsum(pool) - pool)[rest_bucket]
    kept = place < (pool - pool % B)[rest_bucket]
    pooled = rest[kept].reshape(-1, B)
    pooled_chunk = rest_chunk[kept][B - 1 :: B]  # a pooled batch is complete after this chunk
    batches = np.concatenate([own, pooled])
    when = np.concatenate([own_chunk, pooled_chunk])
    kind = np.concatenate([np.zeros(len(own), np.int8), np.ones(len(pooled), np.int8)])
    tie = rng.permutation(len(batches)) if rng is not None else np.arange(len(batches))
    batches = batches[np.lexsort((tie, kind, when))]
    batches.sort(axis=1)  # a batch is a set: read it in index (offset) order
    return batches


def _per_rank(total: int, replicas: int, drop_last: bool) -> int:
    return total // replicas if drop_last else -(-total // replicas)


def _rest(seq: np.ndarray, replicas: int, length: int, position: int) -> np.ndarray:
    """What a stage left unread: each rank's slots ``[position, length)`` in rank order.

    Slot ``j`` of the stage (rank ``j // length``) reads ``seq[j % len(seq)]``; slots past
    ``len(seq)`` are padding copies: left out, and so is a batch whose copy was read before
    the checkpoint (its original may come later in its rank's order). ``drop_last``'s dropped
    tail is never a slot.
    """
    if not length or not len(seq):
        return seq[:0]
    slots = np.arange(replicas * length)
    unread = slots % length >= position
    real = slots < len(seq)
    copies_read = slots[~real & ~unread] % len(seq)
    keep = real & unread
    keep[copies_read] = False
    rest: np.ndarray = seq[slots[keep]]
    return rest


def _read_stages(state: dict[str, Any]) -> list[tuple[int, int, int]]:
    """The ``(num_replicas, length, position)`` of each stage of the saved epoch."""
    if not isinstance(state.get("stages"), list) or not 0 < len(state["stages"]) <= _MAX_STAGES:
        raise SamplerStateError(
            f"bucket sampler state: 'stages' must be a list of 1 to {_MAX_STAGES} stages"
        )
    try:
        stages = [
            (
                operator.index(s["num_replicas"]),
                operator.index(s["length"]),
                operator.index(s["position"]),
            )
            for s in state["stages"]
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise SamplerStateError(f"bucket sampler state: malformed stages ({e!r})") from None
    if any(r < 1 or not 0 <= p <= n for r, n, p in stages):
        raise SamplerStateError(f"bucket sampler state: malformed stages {state['stages']!r}")
    if sum(r for r, _, _ in stages) > _MAX_RANKS:
        raise SamplerStateError(f"bucket sampler state: more than {_MAX_RANKS} ranks in its stages")
    return stages


def _rows(batches: np.ndarray) -> Iterator[list[int]]:
    """The rows of ``batches`` as lists of ints, a block at a time (not all at once)."""
    for start in range(0, len(batches), _BLOCK):
        yield from batches[start : start + _BLOCK].tolist()


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        from .distributed import _world as from_torch

        return from_torch(num_replicas, rank)
    replicas, index = operator.index(num_replicas), operator.index(rank)
    if replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {replicas}")
    if not 0 <= index < replicas:
        raise ValueError(f"rank must be in [0, {replicas - 1}], got {index}")
    return replicas, index


class BucketBatchSampler:
    """Batches whose samples share a bucket of a per-sample key, read shard by shard.

    Pass it as ``DataLoader(dataset, batch_sampler=sampler)``. The order is described in
    :mod:`wids.sampler.bucket` and ``docs/bucketing.md``: shard-local chunks, each chunk's
    samples grouped by bucket into full batches, remainders pooled per bucket, each bucket's
    last partial batch of the epoch dropped; ranks take equal contiguous slices of the epoch.

    Args:
        dataset: A ``ShardListDataset`` (or anything with ``.lengths``, its shards' sample
            counts, or any sized object: one shard).
        keys: One number per sample, aligned with the dataset (a numpy array or sequence of
            ``len(dataset)``), or the name of a column the dataset has (``dataset.column(name)``).
        batch_size: Samples in every batch.
        boundaries: Increasing bucket boundaries: bucket ``k`` holds the keys in
            ``[boundaries[k - 1], boundaries[k])`` (the first and last bucket are open).
        num_buckets: Instead of ``boundaries``: that many buckets of about equal counts
            (boundaries at the keys' quantiles, see :func:`quantile_boundaries`).
        num_replicas: Number of ranks; ``None``: ``torch.distributed``'s world size if a process
            group is initialised, else 1.
        rank: This rank; ``None``: ``torch.distributed.get_rank()`` if a process group is
            initialised, else 0.
        chunksize: Largest number of samples in a chunk (chunks never cross shards).
        seed: The order of epoch ``e`` depends on ``(seed, e)`` only; the same on every rank.
        shuffle: Shuffle the chunk order, the samples inside each chunk's buckets and the
            batches of each chunk; ``False``: chunks in order, samples in index order.
        drop_last: ``True``: every rank gets ``T // R`` batches, the last ``T mod R`` of the
            epoch are dropped; ``False``: ``ceil(T / R)``, the missing ones taken again from the
            start of the epoch.
        auto_epoch: As for :class:`~wids.ChunkedSampler`: ``None``/``True`` advance the epoch
            after each complete pass, ``False`` never.

    Attributes:
        boundaries: The bucket boundaries (float64 array).
        num_buckets: ``len(boundaries) + 1``.
        bucket_sizes: Samples per bucket (int64 array).

    Raises:
        ValueError: Keys not one finite number per sample, both or neither of ``boundaries``
            and ``num_buckets``, boundaries not increasing, a bad rank or option.
        TypeError: ``keys`` names a column of a dataset without ``.column()``, or is not
            numeric.

    Example:
        >>> keys = [0.5, 2.0, 0.7, 1.9, 0.6, 2.1, 0.4, 1.8]
        >>> sampler = BucketBatchSampler(keys, keys, batch_size=2, boundaries=[1.0], seed=1)
        >>> batches = list(sampler)
        >>> len(batches), sorted(len({keys[i] > 1 for i in b}) for b in batches)
        (4, [1, 1, 1, 1])
    """

    def __init__(
        self,
        dataset: Any,
        keys: Any,
        *,
        batch_size: int,
        boundaries: Sequence[float] | None = None,
        num_buckets: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        chunksize: int = 2000,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        auto_epoch: bool | None = None,
    ) -> None:
        if operator.index(batch_size) < 1 or operator.index(chunksize) < 1:
            raise ValueError(f"batch_size and chunksize must be >= 1: {batch_size}, {chunksize}")
        if (boundaries is None) == (num_buckets is None):
            raise ValueError("give either boundaries or num_buckets")
        self.num_replicas, self.rank = _world(num_replicas, rank)
        lengths = _shard_lengths(dataset)
        values = _key_values(dataset, keys, int(lengths.sum()))
        if num_buckets is None:
            self.boundaries = _check_boundaries([] if boundaries is None else boundaries)
        else:
            self.boundaries = quantile_boundaries(values, operator.index(num_buckets))
        self.num_buckets = len(self.boundaries) + 1
        self._bucket = _bucket_of(values, self.boundaries)
        self.bucket_sizes = np.bincount(self._bucket, minlength=self.num_buckets)
        self.batch_size, self.chunksize = int(batch_size), int(chunksize)
        self.seed, self.epoch = operator.index(seed), 0
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.auto_epoch = None if auto_epoch is None else bool(auto_epoch)
        self._cuts = _boundaries(lengths)
        self._chunks = _chunk_bounds(self._cuts, self.chunksize)
        self._total = int((self.bucket_sizes // self.batch_size).sum())
        replicas = self.num_replicas
        self._length = self._total // replicas if self.drop_last else -(-self._total // replicas)
        self._crcs: tuple[int, int] | None = None
        self._position = 0  # batches handed out by the current iterator
        self._resume = 0  # batches to skip at the start of the next iterator
        # an epoch resumed on another world size: the stages before the one this sampler reads
        # (each ``(num_replicas, length, position)``), and the length of its own stage
        self._done: list[tuple[int, int, int]] = []
        self._stage_length = self._length
        # the epoch a pass just completed and advanced from (with its stages), until the next
        # pass starts: a position given to state_dict() then still means that epoch
        self._finished: tuple[int, list[tuple[int, int, int]], int] | None = None
        # read, never configured: the dataset learns the plan from the indices handed out
        reads_plans = getattr(dataset, "_reads_plans", None)
        self._reader = dataset if callable(reads_plans) else None

    @property
    def buckets(self) -> np.ndarray:
        """The bucket of every sample (unsigned ints, aligned with the dataset; read-only)."""
        view = self._bucket.view()
        view.flags.writeable = False
        return view

    @property
    def total_batches(self) -> int:
        """Batches in an epoch over all ranks, before padding or dropping for the ranks."""
        return self._total

    def __len__(self) -> int:
        """Batches per epoch on this rank: exact, the same on every rank and every epoch."""
        return self._length

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next iteration on (as ChunkedSampler)."""
        epoch = operator.index(epoch)
        if epoch != self.epoch:  # a loaded position (and resumed stages) belong to its epoch
            self._resume = 0
            self._done, self._stage_length = [], self._length
        self.epoch, self._finished = epoch, None

    def epoch_batches(self, epoch: int | None = None) -> np.ndarray:
        """All ranks' batches of ``epoch`` (default: the current one), ``(T, batch_size)``."""
        epoch = self.epoch if epoch is None else operator.index(epoch)
        rng = None
        if self.shuffle:
            entropy = [self.seed & (2**64 - 1), epoch & (2**64 - 1)]
            rng = np.random.default_rng(np.random.SeedSequence(entropy))
        return _epoch_batches(self._bucket, self.num_buckets, self._chunks, self.batch_size, rng)

    def _stage_batches(self) -> np.ndarray:
        """Global batch numbers of the stage this sampler reads (the whole epoch if plain)."""
        seq = np.arange(self._total)
        for replicas, length, position in self._done:
            seq = _rest(seq, replicas, length, position)
        return seq

    def _rank_batches(self) -> np.ndarray:
        batches = self.epoch_batches()
        seq = self._stage_batches() if self._done else np.arange(self._total)
        length = self._stage_length
        if length == 0:
            return batches[:0]
        start = self.rank * length
        return batches[seq[np.arange(start, start + length) % len(seq)]]

    def __iter__(self) -> Iterator[list[int]]:
        refuse_resplit(self)
        start, self._resume = self._resume, 0
        self._position, self._finished = start, None
        return self._generate(start)

    def _generate(self, start: int) -> Iterator[list[int]]:
        batches = self._rank_batches()[start:]
        reader = self._reader
        if reader is not None and reader._reads_plans():
            # each index carries what follows it; positions count samples, batches are full
            flat = itertools.chain.from_iterable(_rows(batches))
            plan, order = first_plan(planned_order(flat, start * self.batch_size))
            if plan is not None:  # the first window: after a DataLoader's workers start
                reader._plan_begins(plan)
            try:
                for _ in range(len(batches)):
                    batch = list(itertools.islice(order, self.batch_size))
                    self._position += 1
                    yield batch
            finally:  # the iteration ended or was dropped: a warm-up for it stops
                if plan is not None:
                    reader._plan_ends(plan)
        else:
            for batch in _rows(batches):
                self._position += 1
                yield batch
        finished = (self.epoch, self._done, self._stage_length)
        if self._done:  # the resumed epoch is complete: back to this world size's order
            self._done, self._stage_length = [], self._length
        if self.auto_epoch is not False:
            self._finished = finished
            self.epoch += 1
            self._position = 0

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """The epoch and position (batches consumed on this rank) to resume from.

        Args:
            position: Batches of this epoch consumed on this rank; default: how many the
                sampler has handed out (a DataLoader with workers runs ahead of the training
                loop by its prefetched batches: pass the step the loop reached, or use a
                ``StatefulDataLoader``, which snapshots the sampler batch by batch). If the
                loader has already drawn the epoch's last batch (the sampler has moved on to
                the next epoch, whose pass has not begun), a non-zero position is one of the
                epoch that pass completed.

        Returns:
            Plain values (JSON- and ``torch.save``-friendly), the same on every rank in
            lockstep. ``stages`` lists the world sizes the epoch ran on so far, each with its
            batches per rank and the position reached (one stage unless it was resumed on
            another world size).
        """
        pos = self._position if position is None else operator.index(position)
        epoch, done, stage_length = self.epoch, self._done, self._stage_length
        if pos and position is not None and self._finished is not None:
            epoch, done, stage_length = self._finished
        if not 0 <= pos <= stage_length:
            raise ValueError(f"position must be in [0, {stage_length}], got {pos}")
        stages = [*done, (self.num_replicas, stage_length, pos)]
        return {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "epoch": epoch,
            "position": pos,
            "num_replicas": self.num_replicas,
            "length": self._length,
            **self._settings(),
            "stages": [{"num_replicas": r, "length": n, "position": p} for r, n, p in stages],
        }

    def _settings(self) -> dict[str, Any]:
        if self._crcs is None:
            buckets = zlib.crc32(self.boundaries.tobytes())
            self._crcs = (_cuts_crc(self._cuts), zlib.crc32(self._bucket.tobytes(), buckets))
        return {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "chunksize": self.chunksize,
            "layout": self._crcs[0],
            "buckets": self._crcs[1],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore epoch and position: the next iteration yields the rest of that epoch.

        A state saved on another number of ranks resumes *elastically*: the batches each old
        rank had not consumed (its positions ``[position, length)``, padding copies left out),
        in rank order, are cut into equal consecutive slices for the ranks of this world
        size (``drop_last`` as for a fresh epoch), so every batch of the epoch is read once
        overall. Later epochs are this world size's normal order.

        Raises:
            SamplerStateError: Not a state of this sampler, or saved over other data (shard
                layout, keys or boundaries), with another seed or batch settings (a
                ``ValueError`` too).
        """
        if (
            not isinstance(state, dict)
            or state.get("format") != _STATE_FORMAT
            or state.get("version") != _STATE_VERSION
        ):
            raise SamplerStateError(f"not a {_STATE_FORMAT} version {_STATE_VERSION} dict")
        try:
            epoch = operator.index(state["epoch"])
        except (KeyError, TypeError) as e:
            raise SamplerStateError(f"bucket sampler state: no valid epoch ({e!r})") from None
        mine = self._settings()
        for key in _STATE_CHECKED:
            if state.get(key) != mine[key]:
                raise SamplerStateError(
                    f"bucket sampler state was saved with another {_STATE_NAMES.get(key, key)} "
                    f"({key}={state.get(key)!r}, this sampler has {mine[key]!r})"
                )
        stages = _read_stages(state)
        *done, (replicas, length, position) = stages
        if replicas != self.num_replicas:  # a new stage: the rest, from its start
            done, position = stages, 0
        seq = np.arange(self._total)
        for r, n, p in done:
            if n != _per_rank(len(seq), r, self.drop_last):
                raise SamplerStateError(
                    f"bucket sampler state: a stage of {r} ranks with {n} batches each, but "
                    f"{len(seq)} batches give {_per_rank(len(seq), r, self.drop_last)}"
                )
            seq = _rest(seq, r, n, p)
        stage_length = _per_rank(len(seq), self.num_replicas, self.drop_last)
        if not 0 <= position <= stage_length:
            raise SamplerStateError(f"position must be in [0, {stage_length}], got {position}")
        self.epoch = epoch
        self._done, self._stage_length, self._finished = done, stage_length, None
        self._resume = self._position = position

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(buckets={self.num_buckets}, batch_size={self.batch_size}, "
            f"rank={self.rank}/{self.num_replicas}, len={self._length}, epoch={self.epoch})"
        )
