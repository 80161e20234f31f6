"""The dataset description (``wids-shard-index-v1``): loading, validation, sub-datasets.

A description is a JSON object (see ``docs/compat.md``)::

    {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "train",
     "shardlist": [{"url": "train-000000.tar", "nsamples": 100, "filesize": 24371200}],
     "datasets": [{"source_url": "other.json", "weight": 0.5},
                  {"name": "extra", "base": "s3://b/p", "shardlist": [...]}]}

Rules, the reference's where it had them, ours where it was silent or wrong:

- ``wids_version`` must be 1 in the top-level file; ``__kind__``, when present, must be
  ``wids-shard-index-v1``. Each shard needs a string ``url`` and a non-negative integer
  ``nsamples``; ``filesize`` (integer), ``md5sum``, ``etag`` (strings) and ``mtime``
  (number) are checked when present. Unknown keys are ignored and kept: every shard's raw
  entry is returned in :attr:`Spec.extras`.
- Relative shard URLs resolve against, in this order: the ``base`` argument of
  :func:`load_spec`, the file's top-level ``base`` (itself relative to the file's directory;
  the reference ignored it), the file's directory, and for a list or stream without either the
  current directory. A sub-dataset's ``base`` resolves against its parent's.
- ``datasets`` entries are appended after ``shardlist``, in order, recursively: a
  ``source_url`` (relative to the containing file's directory) loads another description, an
  inline entry carries its own ``shardlist``. Each becomes a
  :class:`~wids.index.model.Component`; so does the main ``shardlist`` when it has shards or
  when there are no sub-datasets. Component names are the entry's ``name``, else the loaded
  file's ``name``, else ``""`` (never ``None``: torch's ``default_collate`` rejects it). A
  cycle of ``source_url`` references is an error.

URL rules (resolving, mirrors, remote-only checks) are in :mod:`wids.index.urls`.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import IndexFormatError, NotAnIndexError, UntrustedLocationError
from ..storage import Store, named_by, read_whole, redact_url
from .model import MAX_NSAMPLES, MAX_SHARD_SIZE, Component, ShardInfo, max_samples
from .recognise import HEAD_BYTES, is_index_head
from .urls import (
    UrlMap,
    apply_url_map,
    check_remote_ref,
    check_url_map,
    is_remote_url,
    resolve_url,
    url_dir,
)

__all__ = ["KIND", "Spec", "StreamContent", "load_spec", "read_bytes"]

KIND = "wids-shard-index-v1"
"""The ``__kind__`` of a dataset description."""

_MAX_DEPTH = 32
# A top-level description without any of these is not an index at all (NotAnIndexError).
_INDEX_KEYS = frozenset(("__kind__", "wids_version", "shardlist", "datasets", "wids_index"))
_MAX_FILES = 10_000  # descriptions loaded through source_url, in all (fan-out, not only depth)


class StreamContent:
    """What an open stream of a description held, read at once (the stream may then close).

    A dataset given ``open(path)`` reads it when it is made, as the reference did, so that
    ``with open(p) as f: ds = ShardListDataset(f)`` goes on working, and pickles to workers.
    :func:`load_spec` takes it as the stream it was (``read()`` gives the whole text).
    """

    __slots__ = ("data",)

    def __init__(self, data: str | bytes) -> None:
        self.data = data

    def read(self) -> str | bytes:
        """The stream's whole content."""
        return self.data


@dataclass(frozen=True)
class Spec:
    """A loaded and validated dataset description.

    Attributes:
        name: The top-level ``name`` (``""`` when none).
        shards: All shards in order, URLs resolved (absolute URL or absolute local path).
        components: The main shard list and the sub-datasets, as shard ranges.
        extras: Each shard's raw entry as stored (all keys, URL unresolved); our extension
            keys (``members``, ...) are read from here.
        origins: For each shard, the description file its entry came from (``None`` for an
            inline list or a stream), against whose directory its relative pointers resolve.
        top: The top-level object without ``shardlist`` and ``datasets``.
        url: Where the description was loaded from, if from a path or URL.
    """

    name: str
    shards: list[ShardInfo]
    components: list[Component]
    extras: list[dict[str, Any]] = field(repr=False)
    origins: list[str | None] = field(repr=False)
    top: dict[str, Any] = field(repr=False)
    url: str | None = None


def read_bytes(url: str, store: Store | None = None, kind: str = "description") -> bytes:
    """Read a whole (small) file from a path or any fsspec URL (remotely: one request).

    ``kind`` (``"description"`` or ``"members"``) picks the bound of the store's
    :class:`~wids.storage.ReadLimits`: a larger file is ``TooLargeError``, never read whole.
    """
    store = store or Store()
    src = store.source(url)
    try:
        return read_whole(src, limit=getattr(store.limits, kind))
    finally:
        src.close()


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a problem is: the file (an error's ``shard``) and the place inside it."""

    file: str
    inside: str = ""

    def sub(self, part: str) -> _Where:
        return _Where(self.file, f"{self.inside}{part}: ")

    def error(self, message: str) -> IndexFormatError:
        return IndexFormatError(f"{self.inside}{message}", shard=self.file)

    def untrusted(self, message: str) -> UntrustedLocationError:
        return UntrustedLocationError(f"{self.inside}{message}", shard=self.file)


def _parse_json(data: bytes | str, where: _Where) -> Any:
    try:
        return json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, over 4300 digits
        why = f"not valid JSON: {e}"
    except RecursionError:
        why = "not valid JSON: nested too deeply"
    head = data[:HEAD_BYTES]
    if is_index_head(head.encode("utf-8", "replace") if isinstance(head, str) else head, "json"):
        raise where.error(why)  # a damaged index: rebuilding it repairs it
    raise NotAnIndexError(f"{where.inside}{why}; not a wids or reference index", shard=where.file)


class _Loader:
    """Walks a description and its sub-datasets, accumulating shards and components."""

    def __init__(self, store: Store, allow_local: bool) -> None:
        self.store = store
        self.allow_local = allow_local
        self.shards: list[ShardInfo] = []
        self.extras: list[dict[str, Any]] = []
        self.origins: list[str | None] = []
        self.components: list[Component] = []
        self.visiting: list[str] = []
        self.loaded = 0

    def load_file(self, url: str, data: bytes | None = None) -> Any:
        where = _Where(redact_url(url))
        if url in self.visiting:
            raise where.error("source_url cycle: " + " -> ".join(self.visiting))
        if len(self.visiting) >= _MAX_DEPTH:
            raise where.error("source_url nesting too deep")
        self.loaded += 1
        if self.loaded > _MAX_FILES:
            raise where.error(f"more than {_MAX_FILES} descriptions loaded through source_url")
        return _parse_json(read_bytes(url, self.store) if data is None else data, where)

    def description(
        self,
        desc: Any,
        *,
        where: _Where,
        origin: str | None,
        base: str | None,
        name: str | None,
        weight: Any,
        top: bool,
        own_base: bool = True,
    ) -> None:
        """Add one description (a file or an inline entry) and, recursively, its datasets."""
        if top and not (isinstance(desc, dict) and _INDEX_KEYS & desc.keys()):
            got = "one without them" if isinstance(desc, dict) else f"a {type(desc).__name__}"
            raise NotAnIndexError(
                f"{where.inside}not a wids or reference index: expected a JSON object with any "
                f"of {', '.join(sorted(_INDEX_KEYS))}, got {got}",
                shard=where.file,
            )
        if not isinstance(desc, dict):
            raise where.error(f"expected a JSON object, got {type(desc).__name__}")
        _check_version(desc, where, required=top)
        if own_base and desc.get("base") is not None:
            if not isinstance(desc["base"], str):
                raise where.error("'base' must be a string")
            base = resolve_url(desc["base"], base)
        shardlist = desc.get("shardlist", [])
        datasets = desc.get("datasets", [])
        if not isinstance(shardlist, list):
            raise where.error("'shardlist' must be a list")
        if not isinstance(datasets, list):
            raise where.error("'datasets' must be a list")
        own_name = desc.get("name")
        label = name if name is not None else own_name
        first = len(self.shards)
        self.add_shards(shardlist, where=where, origin=origin, base=base)
        if len(self.shards) > first or not datasets:
            self.components.append(
                Component(_name(label, where), _weight(weight, where), first, len(self.shards))
            )
        for j, entry in enumerate(datasets):
            self.dataset(entry, where=where.sub(f"datasets[{j}]"), origin=origin, base=base)

    def dataset(self, entry: Any, *, where: _Where, origin: str | None, base: str | None) -> None:
        if not isinstance(entry, dict):
            raise where.error("expected a JSON object")
        weight = entry.get("weight")
        if "source_url" not in entry:
            self.description(
                entry, where=where, origin=origin, base=base, name=None, weight=weight, top=False
            )
            return
        ref = entry["source_url"]
        if not isinstance(ref, str) or not ref:
            raise where.error("'source_url' must be a non-empty string")
        url = resolve_url(ref, url_dir(origin) if origin else base)
        refused = check_remote_ref(url, origin, self.allow_local)
        if refused:
            raise where.untrusted(f"source_url {refused}")
        sub = self.load_file(url)
        sub_base = entry.get("base")
        if sub_base is not None and not isinstance(sub_base, str):
            raise where.error("'base' must be a string")
        self.visiting.append(url)
        try:
            self.description(
                sub,
                where=_Where(redact_url(url)),
                origin=url,
                base=resolve_url(sub_base, base) if sub_base else url_dir(url),
                name=entry.get("name"),
                weight=weight,
                top=False,
            )
        finally:
            self.visiting.pop()

    def add_shards(
        self, shardlist: list[Any], *, where: _Where, origin: str | None, base: str | None
    ) -> None:
        # The hot loop of opening a big index (100k shards): cheap checks, a plain string join
        # for plain relative URLs; the slow paths explain or resolve the unusual cases.
        root = _root(base)
        prefix = root.rstrip("/") + "/"
        shards, extras = self.shards, self.extras
        # URLs from a remote file must stay remote: the plain relative ones all start with
        # ``prefix`` (checked once), the rest are checked one by one.
        untrusted = check_remote_ref("file:///", origin, self.allow_local) is not None
        check_plain = untrusted and not is_remote_url(prefix)
        for k, entry in enumerate(shardlist):
            try:
                url, nsamples = entry["url"], entry["nsamples"]
                get = entry.get
                size, md5, etag, mtime = get("filesize"), get("md5sum"), get("etag"), get("mtime")
                # a compressed shard's samples are bounded by its tar's size, not the file's
                tar = get("tarsize", size)
            except (KeyError, TypeError, AttributeError):
                raise _bad_entry(entry, k, where) from None
            if not (
                type(url) is str
                and url
                and "\x00" not in url
                and type(nsamples) is int
                and 0 <= nsamples <= MAX_NSAMPLES
                and (size is None or (type(size) is int and 0 <= size < MAX_SHARD_SIZE))
                and (type(tar) is int and 0 <= tar < MAX_SHARD_SIZE if "tarsize" in entry else True)
                and (tar is None or nsamples <= tar // 512 - 1 or not nsamples)
                and (md5 is None or type(md5) is str)
                and (etag is None or type(etag) is str)
                and (mtime is None or (type(mtime) in (float, int) and _finite(mtime)))
            ):
                raise _bad_entry(entry, k, where)
            if _PLAIN_RELATIVE.match(url) and "/." not in url and "//" not in url:
                url = prefix + url
                check = check_plain
            else:
                url = resolve_url(url, root)
                check = untrusted
            if check:
                refused = check_remote_ref(url, origin, self.allow_local)
                if refused:
                    raise where.untrusted(f"shardlist[{k}]: url {refused}")
            if type(mtime) is int:
                mtime = float(mtime)
            shards.append(ShardInfo(url, nsamples, size, etag, mtime, md5))
            extras.append(entry)
        self.origins.extend([origin] * len(shardlist))


# A relative path whose join with a directory needs no normalising (no scheme, not absolute,
# no leading dot); "/." and "//" inside are checked separately.
_PLAIN_RELATIVE = re.compile(r"^[^/.~:][^:]*$")


def _root(base: str | None) -> str:
    """An absolute base directory: normalised local path, or URL as given."""
    if not base:
        return os.getcwd()
    if "://" in base or "::" in base:
        return base if not base.startswith("file://") else _root(base[len("file://") :])
    return os.path.abspath(os.path.expanduser(base))


def _bad_entry(entry: Any, k: int, where: _Where) -> IndexFormatError:
    """The error for a shard entry that failed the fast checks, saying what is wrong."""
    if not isinstance(entry, dict):
        return where.error(f"shardlist[{k}]: expected a JSON object")
    url, nsamples = entry.get("url"), entry.get("nsamples")
    if not isinstance(url, str) or not url:
        return where.error(f"shardlist[{k}]: 'url' missing or not a string")
    if "\x00" in url:
        return where.error(f"shardlist[{k}]: 'url' contains a NUL character")
    if type(nsamples) is not int or nsamples < 0:
        return where.error(
            f"shardlist[{k}]: 'nsamples' missing or not a non-negative integer ({nsamples!r})"
        )
    types = {
        "filesize": (int,),
        "tarsize": (int,),
        "md5sum": (str,),
        "etag": (str,),
        "mtime": (int, float),
    }
    for key, allowed in types.items():
        value = entry.get(key)
        if value is not None and (
            type(value) not in allowed
            or (key in ("filesize", "tarsize") and not 0 <= value < MAX_SHARD_SIZE)
            or (key == "mtime" and not _finite(value))
        ):
            return where.error(f"shardlist[{k}]: bad {key} {_short(value)}")
    size = entry.get("tarsize", entry.get("filesize"))
    if nsamples > max_samples(size):
        return where.error(
            f"shardlist[{k}]: 'nsamples' {nsamples} is more than a "
            + (f"{size}-byte tar can hold" if size is not None else "shard can hold")
            + f" (at most {max_samples(size)})"
        )
    return where.error(f"shardlist[{k}]: malformed entry")


def _finite(value: float) -> bool:
    return -MAX_SHARD_SIZE < value < MAX_SHARD_SIZE  # false for nan and the infinities JSON allows


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_version(desc: dict[str, Any], where: _Where, *, required: bool) -> None:
    kind = desc.get("__kind__")
    if kind is not None and kind != KIND:
        raise where.error(f"__kind__ is {kind!r}, expected {KIND!r}")
    version = desc.get("wids_version")
    if version is None and not required:
        return
    if version != 1 or type(version) is not int:
        what = "missing" if version is None else f"{version!r}, expected 1"
        raise where.error(f"wids_version {what}")


def _name(value: Any, where: _Where) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise where.error(f"'name' must be a string, got {value!r}")
    return value


def _weight(value: Any, where: _Where) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value < MAX_SHARD_SIZE:
        raise where.error(f"'weight' must be a non-negative number, got {_short(value)}")
    return float(value)


def load_spec(
    src: str | os.PathLike[str] | io.IOBase | Sequence[Mapping[str, Any]] | Mapping[str, Any],
    *,
    storage_options: Mapping[str, Any] | Store | None = None,
    base: str | None = None,
    url_map: Mapping[str, str] | UrlMap | None = None,
    allow_local_shards: bool = False,
    data: bytes | None = None,
) -> Spec:
    """Load and validate a dataset description.

    Args:
        src: A path or URL of a description, an open text (or binary) stream of one, a parsed
            description (a dict), or a list of ``{"url", "nsamples", ...}`` shard dicts.
        storage_options: fsspec options for reading remote descriptions.
        base: Directory against which relative shard URLs resolve; overrides the file's own
            ``base`` and its directory.
        url_map: Prefix rewrites applied to resolved shard URLs (see :func:`check_url_map`).
        allow_local_shards: Let a description read from a remote location name local files
            (shards, ``source_url``); refused by default (see :func:`check_remote_ref`).
        data: The bytes of the file ``src`` names, already read (then it is not read again).

    Returns:
        The description, shard URLs resolved.

    Raises:
        IndexFormatError: The description is malformed; the message names the file and what
            is wrong.
        ShardNotFoundError: The file (or a ``source_url``) does not exist.
    """
    mapping = check_url_map(url_map)
    # a spec given in Python names its URLs; a spec file names only itself
    loader = _Loader(Store.of(storage_options, named=named_by(src, url_map)), allow_local_shards)
    url: str | None = None
    if isinstance(src, (str, os.PathLike)):
        url = os.fspath(src)
        desc = loader.load_file(url, data)
        where, origin, default_base = _Where(redact_url(url)), url, url_dir(url)
    elif hasattr(src, "read"):
        desc = _parse_json(src.read(), _Where("<stream>"))
        where, origin, default_base = _Where("<stream>"), None, None
    elif isinstance(src, Mapping):
        desc = dict(src)
        where, origin, default_base = _Where("<dict>"), None, None
    elif isinstance(src, Sequence):
        desc = {"wids_version": 1, "shardlist": list(src)}
        where, origin, default_base = _Where("<list>"), None, None
    else:
        raise TypeError(f"cannot load a description from {type(src).__name__}")
    if url is not None:
        loader.visiting.append(url)
    loader.description(
        desc,
        where=where,
        origin=origin,
        base=base if base is not None else default_base,
        name=None,
        weight=desc.get("weight") if isinstance(desc, dict) else None,
        top=True,
        own_base=base is None,
    )
    top = {k: v for k, v in desc.items() if k not in ("shardlist", "datasets")}
    return Spec(
        name=_name(desc.get("name"), where),
        shards=apply_url_map(loader.shards, mapping),
        components=loader.components,
        extras=loader.extras,
        origins=loader.origins,
        top=top,
        url=url,
    )
