"""Worker-aware ordering: each DataLoader worker reads its own chunks."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator

__all__: list[str] = []


def _interleave(pieces: Iterable[list[int]], num_workers: int, batch_size: int) -> Iterator[int]:
    """Order indices so that batch ``k`` comes from chunks given to worker ``k % num_workers``.

    A DataLoader sends batch ``k`` to worker ``k % num_workers``. Each chunk goes to the worker
    with the fewest samples so far; a worker whose chunks run out borrows from the fullest.
    Chunks are assigned as the workers need them, so only the chunks handed out but not yet
    consumed are held (about one per worker), not the epoch.
    """
    source = iter(pieces)
    queues: list[collections.deque[list[int]]] = [collections.deque() for _ in range(num_workers)]
    heads = [0] * num_workers  # position inside each queue's first piece
    assigned, taken = [0] * num_workers, [0] * num_workers
    exhausted = False

    def refill(w: int) -> None:
        nonlocal exhausted
        while taken[w] == assigned[w] and not exhausted:
            piece = next(source, None)
            if piece is None:
                exhausted = True
                return
            j = min(range(num_workers), key=assigned.__getitem__)
            queues[j].append(piece)
            assigned[j] += len(piece)

    def take(w: int, need: int) -> list[int]:
        out: list[int] = []
        queue = queues[w]
        while need and queue:
            piece, pos = queue[0], heads[w]
            part = piece[pos : pos + need]
            out += part
            need -= len(part)
            if pos + len(part) >= len(piece):
                queue.popleft()
                heads[w] = 0
            else:
                heads[w] = pos + len(part)
        taken[w] += len(out)
        return out

    for k in itertools.count():
        w = k % num_workers
        need = batch_size
        while need:
            refill(w)
            if taken[w] == assigned[w]:  # this worker's chunks are used up: borrow
                w = max(range(num_workers), key=lambda j: assigned[j] - taken[j])
                if taken[w] == assigned[w]:
                    break
            part = take(w, need)
            need -= len(part)
            yield from part
        if need == batch_size:  # nothing left anywhere
            return
