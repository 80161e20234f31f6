"""Storage: URLs, one Source per file, range reads and streams, retries, redaction, I/O stats.

The only part of wids that imports fsspec. Other parts import from this package, not its modules:

- :mod:`.source`: :class:`Store` (storage options + retry policy + I/O counters + the version
  each file is read at, one object) and :class:`Source` (one file: stat, checked range reads,
  streams, downloads);
- :mod:`.answer`: :class:`Answer` (what a range read's answer says), :class:`Pin` (the version
  a file is read at), :func:`check_answer` (the one check of an answer);
- :mod:`.batch`: :func:`read_ranges`, many ranges at once;
- :mod:`.descriptors`: :class:`DescriptorPool`, local files' descriptors kept open within the
  process's file limit;
- :mod:`.forks`: whether this is still the process an object was made in (no ``getpid``);
- :mod:`.stats`: :class:`FileStat`, :class:`IOStats`, :func:`comparable_etag`;
- :mod:`.urls`: local or remote, how an index records a shard, :func:`url_name`;
- :mod:`.globs`: wildcards in shard URLs (:func:`expand_glob`), in natural order;
- :mod:`.publish`: writing: :func:`check_writable`, :func:`put_file`, :func:`destination`;
- :mod:`.redact`: what is safe to show: :func:`redact_url`, :func:`redact_text` ...; a URL's
  identity without known credentials: :func:`strip_credentials`, :func:`file_identity`;
- :mod:`.origins`: which storage options a URL is opened with (credentials per origin);
- inside: :mod:`.retry` (policy, failure kinds, retry loops), :mod:`.backends` (fsspec
  backend specifics), :mod:`.transport` and :mod:`.objectstores` (one transport per backend;
  :mod:`.viaobstore`: obstore, the optional extra, chosen by the ``transport`` option),
  :mod:`.clients` (this process's filesystems and sessions), :mod:`.streams`,
  :mod:`.parts` (whole-file downloads in concurrent checked parts; :func:`read_whole`),
  :mod:`.local` (``os.pread`` on local files).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from . import forks
    from .answer import Answer, Check, Pin, RangeFallbackWarning, check_answer, too_large
    from .backends import preload
    from .batch import Window, read_ranges
    from .descriptors import DescriptorPool
    from .globs import expand_glob, has_glob, natural_key
    from .limits import ReadLimits
    from .origins import named_by
    from .parts import read_whole
    from .publish import check_writable, destination, put_file, read_head, same_place
    from .redact import (
        RedactingFilter,
        escape_controls,
        file_identity,
        redact_text,
        redact_url,
        strip_credentials,
    )
    from .retry import RetryPolicy
    from .source import Source, Store
    from .stats import FileStat, IOStats, comparable_etag
    from .urls import is_local, is_remote, local_file, local_path, output_dir, stored_url, url_name

# Where each name lives, imported on first use (PEP 562): the command line's start-up and
# ``import wids.storage.redact`` then import neither fsspec nor asyncio nor numpy.
_LAZY = {
    "Answer": "answer",
    "Check": "answer",
    "RangeFallbackWarning": "answer",
    "DescriptorPool": "descriptors",
    "FileStat": "stats",
    "IOStats": "stats",
    "Pin": "answer",
    "ReadLimits": "limits",
    "RedactingFilter": "redact",
    "RetryPolicy": "retry",
    "Source": "source",
    "Store": "source",
    "Window": "batch",
    "check_answer": "answer",
    "check_writable": "publish",
    "comparable_etag": "stats",
    "destination": "publish",
    "escape_controls": "redact",
    "expand_glob": "globs",
    "file_identity": "redact",
    "forks": "forks",
    "has_glob": "globs",
    "is_local": "urls",
    "is_remote": "urls",
    "local_file": "urls",
    "local_path": "urls",
    "named_by": "origins",
    "natural_key": "globs",
    "output_dir": "urls",
    "preload": "backends",
    "put_file": "publish",
    "read_head": "publish",
    "read_ranges": "batch",
    "read_whole": "parts",
    "redact_text": "redact",
    "redact_url": "redact",
    "same_place": "publish",
    "stored_url": "urls",
    "strip_credentials": "redact",
    "too_large": "answer",
    "url_name": "urls",
}

__all__ = [
    "Answer",
    "Check",
    "DescriptorPool",
    "FileStat",
    "IOStats",
    "Pin",
    "RangeFallbackWarning",
    "ReadLimits",
    "RedactingFilter",
    "RetryPolicy",
    "Source",
    "Store",
    "Window",
    "check_answer",
    "check_writable",
    "comparable_etag",
    "destination",
    "escape_controls",
    "expand_glob",
    "file_identity",
    "forks",
    "has_glob",
    "is_local",
    "is_remote",
    "local_file",
    "local_path",
    "named_by",
    "natural_key",
    "output_dir",
    "preload",
    "put_file",
    "read_head",
    "read_ranges",
    "read_whole",
    "redact_text",
    "redact_url",
    "same_place",
    "stored_url",
    "strip_credentials",
    "too_large",
    "url_name",
]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())  # a name of _LAZY on first use
