"""What a stat of a file says, how to compare etags, and the I/O counters of a process."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FileStat", "IOStats", "comparable_etag"]


@dataclass
class IOStats:
    """Mutable I/O counters; keep one per dataset per process.

    Attributes:
        requests: Attempts made (every retry is one more request).
        bytes_read: Payload bytes received and accepted.
        retries: Attempts repeated after a transient failure.
        errors: Operations that ended by raising an error to the caller.
    """

    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class FileStat:
    """What one stat of a file says.

    Attributes:
        size: Size in bytes.
        etag: The storage's entity tag (quotes removed), if it has one.
        mtime: Modification time as a POSIX timestamp, if known.
        md5: Hex MD5 of the whole file, when the store says it (GCS's ``md5Hash``), or when
            wids computed it (a file it wrote, a local file it read).
    """

    size: int
    etag: str | None
    mtime: float | None
    md5: str | None = None


def comparable_etag(etag: str | None) -> str | None:
    """An etag reduced to what identifies the bytes: no weak ``W/`` prefix, no quotes.

    Backends and proxies disagree on quoting and weakness for the same object; compare etags
    (index vs storage vs cache record) only through this.
    """
    if etag is None:
        return None
    return etag.strip().removeprefix("W/").strip('"')
