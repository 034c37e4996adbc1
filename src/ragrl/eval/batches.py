"""The one loop that takes questions in batches (evaluation, comparison, retrieval, the quickstart)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Item = TypeVar("Item")
Out = TypeVar("Out")

# Questions per call of a retriever's `search` where nothing else sets it: large enough that a
# dense index embeds them in one batch, small enough that a slow server answers within its timeout.
SEARCH_BATCH = 64


def in_batches(items: Sequence[Item], batch_size: int, fn: Callable[[Sequence[Item]], list[Out]], *,
               progress: Callable[[int, int], None] | None = None) -> list[Out]:
    """`fn` over consecutive slices of `batch_size` items, its results joined in order;
    `progress(done, total)` after each slice.

    >>> in_batches(list(range(5)), 2, lambda b: [x * 10 for x in b], progress=lambda d, n: print(d, n))
    2 5
    4 5
    5 5
    [0, 10, 20, 30, 40]
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out: list[Out] = []
    for start in range(0, len(items), batch_size):
        out += fn(items[start:start + batch_size])
        if progress is not None:
            progress(min(start + batch_size, len(items)), len(items))
    return out
