"""Framework wrappers that would split a rank's share of the epoch across the ranks again.

HF Accelerate's ``accelerator.prepare(loader)`` splits a loader's batches across its
processes (``BatchSamplerShard`` keeps every ``num_processes``-th batch; with
``dispatch_batches`` the first process reads and hands out slices). Over a per-rank sampler
that has already split the epoch, that silently drops ``(R - 1) / R`` of it. The check uses
Accelerate's public API only: while a prepared loader is iterated, Accelerate names it
``GradientState().active_dataloader`` (it does so before it starts the loader underneath,
hence before the sampler's ``iter()``), and a prepared loader's ``batch_sampler`` / ``sampler``
attributes lead to the sampler it wraps. Accelerate is consulted only when it is already
imported and its state initialised (an ``Accelerator`` exists). If a running multi-process
Accelerate does not say which loader is active, iteration fails with the same error rather
than risk the loss.
"""

from __future__ import annotations

import sys
from typing import Any

from ..errors import SamplerWrappedError

__all__: list[str] = []

_ADVICE = (
    "Either keep the DataLoader out of accelerator.prepare() (prepare the model and optimizer, "
    "move batches with .to(accelerator.device), call sampler.set_epoch(epoch) each epoch), or "
    "give Accelerate one order for all ranks to split: ChunkedSampler(dataset, "
    "num_workers=accelerator.num_processes, batch_size=batch_size). See docs/frameworks.md."
)
_MISSING = object()


def _holds(loader: Any, sampler: Any) -> bool:
    """Whether ``sampler`` is what ``loader`` draws its indices from (public attributes)."""
    seen: list[Any] = [loader]
    for _ in range(4):  # loader -> batch sampler (-> the wrapped one) -> sampler
        nxt = []
        for obj in seen:
            for name in ("batch_sampler", "sampler"):
                inner = getattr(obj, name, None)
                if inner is sampler:
                    return True
                if inner is not None and inner is not obj:
                    nxt.append(inner)
        seen = nxt
    return False


def _accelerate_processes() -> int:
    """Processes of a running Accelerate (its public state), 1 if none or not imported."""
    state_module = sys.modules.get("accelerate.state")
    if state_module is None or not state_module.is_initialized():
        return 1
    return int(state_module.AcceleratorState().num_processes)


def refuse_resplit(sampler: Any) -> None:
    """Raise if a framework is about to keep only part of ``sampler``'s indices.

    Call it from the sampler's ``__iter__``.

    Raises:
        SamplerWrappedError: If the loader Accelerate is iterating across several processes
            draws from ``sampler``, or if a running multi-process Accelerate does not say
            which loader it is iterating.
    """
    if sampler.num_replicas <= 1:
        return
    processes = _accelerate_processes()
    if processes <= 1:
        return
    state = sys.modules["accelerate.state"].GradientState()
    active = getattr(state, "active_dataloader", _MISSING)
    if active is _MISSING:
        raise SamplerWrappedError(
            f"{type(sampler).__name__} splits the epoch over {sampler.num_replicas} ranks, and "
            f"Accelerate runs {processes} processes but does not say which DataLoader it is "
            "iterating (GradientState().active_dataloader): a prepared loader would keep only "
            f"every {processes}th batch of this rank's share. {_ADVICE}"
        )
    if active is None or not _holds(active, sampler):
        return
    wrapper = type(getattr(active, "batch_sampler", None) or active).__name__
    raise SamplerWrappedError(
        f"{type(sampler).__name__} already gives rank {sampler.rank} of {sampler.num_replicas} "
        f"its own share of the epoch, but {type(active).__name__} with its {wrapper} (from "
        f"accelerator.prepare(dataloader)) keeps only every {processes}th batch of that share: "
        f"{processes - 1} of every {processes} samples would never be seen. {_ADVICE}"
    )
