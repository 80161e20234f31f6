"""Writing a dataset: samples into numbered tar shards, and their index, in one pass.

:class:`ShardWriter` has the call shape of webdataset's (``pattern``, ``maxcount``,
``maxsize``, ``post``, ``start_shard``; ``write(sample)``; a context manager), so writing code
ports by changing the import. On top of that:

- **The index as a by-product.** Every member's offset and size is recorded as it is written;
  each published shard goes into the index (``index=``: ``*.json`` or ``*.sqlite``, default
  beside the shards, named after the pattern) as :mod:`wids.writer_index` describes. The index
  equals what ``wids index create`` writes for the same shards.
- **Whole shards only.** A local shard is written under a hidden temporary name and renamed
  into place when complete; a remote one (``s3://``, ``gs://``, any writable fsspec URL) is
  written to a local temporary file and uploaded whole (one PUT, or a completed multipart
  upload), at most ``max_uploads`` at a time while the next shards are being written. A killed
  writer leaves whole shards, the index of them (see :mod:`wids.writer_index` for SQLite), and
  hidden ``.*.tmp`` files that the next writer of the same directory removes.
- **Resume.** ``resume=True`` keeps the consecutive whole shards from ``start_shard`` on
  (taking their member tables from the index, or scanning the ones it lacks) and continues with
  the next number; :attr:`ShardWriter.total` then says how many samples to skip.
- **No silent overwrite.** Without ``resume`` or ``overwrite``, a shard that already exists is
  :class:`~wids.errors.OutputExistsError`, checked before the shard is written. An existing
  index is extended (``start_shard``) or refused, never replaced (:mod:`wids.writer_keep`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .encode import Encoder
from .errors import IndexMismatchError, OutputExistsError, ShardNotFoundError, writing
from .storage import Store
from .tarwrite import DEFAULT_MTIME, prepare_sample, tar_size
from .writer import TarWriter

__all__ = ["ShardWriter", "default_index"]

logger = logging.getLogger(__name__)

_FORMAT = re.compile(r"%[-#0 +]*\d*[diouxX]")


def _file_names(pattern: str, index: str | None) -> re.Pattern[str]:
    """The names a writer of ``pattern`` (and ``index``) publishes in the first shard's folder.

    Its shards' names (the number field as any number: a killed writer may have reached any
    shard) and its index's, where the index goes in that folder too.
    """
    name = os.path.basename(pattern)
    field = _FORMAT.search(name)
    shards = re.escape(os.path.basename(pattern % 0))
    if field is not None:
        head, tail = name[: field.start()], name[field.end() :]
        shards = re.escape(head % ()) + "[-+ 0-9a-fA-F]+" + re.escape(tail % ())
    names = [shards]
    if index is not None and os.path.dirname(os.path.abspath(index)) == os.path.dirname(
        os.path.abspath(pattern % 0)
    ):
        names.append(re.escape(os.path.basename(index)))
    return re.compile("|".join(f"(?:{n})" for n in names))


def default_index(pattern: str) -> str:
    """The index a pattern's shards get by default: ``out/train-%06d.tar`` -> ``out/train.json``.

    Example:
        >>> default_index("s3://b/data/train-%06d.tar")
        's3://b/data/train.json'
    """
    head, sep, tail = pattern.rpartition("/")
    stem = _FORMAT.sub("", tail)
    for suffix in (".tar.zst", ".tar"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    stem = stem.strip("-_. ") or "index"
    return f"{head}{sep}{stem}.json"


class ShardWriter:
    """Write samples into shards ``pattern % n`` and keep their index.

    Args:
        pattern: Shard names with one ``%d``-style field: ``"out/train-%06d.tar"``, or a
            writable fsspec URL, ``"s3://bucket/train-%06d.tar"``.
        maxcount: Samples per shard, at most.
        maxsize: Bytes per shard, at most (a sample larger than this gets a shard of its own).
        post: Called with each shard's name once it is published (and in the index).
        start_shard: Number of the first shard.
        verbose: Log each new shard at INFO (else DEBUG).
        index: The index file (``*.json`` or ``*.sqlite``; a path or URL), ``True`` for
            :func:`default_index` of the pattern, ``None``/``False`` for none.
        name: Dataset name stored in the index.
        resume: Keep the whole shards already there and continue after them.
        overwrite: Replace shards that already exist (without ``resume``).
        storage_options: fsspec options for remote shards and index.
        max_uploads: Remote shards uploading at once; writing waits when this many are pending.
        encoder: As for :class:`~wids.TarWriter`: ``True``, ``False`` or a callable.
        mtime: Modification time of every member (default: a constant; deterministic shards).
        mode: Permission bits of every member.
        user: User name in the tar headers.
        group: Group name in the tar headers.
        md5: Record each local shard's MD5 in the index (``md5sum``), computed as it is
            written, so a copy of the dataset with new timestamps (``cp -r``) reads without
            a rebuild and a same-size rewrite is still refused. It costs CPU (0.3-0.5 s per
            100 MB here, ``tools/bench_copies.py``); ``False`` skips it.
        columns: Sample metadata columns to keep in the index, as ``wids index create
            --column`` collects them (``"json:width"``, ``"size:.jpg"``, ``"has:.txt"``,
            ``"NAME=json:a.b"``; ``docs/columns.md``), taken from each sample's encoded
            members as it is written (shards kept by ``resume``/``start_shard`` are read).
        compress: ``"zstd"`` writes seekable ``.tar.zst`` shards (name the pattern so): one
            zstd frame per ``samples_per_frame`` samples and a seek table at the end, read
            by range like plain tars and by every zstd tool as ordinary ``.tar.zst``.
            ``maxsize`` counts the tar's (uncompressed) bytes.
        samples_per_frame: Samples per zstd frame (``compress="zstd"``).
        level: zstd compression level (``compress="zstd"``).

    Raises:
        ValueError: A pattern without exactly one number field, or bad limits.
        ColumnError: A malformed column spec, or ``columns`` without an index.

    Example:
        >>> with ShardWriter("out/train-%06d.tar", maxcount=1000) as sink:  # doctest: +SKIP
        ...     for i, (image, label) in enumerate(data):
        ...         sink.write({"__key__": f"{i:08d}", "jpg": image, "cls": label})
    """

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100000,
        maxsize: float = 3e9,
        post: Callable[[str], Any] | None = None,
        start_shard: int = 0,
        verbose: int = 0,
        *,
        index: str | bool | None = True,
        name: str | None = None,
        resume: bool = False,
        overwrite: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        max_uploads: int = 4,
        encoder: bool | Callable[[Mapping[str, Any]], Mapping[str, Any]] = True,
        mtime: int = DEFAULT_MTIME,
        mode: int = 0o444,
        user: str = "",
        group: str = "",
        md5: bool = True,
        columns: Sequence[str] | None = None,
        compress: str | None = None,
        samples_per_frame: int = 1,
        level: int = 3,
    ) -> None:
        if len(_FORMAT.findall(pattern)) != 1 or pattern % 0 == pattern % 1:
            raise ValueError(f"pattern needs exactly one number field like %06d: {pattern!r}")
        if maxcount < 1 or maxsize <= 0 or start_shard < 0 or max_uploads < 1:
            raise ValueError("maxcount, maxsize and max_uploads must be positive, start_shard >= 0")
        self.pattern = pattern
        self.maxcount = int(maxcount)
        self.maxsize = maxsize
        self.post = post
        self.start_shard = self.shard = int(start_shard)
        self.verbose = verbose
        self.index: str | None = default_index(pattern) if index is True else (index or None)
        self.name = name
        self.resume = bool(resume)
        self.overwrite = bool(overwrite)
        self.store = Store.of(storage_options)
        self.max_uploads = int(max_uploads)
        self.encoder = Encoder() if encoder is True else (encoder or None)
        self.md5 = bool(md5)
        self._columns = _collector(columns, self.index)
        self._extras: dict[str, Any] = {}  # a finished shard's columns, until it is indexed
        self._tar_options: dict[str, Any] = {
            "mtime": mtime,
            "mode": mode,
            "user": user,
            "group": group,
        }
        if compress:  # checked by the TarWriter made just below
            self._tar_options.update(
                compress=compress, samples_per_frame=samples_per_frame, level=level
            )
        TarWriter(_NullSink(), encoder=False, **self._tar_options)  # type: ignore[arg-type]
        self.total = 0
        self.count = 0
        self.size = 0
        self.fname: str | None = None
        self.written: list[str] = []
        self._tar: TarWriter | None = None
        self._keeper: Any = None
        self._stack = contextlib.ExitStack()
        self._pool: cf.ThreadPoolExecutor | None = None
        self._syncer: cf.ThreadPoolExecutor | None = None
        self._uploads: deque[tuple[str, TarWriter, cf.Future[None]]] = deque()
        self._state = "new"

    def _names(self) -> re.Pattern[str]:
        """The file names this writer publishes beside its shards (:func:`_file_names`)."""
        from .storage import is_remote, local_path

        index = None if self.index is None or is_remote(self.index) else local_path(self.index)
        return _file_names(local_path(self.pattern), index)

    def __repr__(self) -> str:
        return f"ShardWriter({self.pattern!r}, shard={self.shard}, total={self.total})"

    # -- opening ------------------------------------------------------------------------------

    def open(self) -> ShardWriter:
        """Check the destination, take the index's lock, and with ``resume`` find whole shards.

        Called by the first :meth:`write` or by entering the ``with`` block.

        Raises:
            OutputExistsError: The index path is a file that is not an index.
            DestinationError: A read-only destination or an index name that selects no format.
            LockTimeoutError: Another writer holds the (local) index.
        """
        if self._state != "new":
            if self._state == "closed":
                raise ValueError(f"{self!r} is closed")
            return self
        from .atomic import remove_stale_temps
        from .index import check_output
        from .lock import writer_lock
        from .storage import check_writable, is_remote, local_path

        check_writable(self.pattern)
        if self.index is not None:
            check_output(self.index, [], self.store)
            if not is_remote(self.index):
                with writing(self._where()):
                    self._stack.enter_context(writer_lock(local_path(self.index), timeout=0))
        try:
            if not is_remote(self.pattern):
                directory = os.path.dirname(os.path.abspath(local_path(self.pattern % 0)))
                if os.path.isdir(directory):  # left by a killed writer; only ours
                    remove_stale_temps(directory, min_age=0.0, stems=self._names())
            if is_remote(self.pattern):
                self._pool = cf.ThreadPoolExecutor(self.max_uploads, "wids-upload")
            if self.index is not None:
                from .writer_index import IndexKeeper

                self._keeper = IndexKeeper(self.index, self.store, self.name)
            if self.resume or (self.index is not None and not self.overwrite):
                if self._columns is None and self.index is not None:
                    from .index.colcollect import warn_if_dropped

                    warn_if_dropped(self.index, "this writer collects none (columns=)", 3)
                with writing(self._where()):
                    self._keep()
        except BaseException:
            self._stack.close()
            raise
        self._state = "open"
        return self

    def _keep(self) -> None:
        from .writer_keep import whole_shards

        kept = 0
        shards = whole_shards(
            self.pattern,
            self.shard,
            self.index,
            self.store,
            resume=self.resume,
            overwrite=self.overwrite,
        )
        for url, stat, members in shards:
            if self._keeper is not None:
                extra = self._kept_columns(url, stat, members)
                self._keeper.add(url, stat, members, checkpoint=False, extra=extra)
            if url == self.pattern % self.shard:  # resumed (else listed below start_shard)
                self.written.append(url)
                self.total += len(members)
                self.shard += 1
            kept += 1
        if kept and self._keeper is not None:
            self._keeper.checkpoint(force=True)
        logger.info("%s: %d shards kept, next %d", self.pattern, kept, self.shard)

    # -- writing ------------------------------------------------------------------------------

    def __enter__(self) -> ShardWriter:
        return self.open()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, sample: Mapping[str, Any]) -> int:
        """Encode and write one sample, starting a new shard when the current one is full.

        Returns:
            The bytes of the sample's fields.

        Raises:
            SampleLayoutError: A bad or repeated key (in this shard), or a bad field name.
            EncodeError: A field's value does not fit its extension.
            OutputExistsError: The next shard exists (without ``resume``/``overwrite``).
        """
        if self._state != "open":
            self.open()
        prepared = prepare_sample(sample, self.encoder)
        nbytes = tar_size(prepared)
        if (
            self._tar is None
            or self.count >= self.maxcount
            or (self.count and self.size + nbytes > self.maxsize - 1024)
        ):
            with writing(self._where()):  # the index of the shard before (the shard is typed)
                self._next_shard()
        if self._tar is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: no shard open")
        row = (
            None if self._columns is None else self._columns.row(*_fields(prepared), self._shown())
        )
        payload = self._tar.emit(prepared)
        if row is not None and self._columns is not None:
            self._columns.append(prepared[0], row)
        self.count += 1
        self.total += 1
        self.size = self._tar.offset
        return payload

    def _next_shard(self) -> None:
        self._finish_shard()
        url = self.pattern % self.shard
        self._check_new(url)
        log = logger.info if self.verbose else logger.debug
        log("writing %s (%d samples so far)", url, self.total)
        self._tar = TarWriter(
            url,
            encoder=False,
            storage_options=self.store,
            index=self._keeper is not None,
            md5=self.md5 and self._keeper is not None,  # recorded: copies tell from rewrites
            **self._tar_options,
        )
        self.fname = url
        self.shard += 1
        self.count = 0
        self.size = 0

    def _shown(self) -> str:
        return _redact(self.fname or "")

    def _kept_columns(self, url: str, stat: Any, members: Any) -> dict[str, Any] | None:
        """The columns of a shard already there (read from its bytes), or ``None``."""
        if self._columns is None:
            return None
        from .index.colcollect import shard_columns
        from .index.columns import EXTRA_KEY, encode_columns

        src = self.store.source(url, size=stat.size, etag=getattr(stat, "etag", None))
        try:
            cols = shard_columns(self._columns.specs, members, src, _redact(url))
        finally:
            src.close()
        return {EXTRA_KEY: encode_columns(cols, len(members))}

    def _check_new(self, url: str) -> None:
        if self.overwrite or self.resume:  # resume: what is left after the whole shards
            return
        try:
            self.store.source(url).info()
        except ShardNotFoundError:
            return
        raise OutputExistsError(
            "shard exists; pass resume=True to continue after the whole shards there, or "
            "overwrite=True to replace them",
            shard=_redact(url),
        )

    def _finish_shard(self) -> None:
        tar, self._tar = self._tar, None
        if tar is None:
            return
        url = self.fname or ""
        if self._columns is not None:
            self._extras[url] = self._columns.take(_redact(url))
        if self._pool is None:
            self._publish_local(url, tar)
            return
        tar.finish()  # the end blocks are written here; the upload runs in the pool
        while len(self._uploads) >= self.max_uploads:
            self._collect(wait=True)
        self._uploads.append((url, tar, self._pool.submit(tar.close)))
        self._collect(wait=False)

    def _publish_local(self, url: str, tar: TarWriter) -> None:
        """Sync the shard to disk in a thread while its member table is written, then rename it."""
        if self._keeper is None:
            tar.close()
        else:
            if self._syncer is None:
                self._syncer = cf.ThreadPoolExecutor(1, "wids-fsync")
            tar.finish()
            stat = tar.temp_stat()  # what the file will have once renamed into place
            synced = self._syncer.submit(tar.sync)
            extra = self._extras.pop(url, None)
            self._keeper.add(url, stat, tar.members(), checkpoint=False, extra=extra)  # sidecar
            synced.result()
            tar.close()
            if (tar.stat.size, tar.stat.mtime) != (stat.size, stat.mtime):
                raise IndexMismatchError(
                    f"changed while it was published: {tar.stat} after, {stat} before",
                    shard=_redact(url),
                )
            self._keeper.checkpoint(force=False)
        self.written.append(url)
        if callable(self.post):
            self.post(url)

    def _collect(self, *, wait: bool) -> None:
        """Index finished uploads in shard order (waiting for the oldest when ``wait``)."""
        while self._uploads and (wait or self._uploads[0][2].done()):
            url, tar, fut = self._uploads.popleft()
            fut.result()
            self._published(url, tar)
            wait = False

    def _published(self, url: str, tar: TarWriter) -> None:
        self.written.append(url)
        if self._keeper is not None:
            self._keeper.add(url, tar.stat, tar.members(), extra=self._extras.pop(url, None))
        if callable(self.post):
            self.post(url)

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Publish the last shard, wait for uploads, and write the final index."""
        if self._state == "closed":
            return
        if self._state == "new" and self.index is None:
            self._state = "closed"
            return
        try:
            self.open()
            with writing(self._where()):
                self._finish_shard()
                while self._uploads:
                    self._collect(wait=True)
                if self._keeper is not None:
                    self._keeper.close()
        except BaseException:
            self.abort()
            raise
        self._shutdown()

    def abort(self) -> None:
        """Stop without publishing the shard being written; finished uploads are indexed.

        With no shard finished (a first ``write()`` that raised), no index is written.

        Uploads still running are waited for; the index then holds the shards uploaded in
        order up to the first that failed (a whole shard after that is left for ``resume``).
        """
        if self._state == "closed":
            return
        try:
            if self._tar is not None:
                self._tar.abort()
                self._tar = None
            pending, failed = list(self._uploads), False
            self._uploads.clear()
            for url, tar, fut in pending:
                try:
                    fut.result()
                except Exception as e:
                    logger.warning("upload of %s failed: %s", _redact(url), e)
                    failed = True
                    tar.abort()
                    continue
                if not failed:
                    self._published(url, tar)
            if self._keeper is not None and self._keeper.shards:
                self._keeper.close()
            elif self._keeper is not None:  # no shard: no index (an empty one looks finished)
                self._keeper.abort()
        finally:
            self._shutdown()

    def finish(self) -> None:
        """Publish the current shard now (webdataset's name); :meth:`close` ends the writer."""
        if self._state == "open":
            with writing(self._where()):
                self._finish_shard()

    def _where(self) -> str:
        return _redact(self.index or self.pattern)

    def _shutdown(self) -> None:
        self._state = "closed"
        for pool in (self._pool, self._syncer):
            if pool is not None:
                pool.shutdown(wait=True)
        self._stack.close()


class _NullSink:
    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def _collector(columns: Sequence[str] | None, index: str | None) -> Any:
    """The column collector of ``columns=`` (``None`` without columns)."""
    if not columns:
        return None
    from .errors import ColumnError
    from .index.colcollect import RowCollector

    if index is None:
        raise ColumnError("columns are kept in the index: give index= (not None/False)")
    return RowCollector(columns)


def _fields(prepared: Any) -> tuple[str, dict[str, Any]]:
    """``(key, {field: bytes})`` of a prepared sample."""
    return prepared[0], {field: data for field, _, data in prepared[1]}


def _redact(url: str) -> str:
    from .storage import redact_url

    return redact_url(url)
