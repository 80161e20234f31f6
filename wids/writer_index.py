"""The index a :class:`~wids.ShardWriter` keeps: loadable on disk while the shards are written.

Shards are added in shard order once they are published, with the member table the writer
recorded and the fingerprint a later stat gives (size plus mtime locally, size plus etag from
the store after an upload). The result is what ``wids index create`` writes for the same
shards: the same writer classes (through :func:`~wids.index.registry.create_index_writer`),
the same stored URLs (relative to the index's directory), the same report.

Checkpoints, so a killed writer leaves an index of whole shards:

- JSON: each shard's sidecar is written once, when it is added, and the description is
  republished after every shard (its size grows by a line per shard).
- SQLite: the file is rebuilt from the last checkpoint plus the shards added since, when the
  shards written since the last checkpoint are at least :data:`SQLITE_REBUILD_RATIO` times
  the index's size (so rebuilding costs a bounded fraction of the writing), and at the end.
  Between checkpoints the file lags behind; ``resume=True`` indexes the shards it lacks.

A remote index is kept in a local temporary directory and each checkpoint is uploaded
(new sidecars first, the description last, each file whole).

What a writer keeps of an existing index (``resume``, ``start_shard``) is
:mod:`wids.writer_keep`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from .index import ShardInfo, ShardMembers
from .storage import Store

__all__ = ["SQLITE_REBUILD_RATIO", "IndexKeeper"]

logger = logging.getLogger(__name__)

SQLITE_REBUILD_RATIO = 20
"""An SQLite checkpoint waits until this many times its size in shard bytes were written."""


class IndexKeeper:
    """Write an index shard by shard, keeping a loadable checkpoint on disk.

    Args:
        url: The index: a local path or writable fsspec URL, ``*.json`` or ``*.sqlite``.
        storage_options: fsspec options for a remote index.
        name: The dataset's name stored in the index.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | Store | None = None,
        name: str | None = None,
    ) -> None:
        from .index import is_sqlite_name, is_table_name
        from .storage import is_remote, local_path, output_dir

        self.url = url
        self.store = Store.of(storage_options)
        self.name = name
        self.remote = is_remote(url)
        # single-file backends (SQLite, shard table) are rewritten whole at checkpoints
        self.sqlite = is_sqlite_name(url) or is_table_name(url)
        self.out_dir = output_dir(url)
        self._tmpdir: str | None = None
        if self.remote:
            self._tmpdir = tempfile.mkdtemp(prefix="wids-index-")
            self.path = os.path.join(self._tmpdir, url.rstrip("/").rsplit("/", 1)[-1])
        else:
            self.path = os.path.abspath(local_path(url))
        self.shards = 0
        self.samples = 0
        self.bytes = 0
        self._json: Any = None
        self._uploaded: set[str] = set()
        self._pending: list[tuple[ShardInfo, ShardMembers, Mapping[str, Any] | None]] = []
        self._since = 0  # shard bytes added since the last SQLite checkpoint
        self._checkpoint_size = 0
        self._closed = False

    def add(
        self,
        url: str,
        stat: Any,
        members: ShardMembers,
        *,
        checkpoint: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a published shard (``stat``: its :class:`~wids.storage.stats.FileStat`).

        Args:
            url: The shard.
            stat: Its size, etag, mtime as a later stat of the file gives them.
            members: Its member table.
            checkpoint: Publish the index now (:meth:`checkpoint`); a caller that adds a shard
                before it is renamed into place checkpoints after the rename instead.
            extra: More keys kept with the shard (its metadata columns).
        """
        from .storage import stored_url

        info = ShardInfo(
            url=stored_url(url, self.out_dir),
            nsamples=len(members),
            size=stat.size,
            etag=stat.etag,
            mtime=stat.mtime,
            md5sum=getattr(stat, "md5", None),  # what TarWriter computed as it wrote
        )
        self.shards += 1
        self.samples += len(members)
        self.bytes += stat.size
        if self.sqlite:
            self._pending.append((info, members, extra))
            self._since += stat.size
        else:
            if self._json is None:
                from .index import JsonIndexWriter

                self._json = JsonIndexWriter(self.path, name=self.name)
            self._json.add(info, members, extra)  # writes the shard's sidecar
        if checkpoint:
            self.checkpoint(force=False)

    def checkpoint(self, *, force: bool = True) -> None:
        """Publish the index of the shards added so far.

        Args:
            force: For SQLite, rebuild even if :data:`SQLITE_REBUILD_RATIO` says to wait.
        """
        if self.sqlite:
            if force or self._since >= SQLITE_REBUILD_RATIO * self._checkpoint_size:
                self._rebuild_sqlite(final=False)
        elif self._json is not None:
            self._json.set_report(self._report())
            self._json.flush(fsync=False)
            self._upload()

    def _report(self) -> dict[str, Any]:
        from .index import BuildReport

        report = BuildReport(output=self.url, shards=self.shards, samples=self.samples)
        report.bytes = self.bytes
        return report.as_dict()

    def close(self) -> None:
        """Publish the final index (also when no shard was written: an empty index)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.sqlite:
                self._rebuild_sqlite(final=True)
            else:
                if self._json is None:
                    from .index import JsonIndexWriter

                    self._json = JsonIndexWriter(self.path, name=self.name)
                self._json.set_report(self._report())
                self._json.close()
                self._upload()
        finally:
            self._cleanup()

    def abort(self) -> None:
        """Stop; the last checkpoint stays as it is."""
        self._closed = True
        if self._json is not None:
            self._json.abort()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _rebuild_sqlite(self, *, final: bool) -> None:
        """Write a new single file (SQLite, shard table): old shards, then the pending ones."""
        from .index import create_index_writer, iter_shards, open_index

        old = open_index(self.path, base=self.out_dir) if self._checkpoint_size else None
        writer = create_index_writer(self.path, name=self.name)
        try:
            if old is not None:
                for i, info in enumerate(iter_shards(old)):  # one record at a time
                    stored = _stored_copy(info, self.out_dir)
                    writer.add(stored, old.members(i), old.shard_extra(i) or None)
            for info, members, extra in self._pending:
                writer.add(info, members, extra)
            writer.set_report(self._report())
        except BaseException:
            writer.abort()
            raise
        finally:
            if old is not None:
                old.close()
        writer.close()
        self._pending.clear()
        self._since = 0
        self._checkpoint_size = max(1, os.path.getsize(self.path))
        self._upload()
        logger.debug("index %s: checkpoint of %d shards (final=%s)", self.url, self.shards, final)

    def _upload(self) -> None:
        """Upload a remote index's new sidecars, then its description."""
        if not self.remote:
            return
        from .storage import put_file

        if not self.sqlite:
            from .index import members_dir

            local_dir = members_dir(self.path)
            remote_dir = members_dir(self.url)
            names = sorted(os.listdir(local_dir)) if os.path.isdir(local_dir) else []
            for name in names:
                if name not in self._uploaded:
                    dest = f"{remote_dir}/{name}"
                    put_file(os.path.join(local_dir, name), dest, self.store)
                    self._uploaded.add(name)
        put_file(self.path, self.url, self.store)


def _stored_copy(info: ShardInfo, out_dir: str) -> ShardInfo:
    """``info`` read back from the index, its resolved URL stored again as the writer had it."""
    from dataclasses import replace

    from .storage import stored_url

    return replace(info, url=stored_url(info.url, out_dir))
