"""Shards: one corpus split into parts, each part's index served on its own (`ragrl serve`), searched
as one. A query goes to every shard at once and their top-k lists are merged by score.

    retriever = make_retriever("http://host1:8001|http://host2:8002,http://host2b:8002")

Parts are separated by `|`; within a part, commas name replicas of that shard (`RetrievalClient`), so
a shard whose replica goes away keeps answering through the other. A shard with no replica answering
is waited for by the client's rules and then raises: a search never returns a top-k with a part of the
corpus silently missing.

The shards must be of one kind and encoder (their /health manifests say so), hold different corpora,
and never return the same passage id: scores are merged as they come, which is exact for dense inner
product or L2. BM25 shards score with their own part's document frequencies, as a sharded search
engine does by default (Lucene, Elasticsearch): the merge is then close to, not equal to, one index
over the whole corpus.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, Retriever

SHARD_SEPARATOR = "|"


def merge_top_k(lists: list[list[Hit]], k: int) -> list[Hit]:
    """The k best hits of several shards' lists for one query, by descending score (ties keep shard
    order). A passage id in two shards' lists means the shards overlap: refused.

    >>> a = [Hit("p1", "A", "a", 0.9), Hit("p2", "B", "b", 0.4)]
    >>> b = [Hit("q1", "C", "c", 0.7), Hit("q2", "D", "d", 0.4)]
    >>> [h.id for h in merge_top_k([a, b], 3)]
    ['p1', 'q1', 'p2']
    >>> merge_top_k([a, [Hit("p1", "A", "a", 0.9)]], 2)
    Traceback (most recent call last):
    ...
    ragrl.errors.RagrlError: passage 'p1' came from two shards: shards must hold disjoint parts of the corpus
    """
    seen: set[str] = set()
    for hits in lists:
        for h in hits:
            if h.id in seen:
                raise RagrlError(f"passage {h.id!r} came from two shards: shards must hold disjoint parts of the corpus")
            seen.add(h.id)
    return sorted((h for hits in lists for h in hits), key=lambda h: -h.score)[:k]


def check_shards(healths: dict[str, dict]) -> None:
    """Shards (name -> /health body) must serve one kind of index with one encoder, over different corpora.

    >>> part = lambda sha, kind="dense": {"index": {"kind": kind, "encoder": "e5", "corpus_sha256": sha}}
    >>> check_shards({"a": part("1"), "b": part("2")})
    >>> check_shards({"a": part("1"), "b": part("1")})
    Traceback (most recent call last):
    ...
    ragrl.errors.RagrlError: shards a and b serve the same corpus (sha256 1): name each part of the corpus once
    >>> check_shards({"a": part("1"), "b": part("2", "bm25")})
    Traceback (most recent call last):
    ...
    ragrl.errors.RagrlError: shards a and b are different kinds of index (their kind differs): their scores cannot be merged
    """
    first = next(iter(healths))
    ref = healths[first].get("index") or {}
    corpora = {ref.get("corpus_sha256"): first}
    for name, health in list(healths.items())[1:]:
        index = health.get("index") or {}
        differ = [key for key in ("kind", "encoder") if index.get(key) != ref.get(key)]
        if differ:
            raise RagrlError(f"shards {first} and {name} are different kinds of index (their {' and '.join(differ)} "
                             f"differ{'s' if len(differ) == 1 else ''}): their scores cannot be merged")
        sha = index.get("corpus_sha256")
        if sha is not None and sha in corpora:
            raise RagrlError(f"shards {corpora[sha]} and {name} serve the same corpus (sha256 {sha}): name each "
                             "part of the corpus once")
        corpora[sha] = name


class ShardedRetriever:
    """Every shard searched at once for each batch of queries; per query, the merged top k."""

    def __init__(self, shards: list[Retriever], names: list[str] | None = None):
        if len(shards) < 2:
            raise RagrlError(f"a sharded retriever needs at least two shards, got {len(shards)}")
        self.shards = shards
        self.names = names or [f"shard {i}" for i in range(len(shards))]
        # Threads: each shard's call is mostly waiting on its server, so a batch costs the slowest
        # shard's time, not the sum.
        self._pool = ThreadPoolExecutor(len(shards), thread_name_prefix="ragrl-shard")
        self._checked = False

    def _check(self) -> None:
        healths = {name: shard.health() for name, shard in zip(self.names, self.shards) if hasattr(shard, "health")}
        if len(healths) == len(self.shards):
            check_shards(healths)
        self._checked = True

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not self._checked:
            self._check()
        results = list(self._pool.map(lambda shard: shard.search(queries, k), self.shards))
        return [merge_top_k([found[i] for found in results], k) for i in range(len(queries))]

    def close(self) -> None:
        """Stop the shard threads and close each shard's connections."""
        self._pool.shutdown(wait=False)
        for shard in self.shards:
            if hasattr(shard, "close"):
                shard.close()
