"""Framework wrappers that would split a rank's share of the epoch across the ranks again.

A per-rank sampler cannot see who iterates it, except through the call stack: the wrapper's
generator is a few frames above the sampler's ``__iter__``. Looking there once per epoch is
cheap, imports nothing (a wrapper's module is consulted only if it is already imported), and
turns a silent loss of samples into an error that says what to do.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from ..errors import SamplerWrappedError

__all__: list[str] = []

# Frames between a wrapper and the sampler's __iter__: torch's BatchSampler generator, the
# wrapper's own generator, a DataLoader iterator or two; deep enough, never the whole stack.
_DEPTH = 8

# (module, class, attribute with the number of processes it splits over): wrappers that keep
# only this process's share of the batches their inner batch sampler yields.
_RESPLITTERS = (("accelerate.data_loader", "BatchSamplerShard", "num_processes"),)

_ADVICE = (
    "Either keep the DataLoader out of accelerator.prepare() (prepare the model and optimizer, "
    "move batches with .to(accelerator.device), call sampler.set_epoch(epoch) each epoch), or "
    "give Accelerate one order for all ranks to split: ChunkedSampler(dataset, "
    "num_workers=accelerator.num_processes * max(1, loader_workers), batch_size=batch_size). "
    "See docs/frameworks.md."
)


def _resplitter(frame: FrameType | None) -> tuple[str, int] | None:
    """The first known re-splitting wrapper among the ``_DEPTH`` frames from ``frame`` up."""
    classes = []
    for module, name, attribute in _RESPLITTERS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            classes.append((cls, attribute))
    for _ in range(_DEPTH if classes else 0):
        if frame is None:
            break
        owner: Any = frame.f_locals.get("self")
        for cls, attribute in classes:
            if isinstance(owner, cls):
                return f"{cls.__module__}.{cls.__name__}", int(getattr(owner, attribute, 1))
        frame = frame.f_back
    return None


def refuse_resplit(sampler: Any) -> None:
    """Raise if a framework wrapper is about to keep only part of ``sampler``'s indices.

    Call it from the sampler's ``__iter__``.

    Raises:
        SamplerWrappedError: If a known wrapper splits over more than one process.
    """
    found = _resplitter(sys._getframe(2))
    if found is None or found[1] <= 1:
        return
    wrapper, processes = found
    raise SamplerWrappedError(
        f"{type(sampler).__name__} already gives rank {sampler.rank} of {sampler.num_replicas} "
        f"its own share of the epoch, but {wrapper} (from accelerator.prepare(dataloader)) keeps "
        f"only every {processes}th batch of that share: {processes - 1} of every {processes} "
        f"samples would never be seen. {_ADVICE}"
    )
