"""``ShardListDataset``: map-style random access to the samples of WebDataset shards.

A global index maps to (shard, sample) by a binary search over the cumulative lengths; the
sample's byte span comes from the shard's member table (``ShardMembers``, loaded lazily and kept)
and is read with one range request, then sliced into its fields. A batch
(``__getitems__``) becomes one request per run of nearby samples of a shard, all in flight at
once. Readers are opened lazily in each process and never pickled.

The dataset is composed of objects it owns: a :class:`~wids.dataset.catalog.Catalog` (what it
reads: the ``shards`` argument resolved to shards, member tables and components, and the
first-touch checks), a :class:`~wids.dataset.pool.ReaderPool` (how it reads: the open readers,
the access mode, the shard cache's use and promotion) and a
:class:`~wids.dataset.localcache.LocalCache` both share (``cache_dir`` and ``offline``). Its
public attributes are those objects' settings, read and set through the dataset.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic

import numpy as np

from ..decode import Decoder, interpret_transformations
from ..index import check_url_map
from ..index.spec import StreamContent
from ..plan import Plan, plan_of
from ..samples import DUPLICATE_POLICIES, DuplicatePolicy
from ..storage import ReadLimits, RetryPolicy, Store, forks, is_local, named_by
from ..storage.urls import anchored
from .catalog import MAX_SAMPLE_BYTES, Catalog, display_url
from .description import DatasetComponent
from .exclusions import parse_exclude
from .localcache import LocalCache
from .memberfile import MemberFile, check_stream_over, member_file, streamed_sample
from .pool import ACCESS_MODES, ReaderPool
from .shardview import ShardView
from .stats import DatasetStats

__all__ = ["ShardListDataset"]

Transform = Callable[[dict[str, Any]], Any]

if TYPE_CHECKING:
    from torch.utils.data import Dataset as _DatasetBase
    from typing_extensions import TypeVar

    from .concat import ShardConcatDataset

    # What ``ds[i]`` returns; unannotated datasets read as ``ShardListDataset[Any]``.
    T_co = TypeVar("T_co", covariant=True, default=Any)
else:
    from typing import TypeVar

    T_co = TypeVar("T_co", covariant=True)
    try:
        from torch.utils.data import Dataset as _DatasetBase
    except ImportError:  # the core works without torch: a generic base of our own

        class _DatasetBase(Generic[T_co]):
            """What ``torch.utils.data.Dataset`` gives a subclass, for when torch is absent."""

            __slots__ = ()


class _Setting:
    """A public attribute of the dataset that is a setting of one of its parts."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class ShardListDataset(_DatasetBase[T_co]):
    """A map-style dataset over WebDataset tar shards, reading only the samples asked for.

    With torch installed it is a ``torch.utils.data.Dataset`` (generic: annotate
    ``ShardListDataset[dict]``), and ``ds1 + ds2`` is a ``ConcatDataset`` the samplers read
    shard by shard; without torch it is still generic, and ``+`` needs torch.

    A drop-in for the reference ``wids.ShardListDataset`` (see ``docs/compat.md``), with member
    offsets: ``ds[i]`` is one range request for that sample's bytes, wherever the shards are.

    Samples are dicts: field keys keep the leading dot and the full extension (``".jpg"``,
    ``".seg.png"``, ``".txt.gz"``), plus ``__key__``, ``__index__`` (the non-negative index),
    ``__shard__`` (resolved shard URL), ``__shardindex__`` and ``__dataset__`` (the component's
    name, ``""`` if none, never ``None`` so ``default_collate`` accepts it).

    **Difference from the reference:** raw field values (``transformations=[]``) are ``bytes``,
    not ``io.BytesIO``. Decoders here accept both; a transformation of your own that calls
    ``value.read()`` needs ``io.BytesIO(value)`` instead.

    Args:
        shards: Our index (JSON or SQLite, path or URL), a reference ``wids-shard-index-v1``
            JSON (path, URL or open text stream), a list of ``{"url", "nsamples"}`` dicts, or
            a brace pattern / list of shard URLs (scanned on first use).
        cache_size: Byte budget of the shard cache (``access="shard"``).
        cache_dir: Local cache directory: whole shards (``access="shard"``) and member tables of
            shards whose index has no offsets (scanned once per machine).
        lru_size: Open shard readers (file descriptors, cached shards) kept per process.
        localname: Not supported (the cache chooses collision-free names); warns if given.
        transformations: ``"PIL"``, ``"numpy"``, an image mode (``"rgb8"``, ``"torchrgb"`` ...,
            see ``wids.decode.IMAGE_MODES``), a callable, or a list of those; ``[]`` for raw.
        keep: Never evict shards from the cache automatically (``access="shard"``).
        base: Directory against which relative shard URLs resolve.
        options: As the reference: top-level keys that override the description's; only
            ``name`` is supported, others warn.
        dataset_name: Name of the dataset when ``shards`` is a list (reference parameter).
        storage_options: fsspec options for every URL (index and shards).
        access: ``"auto"`` (local files read in place, remote shards by range requests and,
            with ``cache_dir``, fetched whole into the cache in the background when the
            sampler's plan or the recent reads show most of a shard will be read; a random
            order is never promoted; see ``wids.cache.Promoter``), ``"range"`` (range
            requests always) or ``"shard"`` (whole shards into ``cache_dir``, local reads).
        verify: On first touch of a shard in a process, check that it is the shard the index
            describes: its fingerprint (size, plus etag, or mtime where the store gives no
            etag; one ``info()``) and the tar header of one recorded member (one 512-byte
            read); a mismatch raises ``IndexMismatchError``. Whatever ``verify``, every read
            checks the tar headers of the members it returns.
        retry: Retry and timeout policy for storage requests.
        read_limits: The most bytes a remote index description, member-table sidecar, SQLite
            index or ``.widx`` table may have (a larger one is ``TooLargeError``, never read
            whole); ``ReadLimits()``'s defaults when ``None``.
        merge_gap: In a batch, samples of one shard closer than this many bytes share a request
            (consecutive samples always do: only tar headers lie between them). 16 KiB, from
            ``tools/bench_merge_gap.py``: 64 KiB read 1.4-3x the samples' bytes in a chunked
            order with no gain in samples/s, on loopback or through the latency proxy.
        offline: Never touch the network: remote data that is not cached raises ``OfflineError``.
        duplicates: Policy for repeated keys or fields when a shard must be scanned
            (``"error"``, ``"split"``, ``"keep_first"``).
        allow_pickle: Let the decoders unpickle ``.pyd/.pickle/.pkl/.pt/.pth`` fields.
        promote_share: With ``access="auto"``, ``cache_dir`` and no plan: the share (0 to 1)
            of a remote shard's bytes requested by range (in a row) before it is cached whole.
        url_map: Read shards from a mirror or proxy holding the same bytes:
            ``{"https://old/": "s3://new/"}`` replaces the longest matching prefix of each
            resolved shard URL. A mapped shard is checked by size and member headers (the
            etag and mtime recorded at the old location are another store's).
        allow_local_shards: Let an index read from a remote location (http, s3, gs, ...) name
            local files (absolute paths, ``file://``, ``memory://``); refused by default with
            ``IndexFormatError``, so a crafted remote index cannot serve the user's files.
        max_sample_bytes: The largest sample ``ds[i]`` reads into memory (default 1 GiB:
            ``MAX_SAMPLE_BYTES``); a larger one is ``SampleTooLargeError`` naming shard, key
            and size, before anything is read. ``None`` for no bound.
        stream_over: Members larger than this many bytes come in ``ds[i]`` as seekable file
            objects (:class:`~wids.dataset.memberfile.MemberFile`, as :meth:`open` returns)
            instead of bytes; a mapping (``{".mp4": 0}``) sets it per field (other fields
            stay bytes); ``None`` (the default): every member as bytes. Samples with such a
            member are read member by member, without the lookahead.
        exclude: Samples to leave out, no shard touched (see ``docs/exclusions.md``): a path
            of a file with one entry per line (``KEY``, ``SHARD/KEY`` or ``SHARD<TAB>KEY``;
            ``#`` comment lines and blank lines skipped) or an iterable of such strings,
            ``(shard, key)`` pairs and ints (global sample numbers). ``len``, ``ds[i]``,
            ``lengths``, ``cum_lengths``, ``total_length``, ``components`` and the samplers
            then see only the kept samples. Entries naming no sample are ignored with one
            warning counting them. A local index ``P`` with a file ``P.exclude`` beside it
            (``wids subset --exclude``) opens with that exclusion too.
        exclude_strict: Refuse (``ExclusionError``) entries that name no sample.

    Raises:
        ValueError: An invalid parameter (checked here; all I/O happens lazily).
    """

    def __init__(
        self,
        shards: Any,
        *,
        cache_size: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        lru_size: int = 10,
        localname: Callable[[str], str] | None = None,
        transformations: Any = "PIL",
        keep: bool = False,
        base: str | None = None,
        options: Mapping[str, Any] | None = None,
        dataset_name: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        access: str = "auto",
        verify: bool = True,
        retry: RetryPolicy | None = None,
        read_limits: ReadLimits | None = None,
        merge_gap: int = 1 << 14,
        offline: bool = False,
        duplicates: DuplicatePolicy = "error",
        allow_pickle: bool = False,
        promote_share: float = 0.05,
        url_map: Mapping[str, str] | None = None,
        allow_local_shards: bool = False,
        max_sample_bytes: int | None = MAX_SAMPLE_BYTES,
        stream_over: int | Mapping[str, int] | None = None,
        exclude: Any = None,
        exclude_strict: bool = False,
    ) -> None:
        if access not in ACCESS_MODES:
            raise ValueError(f"access must be one of {ACCESS_MODES}, not {access!r}")
        if duplicates not in DUPLICATE_POLICIES:
            raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}, not {duplicates!r}")
        if isinstance(lru_size, bool) or not isinstance(lru_size, int) or lru_size < 1:
            raise ValueError(f"lru_size must be an int >= 1, not {lru_size!r}")
        if isinstance(merge_gap, bool) or not isinstance(merge_gap, int) or merge_gap < 0:
            raise ValueError(f"merge_gap must be an int >= 0, not {merge_gap!r}")
        if max_sample_bytes is not None and (
            isinstance(max_sample_bytes, bool)
            or not isinstance(max_sample_bytes, int)
            or max_sample_bytes < 1
        ):
            raise ValueError(
                f"max_sample_bytes must be an int >= 1 or None, not {max_sample_bytes!r}"
            )
        stream_over = check_stream_over(stream_over)
        if cache_size is not None and cache_size < 0:
            raise ValueError(f"cache_size must be >= 0 or None, not {cache_size!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        if not 0.0 <= promote_share <= 1.0:
            raise ValueError(f"promote_share must be between 0 and 1, not {promote_share!r}")
        if access == "shard" and cache_dir is None:
            raise ValueError("access='shard' needs cache_dir")
        if localname is not None:
            warnings.warn(
                "localname is not supported: the shard cache names its files itself "
                "(collision-free); pass cache_dir, or read shards from copies of yours with "
                "url_map={'https://host/dir/': '/local/dir/'}",
                stacklevel=2,
            )
        if (access == "range" or cache_dir is None) and (cache_size is not None or keep):
            warnings.warn(
                f"cache_size and keep apply to the shard cache (cache_dir with access 'shard' "
                f"or 'auto'); with access={access!r} and cache_dir={cache_dir!r} no shard is "
                f"downloaded, so they have no effect",
                stacklevel=2,
            )
        options = dict(options or {})
        unknown = sorted(set(options) - {"name"})
        if unknown:
            warnings.warn(f"options {unknown} are not supported and have no effect", stacklevel=2)
        self.transformations: list[Transform] = interpret_transformations(
            transformations, allow_pickle=allow_pickle
        )
        if allow_pickle and not any(isinstance(t, Decoder) for t in self.transformations):
            warnings.warn(
                "allow_pickle=True has no effect: no built-in decoder among the transformations",
                stacklevel=2,
            )
        self.merge_gap = merge_gap
        self.stream_over = stream_over
        self.allow_pickle = bool(allow_pickle)
        if hasattr(shards, "read") and not isinstance(shards, (str, os.PathLike)):
            shards = StreamContent(shards.read())  # now, as the reference: f may then close
        shards, base = anchored(shards), anchored(base)  # an os.chdir later changes nothing
        self._local = LocalCache(cache_dir, cache_size=cache_size, keep=keep, offline=offline)
        self._catalog = Catalog(
            shards,
            self._local,
            dataset_name=options.get("name", dataset_name),
            base=base,
            url_map=check_url_map(url_map),
            allow_local_shards=allow_local_shards,
            # the options are for the URLs given here, not for other servers an index names
            store=Store(
                storage_options, retry, named=named_by(shards, base, url_map), limits=read_limits
            ),
            duplicates=duplicates,
            verify=verify,
            max_sample_bytes=max_sample_bytes,
            # read here, once: workers get the parsed entries, never the file
            exclude=parse_exclude(exclude, strict=exclude_strict),
        )
        self._pool = ReaderPool(
            self._catalog, lru_size=lru_size, access=access, promote_share=promote_share
        )
        self._made = forks.stamp()  # the process this copy reads in (see _check_process)

    _batch: dict[int, Any] | None = None  # a batch read for a subclass's __getitem__

    # The settings of the dataset's parts, as attributes of the dataset (reference API).
    cache_dir = _Setting("_local")
    cache_size = _Setting("_local")
    keep = _Setting("_local")
    offline = _Setting("_local")
    base = _Setting("_catalog")
    url_map = _Setting("_catalog")
    allow_local_shards = _Setting("_catalog")
    storage_options = _Setting("_catalog")
    retry = _Setting("_catalog")
    duplicates = _Setting("_catalog")
    verify = _Setting("_catalog")
    lru_size = _Setting("_pool")
    access = _Setting("_pool")
    promote_share = _Setting("_pool")

    @property
    def dataset_name(self) -> str | None:
        """The name given, else the index's ``name`` (as the reference's), else ``None``."""
        return self._catalog.dataset_name or self.name or None

    @dataset_name.setter
    def dataset_name(self, value: str | None) -> None:
        self._catalog.dataset_name = value

    # -- per-process state --------------------------------------------------------------------

    def _check_process(self) -> None:
        if self._made == forks.generation:
            return
        # forked: the parent's readers are not ours. One thread resets (a user's threads may
        # read beside the DataLoader's)
        with forks.lock:
            if self._made != forks.generation:
                self._catalog.reset_process()
                self._pool.reset_process()
                self._made = forks.stamp()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_made"]  # the parts drop their per-process state themselves
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._made = forks.stamp()

    # -- samples ------------------------------------------------------------------------------

    def _raw(self, index: Any) -> dict[str, Any]:
        if self._made != forks.generation:
            self._check_process()
        return self._pool.read(*self._catalog.locate(index))

    def __getitem__(self, index: Any) -> T_co:
        """The sample at ``index`` (negative counts from the end), transformed.

        Raises:
            IndexError: ``index`` is out of range.
            TypeError: ``index`` is not an integer.
        """
        if self._made != forks.generation:
            self._check_process()
        i, shard, j = self._catalog.locate(index)
        sample: Any = None
        batch = self._batch  # a subclass's __getitem__ under __getitems__: read already
        if batch is not None:
            sample = batch.pop(i, None)
        elif self.stream_over is not None:
            sample = streamed_sample(self._catalog, self._pool, i, shard, j, self.stream_over)
        if sample is None:
            fast = self._pool.fast.get(shard)
            sample = fast.read(i, j) if fast is not None else self._raw(i)  # same depth
        for t in self.transformations:
            sample = t(sample)
        return sample  # type: ignore[no-any-return]

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        """Many samples at once (torch's DataLoader calls this for a batch).

        Samples of one shard whose spans are adjacent or within ``merge_gap`` bytes are read
        with one request; all requests are issued concurrently. A subclass that overrides
        ``__getitem__`` makes each sample with it, from the batch read so (its calls of
        ``super().__getitem__(i)`` take sample ``i`` from it, once).
        """
        self._check_process()
        located = [self._catalog.locate(x) for x in indices]
        own = type(self).__getitem__ is not ShardListDataset.__getitem__
        if self.stream_over is not None:
            return [self[i] for i in indices] if own else self._streamed_batch(located)
        raws = self._pool.read_batch(located, self.merge_gap, plan_of(indices))
        if own:  # the batch's reads as above, the samples from the subclass's __getitem__
            self._batch = {i: raw for (i, _, _), raw in zip(located, raws, strict=True)}
            try:
                return [self[i] for i in indices]
            finally:
                self._batch = None
        out = []
        for sample in raws:
            for t in self.transformations:
                sample = t(sample)
            out.append(sample)
        return out

    def _streamed_batch(self, located: list[tuple[int, int, int]]) -> list[Any]:
        """A batch with ``stream_over``: samples with large members as handles, the rest batched.

        No plan goes to the lookahead: it would read large members' bytes ahead.
        """
        raws: list[Any] = [
            streamed_sample(self._catalog, self._pool, i, shard, j, self.stream_over or 0)
            for i, shard, j in located
        ]
        rest = [k for k, raw in enumerate(raws) if raw is None]
        if rest:
            got = self._pool.read_batch([located[k] for k in rest], self.merge_gap)
            for k, sample in zip(rest, got, strict=True):
                raws[k] = sample
        out = []
        for sample in raws:
            for t in self.transformations:
                sample = t(sample)
            out.append(sample)
        return out

    def open(self, index: Any, field: str, **options: Any) -> MemberFile | io.BytesIO:
        """One member of sample ``index`` as a read-only, seekable binary file.

        Reads by ``os.pread`` for local shards and by range requests for remote ones (with a
        bounded read-ahead), checked like every read: the shard's version is pinned and the
        member's tar header checked on the first read. The file pickles (to a DataLoader
        worker or back) and reopens where it is used. See ``docs/large-members.md``. A member
        of a compressed shard is decoded whole into an ``io.BytesIO`` (``docs/compressed.md``).

        Args:
            index: The sample's global index (negative counts from the end).
            field: The member's field, with its leading dot (``".mp4"``).
            **options: ``readahead`` and ``max_readahead`` of
                :class:`~wids.dataset.memberfile.MemberFile`.

        Raises:
            IndexError: ``index`` is out of range.
            KeyError: The sample has no such field.

        Example:
            >>> with ds.open(0, ".mp4") as f:  # doctest: +SKIP
            ...     container = av.open(f)
        """
        self._check_process()
        _, shard, j = self._catalog.locate(index)
        return member_file(self._catalog, self._pool, shard, j, field, **options)

    # -- reference API ------------------------------------------------------------------------

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The shards as the reference lists them: dicts with ``url``, ``nsamples`` ..."""
        return self._catalog.load().shard_dicts()

    @property
    def lengths(self) -> list[int]:
        """Samples per shard (kept samples, with ``exclude``)."""
        return self._catalog.counts().lengths.tolist()  # type: ignore[no-any-return]

    @property
    def cum_lengths(self) -> np.ndarray:
        """Cumulative sample counts (``numpy.cumsum(lengths)``)."""
        return self._catalog.counts().cum.copy()

    @property
    def total_length(self) -> int:
        """Total number of samples."""
        return self._catalog.counts().total

    @property
    def name(self) -> str:
        """The dataset's name (``""`` if none)."""
        return self._catalog.load().name

    @property
    def components(self) -> list[DatasetComponent]:
        """The (sub-)datasets as global sample ranges, for mixing samplers."""
        return list(self._catalog.counts().components)

    # -- metadata columns (docs/columns.md) -------------------------------------------------

    def column(self, name: str, *, missing: Any = None) -> np.ndarray:
        """One metadata column of the index, aligned with the dataset: ``out[i]`` is ``ds[i]``'s.

        Columns are collected when the index is made (``wids index create --column``,
        ``ShardWriter(columns=...)``); this reads one from every shard's entry in the index
        (nothing is read before the first call; each call reads it again: keep the array).

        Args:
            name: The column's name.
            missing: What a missing value becomes. ``None`` (the default): NaN in ``float64``
                columns; an ``int64`` or ``bool`` column that has missing values comes back
                as ``float64`` with NaN there (one without keeps its type); ``None`` in a
                ``str`` column. Any other value: that value, in the column's own type.

        Returns:
            An array of ``len(self)`` values: ``int64``, ``float64``, ``bool`` or ``object``
            (strings).

        Raises:
            ColumnError: The index has no such column (or the dataset no index), or its
                shards hold values of types that do not go together.
            IndexFormatError: A shard's stored column is malformed.

        Example:
            >>> ds = ShardListDataset("train.json")  # doctest: +SKIP
            >>> aspect = ds.column("width") / ds.column("height")  # doctest: +SKIP
        """
        from .columns import dataset_column

        return dataset_column(self._catalog.load(), self._excluded(), name, missing)

    def where(self, expr: str) -> np.ndarray:
        """The exclusion that keeps the samples where ``expr`` holds, for ``exclude=``.

        ``expr`` is a filter over the index's columns (``"width >= 256 and height >= 256"``;
        the language is in ``docs/columns.md``), parsed by a whitelist, never evaluated by
        Python. The result is the sorted global sample numbers that this dataset leaves out
        (its own exclusions included), so ``ShardListDataset(index, exclude=ds.where(expr))``
        is this dataset filtered by ``expr``.

        Raises:
            ColumnError: The expression is malformed, or names a column the index lacks.

        Example:
            >>> keep = ds.where("width >= 256")  # doctest: +SKIP
            >>> big = ShardListDataset("train.json", exclude=keep)  # doctest: +SKIP
        """
        from .columns import where_excluded

        return where_excluded(self._catalog.load(), self._excluded(), expr)

    def _excluded(self) -> np.ndarray | None:
        counts = self._catalog.counts()
        return getattr(counts, "excluded", None)

    def __len__(self) -> int:
        return self.total_length

    def __add__(self, other: Any) -> ShardConcatDataset[Any]:
        """``ds1 + ds2``: a torch ``ConcatDataset`` the samplers still read shard by shard.

        See :class:`~wids.dataset.concat.ShardConcatDataset` (``lengths``, ``components``).

        Raises:
            ImportError: torch is not installed (the message names the ``torch`` extra).
        """
        try:
            from .concat import ShardConcatDataset
        except ImportError as e:
            from ..extras import missing

            raise missing("torch", "ds1 + ds2", e) from None
        return ShardConcatDataset([self, other])

    def add_transform(self, transform: Transform) -> ShardListDataset:
        """Append a transformation (applied after the others). Returns ``self``."""
        if not callable(transform):
            raise TypeError(f"transform must be callable, not {transform!r}")
        self.transformations.append(transform)
        return self

    def get_shard(self, index: Any) -> tuple[ShardView, int, dict[str, Any]]:
        """As the reference: ``(shard, index in shard, shard dict)`` for a global index.

        The shard object supports ``len()`` and ``shard[j]`` (a raw sample dict).
        """
        self._check_process()
        _, shard, local = self._catalog.locate(index)
        self._pool.reader(shard)
        view = ShardView(self._catalog, self._raw, shard)
        return view, local, self._catalog.load().shard_dict(shard)

    def _reads_plans(self) -> bool:
        """Whether indices that carry their plan (:mod:`wids.plan`) speed this dataset up.

        Samplers ask when an iteration starts: a plan is worth its cost for remote shards
        (read ahead, fetched whole early); local ones are read in place.
        """
        loaded = self._catalog.load()
        return not is_local(loaded.infos[0].url) or not is_local(loaded.infos[-1].url)

    def _plan_begins(self, plan: Plan) -> None:
        """An iteration of a wids sampler over this dataset begins in this process with ``plan``.

        The sampler says so at the first index asked of it: under a DataLoader, in the main
        process right after the workers were started. With a cache (``access="auto"`` or
        ``"shard"``) the shards the plan's window reads most of are fetched into it in the
        background (``ReaderPool.warm``): the downloads overlap the workers' start (their
        torch import under forkserver and spawn), and the workers read those shards from the
        cache. Which samples a batch holds never depends on it.
        """
        self._check_process()
        self._pool.warm(plan)

    def _plan_ends(self, plan: Plan) -> None:
        """That iteration ended (or was dropped) in this process: its warm-up, if any, stops."""
        self._check_process()
        self._pool.cool(plan)

    def get_stats(self) -> tuple[int, int]:
        """``(accesses, misses)`` of shard look-ups in this process, as the reference."""
        counts = self._pool.totals()
        return counts["accesses"], counts["misses"]

    @property
    def stats(self) -> DatasetStats:
        """A snapshot of this process's counters."""
        return self._pool.stats()

    def close(self) -> None:
        """Close open readers and stop every background thread the dataset started.

        Promotions (``access="auto"``) and the shard cache's fetches stop (one under way is
        waited for). The dataset stays usable and reopens what it needs.
        """
        self._check_process()
        self._pool.close()

    def __repr__(self) -> str:
        src = self._catalog.src
        what = display_url(src) if isinstance(src, (str, os.PathLike)) else "<list>"
        n = "?" if not self._catalog.loaded else str(len(self))
        return f"ShardListDataset({what!r}, samples={n}, access={self.access!r})"
