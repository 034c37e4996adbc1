"""The one retrieval interface every part of ragrl talks to."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    id: str
    title: str
    text: str
    score: float

    @property
    def contents(self) -> str:
        """Search-R1's document `contents` field: quoted title, newline, text."""
        return f'"{self.title}"\n{self.text}'

    @property
    def full_text(self) -> str:
        """Title and text, as an answer is looked for in a passage (answer@shown, the search rewards)."""
        return f"{self.title} {self.text}".strip()

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers a batch of queries with k hits each.

    Implemented by the in-process indexes (BM25, dense, hybrid) and by the HTTP
    `RetrievalClient`, so rollouts can use either without knowing which.
    """

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Return, for each query in order, its top-k hits sorted by descending score."""
        ...


@runtime_checkable
class DocumentSampler(Protocol):
    """A retriever that is the policy (HARR): it *draws* each query's documents, and records the
    draw as a retrieval action that the update can score."""

    def sample(self, requests: list, k: int, generator=None) -> list[tuple[list[Hit], object]]:
        """For each request, (the drawn hits, the retrieval action or None)."""
        ...


@runtime_checkable
class TitleLister(Protocol):
    """A retriever that can list its corpus's passage titles, row by row (an in-process index):
    what `rollout.second_query: title` constrains a query to."""

    def corpus_titles(self) -> Sequence[str]:
        """Every passage's title, in corpus order (repeats included)."""
        ...

    def corpus_texts(self) -> Sequence[str]:
        """Every passage's text, in the same order (`rollout.title_notes` reads a title's first)."""
        ...
