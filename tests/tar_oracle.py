"""What Python's ``tarfile`` says the samples of a shard are: the oracle for dataset tests."""

from __future__ import annotations

import tarfile
from typing import Any


def tar_samples(path: str) -> list[dict[str, Any]]:
    """Samples of a local shard as raw dicts (``__key__`` and ``.field -> bytes``), in order."""
    out: list[dict[str, Any]] = []
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isreg():
                continue
            slash = m.name.rfind("/")
            dot = m.name.find(".", slash + 1)
            if dot <= slash + 1:
                continue
            key, field = m.name[:dot], m.name[dot:]
            f = tf.extractfile(m)
            assert f is not None
            data = f.read()
            if not out or out[-1]["__key__"] != key:
                out.append({"__key__": key})
            out[-1][field] = data
    return out


def dataset_samples(paths: list[str]) -> list[dict[str, Any]]:
    """All samples of several shards, in dataset order."""
    return [s for p in paths for s in tar_samples(p)]


def strip_meta(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample without the dataset's bookkeeping keys (``__index__`` ...), ``__key__`` kept."""
    return {k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}
