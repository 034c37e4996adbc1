"""In-process retrieval with the same rules as the HTTP path, and `make_retriever(spec)`.

Rollouts must not behave differently because the index happens to be local or behind
`ragrl serve`. Both `InProcessRetriever` and `RetrievalClient` pass queries through
`search_in_chunks`, which applies the rules a policy's free-form queries need:
- a blank query (`<search></search>`) gets no hits instead of an error or arbitrary passages;
- a query longer than max_query_chars is cut to that length (the server would refuse it);
- k must be in 1..max_topk, else a RagrlError (the server would answer 422);
- at most max_queries_per_request queries go to the index (or over the wire) at once.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, Retriever
from ragrl.retrieval.settings import ServerSettings

SearchFn = Callable[[list[str], int], list[list[Hit]]]


def check_k(k, max_topk: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RagrlError(f"k must be a positive integer, got {k!r}")
    if k > max_topk:
        raise RagrlError(f"k={k} is larger than max_topk={max_topk}")
    return k


def prepare_query(query, max_chars: int) -> str | None:
    """The query to send (truncated, valid UTF-8), or None for a blank one."""
    if not isinstance(query, str):
        raise RagrlError(f"a query must be a string, got {type(query).__name__}")
    if not query.strip():
        return None
    query = query[:max_chars]
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a bad decode: make them visible, not fatal
        query = query.encode("utf-8", "replace").decode("utf-8")
    return query


def as_query_list(queries) -> list:
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
        raise RagrlError(f"queries must be a list of strings, got {type(queries).__name__}")
    return list(queries)


def search_in_chunks(
    search: SearchFn, queries: list[str], k: int, max_query_chars: int, chunk_size: int
) -> list[list[Hit]]:
    """Apply the shared query rules, call `search` on chunks of non-blank queries, reassemble."""
    prepared = [prepare_query(q, max_query_chars) for q in as_query_list(queries)]
    todo = [i for i, q in enumerate(prepared) if q is not None]
    results: list[list[Hit]] = [[] for _ in prepared]
    for start in range(0, len(todo), chunk_size):
        rows = todo[start : start + chunk_size]
        hits = search([prepared[i] for i in rows], k)
        if len(hits) != len(rows):
            raise RagrlError(f"retriever returned {len(hits)} hit lists for {len(rows)} queries")
        for i, h in zip(rows, hits):
            results[i] = list(h)
    return results


class InProcessRetriever:
    """Wraps a loaded index (`SearchIndex`) with the same query rules as the HTTP client."""

    def __init__(self, index: Retriever, settings: ServerSettings | None = None):
        self.index = index
        self.settings = settings or ServerSettings()
        self.manifest = getattr(index, "manifest", {})

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        s = self.settings
        k = check_k(k, s.max_topk)
        return search_in_chunks(self.index.search, queries, k, s.max_query_chars, s.max_queries_per_request)

    def __len__(self) -> int:
        return len(self.index)  # type: ignore[arg-type]

    def corpus_titles(self) -> Sequence[str]:
        """The corpus's titles, row by row (`TitleLister`); refused for an index without a corpus."""
        return self._corpus("titles").titles

    def corpus_texts(self) -> Sequence[str]:
        """The corpus's texts, row by row (`TitleLister`; a corpus on disk reads a row when asked)."""
        return self._corpus("texts").texts

    def _corpus(self, what: str):
        corpus = getattr(self.index, "corpus", None)
        if corpus is None:
            raise RagrlError(f"index {type(self.index).__name__} has no corpus whose {what} could be listed")
        return corpus

    def close(self) -> None:
        pass
