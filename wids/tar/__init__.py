"""Tar header parsing: members' names, data offsets and sizes, without reading their data.

The entry points share one header walker:

- :func:`iter_members_fetch` — random access through a ``fetch(start, end) -> bytes`` callable;
  reads each 512-byte header (and the data of pax / GNU long-name records) and skips member data.
- :func:`iter_members_stream` — one sequential pass over a non-seekable stream (remote shards),
  read in large chunks; it never seeks and reads the stream to its end.
- :func:`scan_local` (and :func:`scan_local_rows`) — a local file read with ``os.pread``, a small
  window per header, the fastest path. :func:`scan_local_headers` (:mod:`.bulk`) is faster still
  for archives of plain regular members (it decodes their headers in bulk with numpy) and
  returns ``None`` for any other archive.
- :func:`iter_members_hopping` — remote archives of large members: one ranged read per header
  (a small block from it on, so nearby headers come together); :func:`header_stride` tells
  from an archive's first bytes whether its members are large enough for that to pay.

Formats: ustar (``prefix`` field), GNU (``L`` long name, ``K`` long link, base-256 numbers), pax
(``x`` for the next member, ``g`` global; ``path`` and ``size`` override the header), v7.
Results agree with :mod:`tarfile` (the test oracle): same names, data offsets, sizes and types.

Strictness, where it differs from :mod:`tarfile`:

- The archive must end with an end-of-archive block (a 512-byte zero block; like tarfile we stop
  at the first one). A file that ends at a member boundary without one is reported as truncated
  (:class:`~wids.errors.TruncatedTarError`): tarfile accepts such a prefix silently, and an index
  built from it would be silently short.
- A bad header checksum anywhere is a :class:`~wids.errors.HeaderChecksumError`; tarfile treats a
  bad header after the first one as the end of the archive.
- A pax ``size`` that is not a number is an error (tarfile uses 0).
- A global (``g``) pax ``size`` applies to the member's size *and* to where its data ends;
  tarfile reports it as the size but skips by the header's size. Nobody writes such archives.
- GNU sparse members (type ``S`` or pax ``GNU.sparse.*``) are rejected: their stored bytes are not
  the file's content, so a byte range could not serve them.

- A 0-byte file is an error; an archive of only zero blocks (or only a pax ``g`` record and
  zero blocks, which tarfile cannot read) yields nothing.
- Extension records over :data:`MAX_EXTENSION` bytes are refused rather than read into memory,
  and member names (GNU long names, pax paths) over :data:`MAX_NAME` bytes are refused.
- Sizes of :data:`MAX_MEMBER_SIZE` (2**62) or more are refused: no storage holds such a member,
  and offsets computed from them would overflow.
- Every pax record's length must end exactly at its newline inside the record data, and
  anything but NUL padding after the last record is an error (tarfile before 3.12.5 took the
  wrong bytes into a value or dropped the rest silently).

Like tarfile, data is skipped only for regular files and unknown types; for hard and symbolic
links, directories, devices and fifos the next header follows directly.

Every header's checksum is verified (the unsigned sum, or the historic signed one, as tarfile
accepts). The fetch path checks each header as it reads it; the local scan and the stream check
them in numpy batches of a few thousand (a third of the per-header cost in pure Python) and hand
out a batch's members only after it passed, reporting the first bad header as if it had been
checked first.

The package's modules: :mod:`.member` (the :class:`TarMember` record), :mod:`.header`
(decoding one header block and its pax / GNU extension records, checksums, and checking that
512 bytes are a given member's header), :mod:`.walk` (the walker and the three entry points),
:mod:`.hop` (header hopping).
"""

from __future__ import annotations

from .bulk import LocalHeaders, scan_local_headers
from .header import (
    BLOCK,
    MAX_EXTENSION,
    MAX_MEMBER_SIZE,
    MAX_NAME,
    header_fits,
    header_mismatch,
    record_name,
)
from .hop import header_stride, iter_members_hopping
from .member import TarMember
from .walk import iter_members_fetch, iter_members_stream, scan_local, scan_local_rows

__all__ = [
    "BLOCK",
    "LocalHeaders",
    "MAX_EXTENSION",
    "MAX_MEMBER_SIZE",
    "MAX_NAME",
    "TarMember",
    "header_fits",
    "header_mismatch",
    "header_stride",
    "iter_members_fetch",
    "iter_members_hopping",
    "iter_members_stream",
    "record_name",
    "scan_local",
    "scan_local_headers",
    "scan_local_rows",
]
