"""Where an index is written: checks on the output, and publishing it with its sidecars.

Index writers (:mod:`wids.index.jsonwriter`, :mod:`wids.index.sqlitewriter`, ...) write local
files. For an output such as ``s3://bucket/train.json``, :func:`index_destination` hands the
writer a path in a temporary directory and, once the writer has closed, uploads the result
(:func:`wids.storage.destination`): member-table sidecars first, the description (or SQLite
file) last and whole, then sidecars of a previous build that the new description no longer
names are removed.

:func:`check_output` runs before any scanning: a name that selects no backend, a read-only
scheme (``http://``), an output equal to one of the shards, or an existing file that is not an
index is refused with one line, so nothing a user made is ever overwritten. Local outputs are
guarded by :func:`wids.lock.writer_lock`, which leaves no lock file behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Sequence

from ..errors import DestinationError, OutputExistsError, writing
from ..storage import (
    Store,
    check_writable,
    destination,
    is_remote,
    local_path,
    read_head,
    redact_url,
    same_place,
)
from .jsonformat import SIDECAR_NAME, members_dir
from .recognise import is_index_head, named_members_dir
from .registry import SQLITE_SUFFIXES, is_sqlite_name, is_table_name, writer_for
from .tableformat import TABLE_SUFFIXES

__all__ = ["check_output", "index_destination"]


def _looks_like_index(head: bytes, sqlite: bool, table: bool = False) -> bool:
    """Whether the first bytes of a file are those of an index (ours or the reference's).

    A damaged index still counts (``index create --full`` repairs it); a file of the user's
    that merely has the name or mentions an index's keys does not (:mod:`.recognise`).
    """
    return is_index_head(head, "table" if table else "sqlite" if sqlite else "json")


def check_output(output: str, shards: Sequence[str], store: Store | None = None) -> None:
    """Refuse, before any work, an output that cannot or must not be written.

    Args:
        output: The index to write: a local path or a URL.
        shards: The shards that will be read (none of them may be the output).
        store: The storage options (and retry policy) for a remote output.

    Raises:
        DestinationError: Unknown suffix, read-only or chained scheme.
        OutputExistsError: The output is one of the shards, a directory, or an existing file
            that is not an index.
    """
    try:
        writer_for(output)  # the registry's choice, made again when the writer is created
    except ValueError:
        raise DestinationError(
            f"index file must end in .json or {'/'.join(SQLITE_SUFFIXES)} or "
            f"{'/'.join(TABLE_SUFFIXES)}",
            shard=redact_url(output),
        ) from None
    check_writable(output)
    where = redact_url(output)
    for shard in shards:
        if same_place(shard, output):
            raise OutputExistsError(
                "is one of the shards to index; not overwriting it", shard=where
            )
    if not is_remote(output) and os.path.isdir(local_path(output)):
        raise OutputExistsError("is a directory; name the index file: train.json", shard=where)
    sidecars = members_dir(local_path(output))
    if not (is_remote(output) or is_sqlite_name(output) or is_table_name(output)) and (
        os.path.lexists(sidecars) and not os.path.isdir(sidecars)
    ):
        raise OutputExistsError(
            f"its member tables go in {os.path.basename(sidecars)}/, which exists and is not a "
            "directory; not touching it (move it away, or name the index otherwise)",
            shard=where,
        )
    head = read_head(output, store)
    table = is_table_name(output)
    if head is not None and not _looks_like_index(head, is_sqlite_name(output), table):
        raise OutputExistsError(
            "exists and is not a wids index (nor a reference one); not overwriting it "
            "(choose another name, or move the file away)",
            shard=where,
        )


@contextlib.contextmanager
def index_destination(
    output: str, store: Store | None = None, placed: Collection[str] = ()
) -> Iterator[str]:
    """The local path an index writer should write; published to ``output`` when done.

    A local ``output`` is written in place (its writer publishes atomically) under an
    exclusive :func:`~wids.lock.writer_lock`. A remote one is written to a temporary
    directory and uploaded when the block exits without an error (see the module docstring).

    Args:
        output: Where the index goes (checked with :func:`check_output` first).
        store: The storage options for a remote ``output``.
        placed: Sidecar names already written at the remote place (by a build's workers), kept
            when stale sidecars are removed; read when the block exits.

    Yields:
        A local path ending like ``output``.

    Raises:
        LockTimeoutError: Another writer of the same local index is running.
        WriteError: Writing failed for want of space or permission (``WritePermissionError``);
            names the output, the file and its directory.
    """
    single_file = is_sqlite_name(output) or is_table_name(output)
    sidecars = None if single_file else members_dir
    stale = None  # what a stale sidecar's name looks like, in a members directory of ours
    if sidecars is not None and is_remote(output):
        named = named_members_dir(read_head(output, store))
        stale = SIDECAR_NAME if named == members_dir(output).rsplit("/", 1)[-1] else None
    with (
        writing(redact_url(output)),  # a full disk, a read-only directory: which output, where
        destination(output, store, sidecar_dir=sidecars, sidecar_name=stale, placed=placed) as path,
    ):
        yield path
