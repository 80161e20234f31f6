"""Storage: URLs, one Source per file, range reads and streams, retries, redaction, I/O stats.

The only part of wids that imports fsspec. Other parts import from this package, not its modules.
"""

from __future__ import annotations

from .publish import (
    SQLITE_SUFFIXES,
    check_output,
    check_writable,
    index_destination,
    is_remote,
    local_path,
    output_dir,
    put_file,
    stored_url,
)
from .redact import (
    RedactingFilter,
    _secret_values,
    escape_controls,
    redact_text,
    redact_url,
)
from .retry import (
    RetryPolicy,
)
from .source import (
    Check,
    FileStat,
    IOStats,
    Source,
    Store,
    _local_path,
    comparable_etag,
    is_local,
    read_ranges,
)

__all__ = [
    "Check",
    "FileStat",
    "IOStats",
    "RedactingFilter",
    "RetryPolicy",
    "SQLITE_SUFFIXES",
    "Source",
    "Store",
    "_local_path",
    "_secret_values",
    "check_output",
    "check_writable",
    "comparable_etag",
    "escape_controls",
    "index_destination",
    "is_local",
    "is_remote",
    "local_path",
    "output_dir",
    "put_file",
    "read_ranges",
    "redact_text",
    "redact_url",
    "stored_url",
]
