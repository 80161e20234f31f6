"""The JSON index: a ``wids-shard-index-v1`` description plus per-shard member sidecars.

Layout, for an index ``train.json``::

    train.json                      the description; the reference wids loads it unchanged
    train.members/                  one sidecar per shard, read only when that shard is needed
        3f2a9c0d1e4b5a67c8d9e0f1-train-000000.tar.json
        ...
        <24 hex>-train-000000.tar.md5.json   a copy's md5, once read (wids.index.contents)

``train.json`` is a reference description (``__kind__``, ``wids_version``, ``name``,
``shardlist`` of ``url``/``nsamples``/``filesize``[/``md5sum``], ``datasets`` for
sub-datasets) with extra keys the reference ignores:

- top level: ``"wids_index": {"format": "wids-index-json", "version": 1, "members_dir":
  "train.members", "report": {...}}`` (the builder's report);
- per shard: ``etag`` and ``mtime`` (what identified the shard's bytes when indexed) and
  ``members``, the sidecar's path relative to the description's directory.

A sidecar (:func:`sidecar_name`: ``<24 hex>-<basename>.json``) holds ``format``
(``wids-index-json-members``), ``version``, the shard's ``url``/``nsamples``/``size``/
``etag``/``mtime`` as in the description and the columns of :meth:`ShardMembers.to_columns`;
a compressed shard's sidecar is version 2 (:data:`SEEK_VERSION`) and has ``seek`` too.
With metadata columns (:mod:`wids.index.columns`), also ``wids_columns`` before ``fields``
(the description's entry then has ``"wids_columns": "members"``).
On load it must name the same file (the URL's last part) with the same size, etag and mtime
as the shard's entry, so a stale sidecar is an error, never wrong offsets, while an index
whose shard URLs were edited to a mirror of the same files keeps working.

Only the top-level file is read when an index is opened; a 100k-shard description loads in a
fraction of a second. Every file is published atomically (temporary file + ``os.replace``);
sidecars are written first and the description last, and sidecars no longer referenced are
removed when the writer closes.
"""

from __future__ import annotations

import re

from ..storage import url_name

__all__ = [
    "COLUMNS_IN_SIDECAR",
    "COLUMNS_KEY",
    "FORMAT",
    "MEMBERS_FORMAT",
    "SHARD_KEYS",
    "SEEK_VERSION",
    "SIDECAR_NAME",
    "VERSION",
    "members_dir",
    "sidecar_name",
]

FORMAT = "wids-index-json"
"""``wids_index.format`` of a JSON index."""
MEMBERS_FORMAT = "wids-index-json-members"
"""``format`` of a sidecar member file."""
VERSION = 1
"""Version of both."""
SEEK_VERSION = 2
"""Version of a sidecar of a compressed shard: it has ``seek``, the shard's seek points
(:meth:`wids.compress.SeekPoints.to_bytes`, base64), which readers of version 1 would miss."""

COLUMNS_KEY = "wids_columns"
"""A shard's metadata columns (:mod:`wids.index.columns`): in a JSON index, the sidecar holds
them (a key before ``fields``) and the description's entry says :data:`COLUMNS_IN_SIDECAR`,
so the description opens as fast as one without; the reader's ``shard_extra`` reads them."""
COLUMNS_IN_SIDECAR = "members"
"""The description entry's ``wids_columns`` when the columns are in the shard's sidecar."""
SHARD_KEYS = frozenset(
    ("url", "nsamples", "filesize", "md5sum", "etag", "mtime", "members", "tarsize")
)
"""Keys of a shard's entry in the description; ``tarsize``: a compressed shard's tar size."""
SIDECAR_NAME = re.compile(r"^[0-9a-f]{16}(?:[0-9a-f]{8})?-.*\.json$")
"""What the name of a sidecar looks like (others in the members directory are not ours).

Sidecars are named by :func:`wids.storage.url_name` (24 hex digits); indexes written before
that have 16 (sha1), which still load (the description points at each sidecar) and are
removed as stale when their index is rewritten."""


def members_dir(path: str) -> str:
    """The directory of an index's sidecars: ``train.json`` -> ``train.members``."""
    stem = path[: -len(".json")] if path.endswith(".json") else path
    return stem + ".members"


def sidecar_name(url: str) -> str:
    """The file name of the sidecar of the shard stored as ``url``: ``url_name(url, ".json")``."""
    return url_name(url, ".json")
