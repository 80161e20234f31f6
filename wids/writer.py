"""Writing one WebDataset tar shard, recording every member's offset and size as it goes.

:class:`TarWriter` has the call shape of webdataset's: ``write(sample)`` with ``"__key__"`` and
fields by extension (``"jpg"`` or ``".jpg"``), encoded by :class:`~wids.encode.Encoder`. The tar
is deterministic and portable:

- ustar headers (uid/gid 0, empty user and group names, a fixed mode, the caller's mtime,
  default :data:`DEFAULT_MTIME`), so the same samples give byte-identical shards;
- a pax ``x`` record before a member only when ustar cannot hold it: a name over 100 bytes or
  not ASCII (``path``), a size of 8 GiB or more (``size``);
- fields of a sample written in sorted order, as webdataset does; the archive ends with two
  zero blocks.

Member names are ``key + "." + field``, and keys and fields are checked so that every reader
(:mod:`wids.samples`, webdataset's grouping) splits them back the same way: a key's last path
part has no dot, a field has no slash, no ``.``/``..`` path parts, no absolute names. A key
used twice in one tar is an error.

While writing, the member table (:class:`~wids.index.ShardMembers`) is collected; it is what
``wids index create`` would scan from the finished file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import IO, Any

import numpy as np

from .encode import Encoder
from .errors import SampleLayoutError, write_error, writing
from .index import ShardMembers
from .storage import Store
from .tarwrite import (
    BLOCK,
    DEFAULT_MTIME,
    MAX_OCTAL,
    ZEROS,
    HeaderMaker,
    Prepared,
    prepare_sample,
)

__all__ = ["TarWriter"]


class TarWriter:
    """Write samples into one tar file, and collect its member table while doing so.

    Args:
        fileobj: A writable binary file object (written from its current position, not
            closed), or a path or fsspec URL: a path is written under a temporary name beside
            it and renamed into place on :meth:`close`; a URL is written to a local temporary
            file and uploaded on :meth:`close` (one PUT). Either way the file appears whole.
        encoder: ``True`` for :class:`~wids.encode.Encoder()`, ``False`` to take fields that
            are ``bytes`` (or ``str``, written as UTF-8) only, or a callable ``sample ->
            sample`` (an :class:`~wids.encode.Encoder` with options, for instance).
        mtime: Modification time of every member (an int, seconds since the epoch).
        mode: Permission bits of every member.
        user: User name in the headers (uid is 0).
        group: Group name in the headers (gid is 0).
        compress: ``None``/``False`` for a plain tar, or ``"zstd"`` for a seekable
            ``.tar.zst``: a zstd frame ends after every ``samples_per_frame`` samples and a
            seek table follows the last one (:mod:`wids.compress.zstdwrite`), so a sample is
            one range read of its compressed bytes while GNU tar, ``zstd -d`` and webdataset
            read the file as an ordinary ``.tar.zst``. Offsets in :meth:`members` are the
            tar's (uncompressed); :meth:`seek_table` says where the frames are.
        samples_per_frame: Samples per zstd frame (``compress="zstd"``): 1 reads the fewest
            bytes per random sample, more compress better.
        level: zstd compression level (``compress="zstd"``).
        storage_options: fsspec options for a URL destination.
        index: Record members' offsets and sizes (:meth:`members`); off only to measure its cost.
        md5: Compute the MD5 of what is written to a local path, which :attr:`stat` then
            carries into the index (``md5sum``, as ``wids index create`` records it): a copy
            of the shard with new timestamps is then told from a rewrite. (A URL
            destination's stat has the store's etag instead, and GCS's MD5.)

    Raises:
        ValueError: ``compress`` is not ``"zstd"``, or ``mtime``/``mode``/``user``/``group``
            do not fit a ustar header.

    Example:
        >>> with TarWriter("out/train-000000.tar") as w:  # doctest: +SKIP
        ...     w.write({"__key__": "000000", "jpg": image, "cls": 3})
    """

    def __init__(
        self,
        fileobj: str | os.PathLike[str] | IO[bytes],
        *,
        encoder: bool | Callable[[Mapping[str, Any]], Mapping[str, Any]] = True,
        mtime: int = DEFAULT_MTIME,
        mode: int = 0o444,
        user: str = "",
        group: str = "",
        compress: str | bool | None = None,
        samples_per_frame: int = 1,
        level: int = 3,
        storage_options: Mapping[str, Any] | Store | None = None,
        index: bool = True,
        md5: bool = True,
    ) -> None:
        if compress and compress != "zstd":
            raise ValueError(
                f"compress must be None or 'zstd' (a seekable .tar.zst), not {compress!r}"
            )
        if not (isinstance(samples_per_frame, int) and samples_per_frame >= 1):
            raise ValueError(f"samples_per_frame must be an int >= 1, not {samples_per_frame!r}")
        if not (isinstance(mtime, int) and 0 <= mtime <= MAX_OCTAL):
            raise ValueError(f"mtime must be an int in [0, 8**11), not {mtime!r}")
        if not (isinstance(mode, int) and 0 <= mode <= 0o7777777):
            raise ValueError(f"mode must be an int in [0, 8**7), not {mode!r}")
        self._headers = HeaderMaker(mode, mtime, user, group)
        self.encoder: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None
        self.encoder = Encoder() if encoder is True else (encoder or None)
        self.store = Store.of(storage_options)
        self.index = bool(index)
        self.url: str | None = None
        self.stat: Any = None
        self.offset = 0
        self._keys: dict[str, None] = {}  # in order; a dict is the fastest ordered set
        self._field_ids: dict[str, int] = {}
        self._counts: list[int] = []  # members per sample
        self._mfield: list[int] = []
        self._moffset: list[int] = []
        self._msize: list[int] = []
        self._tmp: Any = None
        self._tmpdir: str | None = None
        self._md5: Any = None
        if isinstance(fileobj, (str, os.PathLike)):
            self.url = os.fspath(fileobj)
            with writing(self._where()):
                self._stream: Any = self._open_destination(self.url)
            self._md5 = hashlib.md5() if md5 and self._tmpdir is None else None  # local only
        else:
            self._stream = fileobj
        self._write = self._stream.write if self._md5 is None else self._hashing_write
        self._zstd: Any = None
        self._per_frame = samples_per_frame
        if compress:
            from .compress.zstdwrite import SeekableZstdWriter

            self._zstd = SeekableZstdWriter(_Sink(self._write), level=level)  # compressed bytes
            self._write = self._zstd.write
        self._closed = False

    def _open_destination(self, url: str) -> IO[bytes]:
        from .atomic import TempFile
        from .storage import check_writable, is_remote, local_path

        check_writable(url)
        if is_remote(url):
            self._tmpdir = tempfile.mkdtemp(prefix="wids-write-")
            directory, stem = self._tmpdir, "shard.tar"
        else:
            path = os.path.abspath(local_path(url))
            directory, stem = os.path.dirname(path), os.path.basename(path)
        self._tmp = TempFile(directory, stem)
        return open(os.dup(self._tmp.fd), "wb", buffering=1 << 20)

    def __repr__(self) -> str:
        return f"TarWriter({self.url!r}, {len(self._keys)} samples, {self.offset} bytes)"

    def __enter__(self) -> TarWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    @property
    def count(self) -> int:
        """Samples written."""
        return len(self._keys)

    def prepare(self, sample: Mapping[str, Any]) -> Prepared:
        """Check and encode a sample without writing it (see :func:`prepare_sample`)."""
        return prepare_sample(sample, self.encoder)

    def emit(self, prepared: Prepared) -> int:
        """Write a sample made by :meth:`prepare`; returns its payload bytes.

        Raises:
            SampleLayoutError: Its key was already written to this tar.
        """
        self._check_open()
        key, members = prepared
        if key in self._keys:
            raise SampleLayoutError(f"key {key!r} was already written to this tar")
        write, member = self._write, self._headers.member
        offset, payload = self.offset, 0
        try:
            for field, name, data in members:
                size = len(data)
                header = member(name, size)
                write(header)
                write(data)
                pad = -size % BLOCK
                if pad:
                    write(ZEROS[:pad])
                offset += len(header)
                if self.index:
                    self._mfield.append(self._field_ids.setdefault(field, len(self._field_ids)))
                    self._moffset.append(offset)
                    self._msize.append(size)
                offset += size + pad
                payload += size
        except OSError as e:  # a full disk: which shard, and where
            typed = write_error(e, self._where())
            if typed is None:
                raise
            raise typed from e
        self.offset = offset
        self._keys[key] = None
        self._counts.append(len(members))
        if self._zstd is not None and len(self._counts) % self._per_frame == 0:
            with writing(self._where()):
                self._zstd.end_frame()
        return payload

    def write(self, sample: Mapping[str, Any]) -> int:
        """Encode and write one sample; returns the bytes of its fields' data.

        Raises:
            SampleLayoutError: See :meth:`prepare`.
            EncodeError: A field's value does not fit its extension.
        """
        return self.emit(self.prepare(sample))

    def members(self) -> ShardMembers:
        """The member table of what was written so far (offsets from the tar's start).

        A ``.tar.zst``'s table carries its seek points (``seek``), so it is complete only
        after :meth:`finish`; before, it raises ``ValueError``.
        """
        if not self.index:
            raise ValueError("this TarWriter was made with index=False")
        if self._zstd is not None and not self._closed:
            raise ValueError("the member table of a .tar.zst needs finish() first")
        keys = list(self._keys)
        blob = "".join(keys).encode("utf-8")
        lengths = [len(k) for k in keys] if blob.isascii() else [len(k.encode()) for k in keys]
        key_offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lengths, out=key_offsets[1:])
        sample_start = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(self._counts, out=sample_start[1:])
        return ShardMembers(
            fields=list(self._field_ids),
            key_blob=blob,
            key_offsets=key_offsets,
            sample_start=sample_start,
            member_field=np.array(self._mfield, dtype=np.int64),
            member_offset=np.array(self._moffset, dtype=np.int64),
            member_size=np.array(self._msize, dtype=np.int64),
            seek=self.seek_points(),
        )

    def finish(self) -> None:
        """Write the end-of-archive blocks and flush; the file is not yet published."""
        self._check_open()
        with writing(self._where()):
            self._write(ZEROS * 2)
            self.offset += 2 * BLOCK
            if self._zstd is not None:
                self._zstd.close()
            self._stream.flush()
        self._closed = True

    def seek_table(self) -> Any:
        """Where the zstd frames are (``compress="zstd"``, after :meth:`finish`), else ``None``.

        Returns:
            A :class:`~wids.compress.zstdframes.SeekTable`: frame ``i`` is compressed bytes
            ``[compressed[i], compressed[i+1])`` and tar bytes ``[content[i], content[i+1])``.
        """
        if self._zstd is None:
            return None
        if not self._closed:
            raise ValueError("seek_table() needs a finished TarWriter")
        return self._zstd.table()

    def seek_points(self) -> Any:
        """The seek points an index records for this ``.tar.zst`` (``None`` for a plain tar).

        Returns:
            :class:`~wids.compress.SeekPoints` equal to what ``wids index create`` finds.
        """
        table = self.seek_table()
        if table is None:
            return None
        from .compress import SeekPoints

        compressed, content = table.points()
        return SeekPoints("zstd", table.table_offset, table.content_size, compressed, content)

    def temp_stat(self) -> Any:
        """Size and mtime the published file will have (after :meth:`finish`; paths only).

        Returns:
            A :class:`~wids.storage.stats.FileStat` of the temporary file, which the rename keeps.
        """
        from .storage import FileStat

        if self._tmp is None or self._tmp.fd is None or not self._closed:
            raise ValueError("temp_stat() needs a finished TarWriter writing to a path")
        st = os.fstat(self._tmp.fd)
        return FileStat(size=st.st_size, etag=None, mtime=st.st_mtime, md5=self.md5)

    def sync(self) -> None:
        """Finish the tar and flush its temporary file to disk; :meth:`close` publishes it.

        Safe to run in another thread while the caller does something else (``fsync``
        releases the GIL): :class:`~wids.ShardWriter` writes the shard's index meanwhile.
        """
        if not self._closed:
            self.finish()
        if self._tmp is None or self._tmp.fd is None:
            raise ValueError("only a TarWriter writing to a path or URL can be synced")
        with writing(self._where()):
            os.fsync(self._tmp.fd)

    def close(self) -> None:
        """Finish the tar and publish it (rename into place, or upload) when it has a path.

        After closing, :attr:`stat` holds the published file's size/etag/mtime (paths and URLs).
        """
        if self._closed and self._tmp is None:
            return
        try:
            if not self._closed:
                self.finish()
            if self._tmp is not None:
                with writing(self._where()):
                    self._stream.close()
                    self.stat = self._publish()
        except BaseException:
            self.abort()
            raise
        self._cleanup()

    def _publish(self) -> Any:
        from .storage import Source, is_remote, local_path, put_file

        if self.url is None or self._tmp is None:  # an invariant, kept under python -O
            raise RuntimeError("internal error: no destination to publish")
        if is_remote(self.url):
            put_file(self._tmp.path, self.url, self.store)
            stat = self.store.source(self.url).info()
        else:
            path = os.path.abspath(local_path(self.url))
            self._tmp.publish(path)
            stat = Source(path).info()
        return stat if self.md5 is None else replace(stat, md5=self.md5)

    def _where(self) -> str:
        from .storage import redact_url

        return redact_url(self.url) if self.url is not None else "<stream>"

    def _hashing_write(self, data: bytes) -> int:
        self._md5.update(data)
        return self._stream.write(data)  # type: ignore[no-any-return]

    @property
    def md5(self) -> str | None:
        """Hex MD5 of the tar once finished (a local path destination, ``md5=True``)."""
        return self._md5.hexdigest() if self._md5 is not None and self._closed else None

    def abort(self) -> None:
        """Give up: nothing is published, temporary files are removed."""
        self._closed = True
        if self._tmp is not None:
            try:
                self._stream.close()
            except OSError:
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.close()
            self._tmp = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"TarWriter({self.url!r}) is closed")


class _Sink:
    """A write-only file over a write function (where the zstd frames go)."""

    def __init__(self, write: Callable[[bytes], Any]) -> None:
        self.write = write
