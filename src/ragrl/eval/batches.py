"""The one loop that takes questions in batches (evaluation, comparison, retrieval, the quickstart)."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

Item = TypeVar("Item")
Out = TypeVar("Out")

# Questions per call of a retriever's `search` where nothing else sets it: large enough that a
# dense index embeds them in one batch, small enough that a slow server answers within its timeout.
SEARCH_BATCH = 64


class BatchStore(Protocol):
    """Where a long loop keeps each finished slice, so that a killed run resumes from the last one."""

    def get(self, start: int, stop: int) -> list | None:
        """The outputs kept for items[start:stop], or None to compute them."""

    def put(self, start: int, stop: int, outs: list, wall_s: float) -> None:
        """Keep the outputs of items[start:stop], computed in `wall_s` seconds."""


def in_batches(items: Sequence[Item], batch_size: int, fn: Callable[[Sequence[Item]], list[Out]], *,
               progress: Callable[[int, int], None] | None = None, store: BatchStore | None = None) -> list[Out]:
    """`fn` over consecutive slices of `batch_size` items, its results joined in order;
    `progress(done, total)` after each slice. With a `store`, a slice it already holds is taken from
    it and each slice computed is put into it.

    >>> in_batches(list(range(5)), 2, lambda b: [x * 10 for x in b], progress=lambda d, n: print(d, n))
    2 5
    4 5
    5 5
    [0, 10, 20, 30, 40]
    >>> class Kept(dict):
    ...     def get(self, start, stop): return super().get((start, stop))
    ...     def put(self, start, stop, outs, wall_s): self[start, stop] = outs
    >>> kept = Kept({(0, 2): [-1, -1]})
    >>> in_batches(list(range(5)), 2, lambda b: [x * 10 for x in b], store=kept)
    [-1, -1, 20, 30, 40]
    >>> sorted(kept)
    [(0, 2), (2, 4), (4, 5)]
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out: list[Out] = []
    for start in range(0, len(items), batch_size):
        stop = min(start + batch_size, len(items))
        kept = store.get(start, stop) if store is not None else None
        if kept is None:
            t0 = time.perf_counter()
            kept = fn(items[start:stop])
            if store is not None:
                store.put(start, stop, kept, time.perf_counter() - t0)
        out += kept
        if progress is not None:
            progress(stop, len(items))
    return out
