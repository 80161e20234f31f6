"""Telling a copy from a rewrite: a local shard's bytes, read once, against the recorded MD5.

``cp -r``, ``rsync`` without ``-t``, ``docker COPY`` and unpacking an archive give every
shard a new modification time and the same bytes; a rewrite of the same size gives a new
modification time and other bytes. Only the bytes tell them apart. When
:meth:`~wids.index.Fingerprint.needs_content` says so (same size, a recorded MD5, another
modification time), :func:`settle` reads the file once and hands its MD5 to
:meth:`~wids.index.Fingerprint.mismatch`, which decides as for any other file: the rule stays
in one place.

What was read is remembered by :class:`ContentMemo`: a file's MD5 under the stat that
identifies that version of it (device, inode, size, modification and change times in
nanoseconds; any write, rename over it or ``touch`` gives another), so a copy is read once
and a rewrite after it is read again. Where it is remembered:

- always in the memo itself (this process; inherited by forked DataLoader workers and
  pickled into spawned ones, where a version's identity still holds);
- in a directory wids owns, when the caller gives one: a dataset's ``cache_dir/digests/``,
  else the ``*.members/`` directory of a local JSON index (wids created it; the index's
  writer removes these files with its stale sidecars). One small JSON file per shard,
  published atomically; a directory that cannot be written leaves the memo in memory, and
  each process then reads a copied shard once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import replace

from ..errors import IndexMismatchError
from ..storage import redact_url, url_name
from .fingerprint import Fingerprint, Observed
from .model import REPAIR_HINT

__all__ = [
    "DIGEST_FORMAT",
    "ContentMemo",
    "file_md5",
    "index_digests_dir",
    "mismatch_error",
    "settle",
]

logger = logging.getLogger(__name__)

DIGEST_FORMAT = "wids-content-digest"
"""``format`` of a remembered MD5 (``version`` 1)."""
_HEAD_LINES = 16  # lines before a wids JSON index's "shardlist": its head, one key a line
_MAX_KNOWN = 1 << 16  # versions remembered in memory (a few MB), then forgotten and read again
_MAX_RECORD = 4096  # bytes of a remembered MD5's file: more is not ours


def file_md5(path: str, expect: Observed | None = None) -> str:
    """The hex MD5 of a local file's bytes.

    Args:
        path: The file.
        expect: What a stat of the file said earlier (a scan's): the file must still be that
            version, before and after it is read.

    Raises:
        IndexMismatchError: The file is not ``expect``, or changed while it was read.
        OSError: It cannot be read.
    """
    with open(path, "rb", buffering=0) as f:
        before = os.fstat(f.fileno())
        md5 = _md5_of(f.fileno())
        after = os.fstat(f.fileno())
    if expect is None:
        return md5
    now = Fingerprint(after.st_size, None, after.st_mtime)
    problem = Fingerprint(expect.size, None, expect.mtime).mismatch(now, strict=True)
    if problem is None and _identity(before) != _identity(after):
        problem = "it changed while it was read"
    if problem is not None:
        raise IndexMismatchError(f"changed while it was indexed: {problem}", shard=redact_url(path))
    return md5


def _md5_of(fd: int) -> str:
    h = hashlib.md5()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(fd, "rb", buffering=0, closefd=False) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ContentMemo:
    """MD5s of local files, each remembered under the stat that identifies its version.

    Args:
        directory: Where to keep them across processes (a directory wids owns: see the
            module's description), or ``None`` for this process only.
    """

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self._known: dict[tuple[int, int, int, int, int], str] = {}
        self._warned = False

    def md5(self, path: str) -> str | None:
        """The MD5 of ``path`` as it is now: remembered, or read now and remembered.

        Returns:
            ``None`` when the file changed while it was being read.

        Raises:
            OSError: The file cannot be read.
        """
        with open(path, "rb", buffering=0) as f:
            key = _identity(os.fstat(f.fileno()))
            got = self._known.get(key) or self._load(path, key)
            if got is None:
                logger.info("reading %s to compare its md5 with the index's", redact_url(path))
                got = _md5_of(f.fileno())
                if _identity(os.fstat(f.fileno())) != key:
                    return None
                self._save(path, key, got)
        if len(self._known) >= _MAX_KNOWN:
            self._known.clear()
        self._known[key] = got
        return got

    def _record_path(self, path: str) -> str | None:
        if self.directory is None:
            return None
        return os.path.join(self.directory, url_name(os.path.abspath(path), ".md5.json"))

    def _load(self, path: str, key: tuple[int, ...]) -> str | None:
        where = self._record_path(path)
        if where is None:
            return None
        try:
            with open(where, "rb") as f:
                rec = json.loads(f.read(_MAX_RECORD + 1))
        except (OSError, ValueError, RecursionError):
            return None
        if not (
            isinstance(rec, dict)
            and rec.get("format") == DIGEST_FORMAT
            and rec.get("version") == 1
            and rec.get("path") == os.path.abspath(path)
            and rec.get("identity") == list(key)
            and isinstance(rec.get("md5"), str)
            and len(rec["md5"]) == 32
        ):
            return None
        return str(rec["md5"])

    def _save(self, path: str, key: tuple[int, ...], md5: str) -> None:
        where = self._record_path(path)
        if where is None:
            return
        from ..atomic import atomic_write_bytes

        rec = {
            "format": DIGEST_FORMAT,
            "version": 1,
            "path": os.path.abspath(path),
            "identity": list(key),  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns
            "md5": md5,
        }
        try:
            atomic_write_bytes(where, json.dumps(rec).encode(), fsync=False)
        except OSError as e:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "cannot remember shards verified by their contents in %s (%s): each "
                    "process reads them again; give the dataset a cache_dir, or rebuild the "
                    "index where the shards are now (%s)",
                    self.directory,
                    e,
                    REPAIR_HINT,
                )


def index_digests_dir(index: object) -> str | None:
    """The ``*.members/`` directory of a local JSON index, if the index names it as its own.

    Only a directory wids made: the index's ``wids_index.members_dir`` must name it (a user's
    unrelated ``X.members/`` beside a reference-format ``X.json`` receives nothing).
    """
    from ..storage import is_local, local_path
    from .jsonformat import members_dir

    src = os.fspath(index) if isinstance(index, (str, os.PathLike)) else ""
    if not (src.endswith(".json") and is_local(src)):
        return None
    path = local_path(src)
    where = members_dir(path)
    if not os.path.isdir(where) or _named_members_dir(path) != os.path.basename(where):
        return None
    return where


def _named_members_dir(path: str) -> str | None:
    """``wids_index.members_dir`` from the head of a JSON index wids wrote (one key a line)."""
    try:
        with open(path, encoding="utf-8") as f:
            for _, line in zip(range(_HEAD_LINES), f, strict=False):
                if line.startswith('"wids_index": '):
                    head = json.loads(line[len('"wids_index": ') :].rstrip().rstrip(","))
                    named = head.get("members_dir") if isinstance(head, dict) else None
                    return named if isinstance(named, str) else None
                if line.startswith('"shardlist"'):
                    return None
    except (OSError, ValueError):
        pass
    return None


def settle(
    recorded: Fingerprint,
    now: Observed,
    path: str | None,
    memo: ContentMemo,
    *,
    data_end: int | None = None,
) -> tuple[str | None, bool]:
    """:meth:`Fingerprint.mismatch`, with a local file's bytes read when only they can tell.

    Args:
        recorded: The shard's fingerprint in the index.
        now: What a stat of the file says now.
        path: The local file, or ``None`` for a remote one (never read whole here).
        memo: Where MD5s read before are remembered.
        data_end: As for :meth:`Fingerprint.mismatch`.

    Returns:
        ``(problem, copied)``: what differs (``None``: the shard), and whether the file was
        found to be a copy (same bytes, another modification time).
    """
    problem = recorded.mismatch(now, data_end=data_end)
    if problem is None or path is None or not recorded.needs_content(now, data_end=data_end):
        return problem, False
    md5 = memo.md5(path)
    if md5 is None:
        return f"{problem}, and it changed while its contents were read", False
    problem = recorded.mismatch(replace(Fingerprint.of(now), md5=md5), data_end=data_end)
    return problem, problem is None


def mismatch_error(problem: str, url: str) -> IndexMismatchError:
    """The error for a shard that is not the one its index describes (what differs, what to run)."""
    return IndexMismatchError(
        f"not the shard the index describes: {problem}; to go on, {REPAIR_HINT}",
        shard=redact_url(url),
    )
