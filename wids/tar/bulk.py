"""Headers of a local tar of plain regular members, decoded in bulk (the index builder's path).

Most WebDataset shards hold only regular files with short ASCII-clean ustar headers. For
those, :func:`scan_local_headers` walks the chain of headers parsing nothing but each size
(one ``os.pread`` per header, or per window of small members), then checks and decodes every
header at once with numpy: canonical checksums, types, NUL-terminated names. Whatever the
exact walker (:mod:`.walk`) treats specially -- extension records (pax, GNU long names), links,
directories, ustar prefixes, base-256 or unusual numbers, other checksum renderings, a
truncated file or a missing end-of-archive block -- makes it return ``None``; the caller then
scans with :func:`~wids.tar.scan_local_rows`, which gives the same members for every archive
this accepts, and the typed error or exact result for the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ShardNotFoundError
from .header import _ZERO, BLOCK, _canonical_checksums

if TYPE_CHECKING:
    import numpy as np

__all__ = ["LocalHeaders", "scan_local_headers"]

# Bytes per pread: the headers of a few small members arrive together (as in walk.py).
WINDOW = 3072
NAME = 100  # bytes of the ustar name field
# Headers checked at once: the first few (an archive of another kind is left soon), then more
# (numpy's fixed costs spread, memory bounded by the name fields, not whole headers).
FIRST_BATCH = 64
BATCH = 16384


@dataclass(frozen=True, slots=True)
class LocalHeaders:
    """The members of an archive of plain regular files, as columns.

    Attributes:
        header_offset: Per member, its header's offset (int64); its data starts 512 bytes on.
        size: Per member, its size (int64).
        name: Per member, its name (uint8, ``(n, w)``, ``w`` the longest name's length,
            zero-padded); names hold no NUL and have no ustar prefix.
        name_len: Per member, the length of its name (int64).
    """

    header_offset: np.ndarray
    size: np.ndarray
    name: np.ndarray
    name_len: np.ndarray


def scan_local_headers(
    path: str | os.PathLike[str], *, shard: str | None = None
) -> LocalHeaders | None:
    """The members of a local tar of plain regular files, or ``None`` for any other archive.

    Args:
        path: A local file path.
        shard: Name used in error messages (default: ``path``).

    Returns:
        The members in archive order (all regular files with canonical ustar headers, ending
        with an end-of-archive block), or ``None``: then :func:`~wids.tar.scan_local_rows`
        gives the members (or the error) of the archive.

    Raises:
        ShardNotFoundError: ``path`` does not exist.
    """
    import numpy as np

    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY)
    except FileNotFoundError:
        raise ShardNotFoundError(f"no such file: {name}", shard=shard or name) from None
    try:
        chain = _chain(fd)
    finally:
        os.close(fd)
    if chain is None:
        return None
    sizes, names_parts, len_parts = chain
    n = len(sizes)
    name_len = np.concatenate(len_parts) if len_parts else np.zeros(0, dtype=np.int64)
    width = max(int(name_len.max(initial=0)), 1)  # only the columns some name reaches
    names = np.concatenate([part[:, :width] for part in names_parts]) if names_parts else None
    names = (
        names * (np.arange(width) < name_len[:, None])
        if names is not None
        else np.zeros((0, width), dtype=np.uint8)
    )
    sizes_arr = np.array(sizes, dtype=np.int64)
    offsets = np.zeros(n, dtype=np.int64)
    np.cumsum((sizes_arr[:-1] + (BLOCK + 511)) & -512, out=offsets[1:])
    return LocalHeaders(offsets, sizes_arr, names, name_len)


def _decode(headers: list[bytes]) -> tuple[np.ndarray, np.ndarray] | None:
    """Check a batch of headers; their name fields (raw) and name lengths, or ``None``."""
    import numpy as np

    n = len(headers)
    h = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(n, BLOCK)
    kind = h[:, 156]
    names = h[:, :NAME]
    nul = names == 0
    name_len = np.where(nul.any(1), nul.argmax(1), NAME).astype(np.int64)
    last = names[np.arange(n), np.maximum(name_len - 1, 0)]
    plain = (
        (h[:, 135] == 0)  # the size parsed is the one the exact walker reads
        & ((kind == 48) | ((kind == 0) & ((name_len == 0) | (last != 47))))  # no v7 directory
        & (h[:, 345] == 0)  # no ustar prefix
        & _canonical_checksums(h)
    )
    if not bool(plain.all()):
        return None
    return names.copy(), name_len


def _chain(fd: int) -> tuple[list[int], list[np.ndarray], list[np.ndarray]] | None:
    """Follow the headers by their sizes to the end-of-archive block, checking them in batches.

    Returns the sizes, and per batch the raw name fields and name lengths; ``None`` as soon as
    a header is not a plain regular member's (the exact walker decides what it is). The first
    batch is small, so that other archives go to the exact walker after a few headers.
    """
    pread = os.pread
    headers: list[bytes] = []
    sizes: list[int] = []
    names: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    add_header, add_size = headers.append, sizes.append
    off = base = blen = 0
    buf = b""
    flush_at = FIRST_BATCH
    while True:
        p = off - base
        if p + BLOCK > blen:
            if len(headers) >= flush_at:
                batch = _decode(headers)
                if batch is None:
                    return None
                names.append(batch[0])
                lengths.append(batch[1])
                headers.clear()
                flush_at = BATCH
            buf = pread(fd, WINDOW, off)
            base, p, blen = off, 0, len(buf)
            if blen < BLOCK:
                return None
        h = buf[p : p + BLOCK]
        try:
            size = int(h[124:135], 8)  # as walk.py's hot path; h[135] is checked in bulk
        except ValueError:
            break
        if size < 0:
            return None
        add_header(h)
        add_size(size)
        off += BLOCK + ((size + 511) & -512)
    if h != _ZERO:
        return None
    if headers:
        batch = _decode(headers)
        if batch is None:
            return None
        names.append(batch[0])
        lengths.append(batch[1])
    return sizes, names, lengths
