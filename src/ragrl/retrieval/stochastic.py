"""The retriever as a stochastic policy (HARR): Plackett–Luce sampling over a dense candidate pool.

Deterministic top-k becomes a draw: the current query encoder embeds the query text, faiss
returns a pool of M candidates, and k of them are sampled without replacement from
softmax(score / T). The draw is recorded as a `RetrievalAction` (query text, candidate rows,
sampled positions, log-prob), which is all the trainer needs to recompute the log-prob with
gradients later. Passage vectors are the index's and never change.

`search(queries, k)` is the deterministic mode (evaluation): exactly faiss top-k with the
current encoder. This module knows nothing about training.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ragrl.algos.plackett_luce import pl_log_prob, pl_sample
from ragrl.errors import ConfigError, RagrlError
from ragrl.retrieval.base import Hit


@dataclass
class RetrievalAction:
    """One sampled retrieval: what the trainer needs to score it again, with gradients."""

    query_text: str                 # the exact text the encoder embedded (history included)
    candidate_rows: list[int]       # the pool: corpus rows, in faiss order
    sampled: list[int]              # positions into candidate_rows, in draw order
    logprob: float                  # Plackett–Luce log-prob of the ordered draw at sampling time
    temperature: float
    candidate_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class QueryRequest:
    """A search to serve: the episode's question, its earlier searches, and this query."""

    question: str
    query: str
    history: list[dict] = field(default_factory=list)   # [{"sub_query", "status", "answer"}, ...]
    exclude: list[int] = field(default_factory=list)    # corpus rows not to return (found by earlier hops)


def found_entry(query: str, hits: list[Hit], words: int = 20) -> dict:
    """HARR's history entry for a search that had no generator to state an answer: what it found,
    each passage's title and its first `words` words (where a next hop's entity is usually named).

    >>> found_entry("Who wrote Jaws?", [Hit("p1", "Jaws (novel)", "Jaws is a 1974 novel by Peter Benchley. It tells", 0.9)], 8)
    {'sub_query': 'Who wrote Jaws?', 'status': 'retrieved', 'answer': 'Jaws (novel): Jaws is a 1974 novel by Peter Benchley.'}
    """
    found = "; ".join(f"{h.title}: {' '.join(h.text.split()[:words])}" for h in hits)
    return {"sub_query": query, "status": "retrieved" if hits else "no result", "answer": found}


def query_text(req: QueryRequest, *, history: bool = True, instruction: str = "") -> str:
    """The text the query encoder embeds.

    With history (HARR), a follow-up search carries the original question and what earlier
    searches found, so two episodes that issue the same sub-query in different states embed
    differently. A first search whose query *is* the question has nothing to add and embeds as
    the plain question, so an untrained encoder starts from ordinary dense retrieval. A later hop
    without a generator (its query is the question again) has no sub-queries to list: it embeds
    the question and what the earlier hops found, compactly (every token of it is re-encoded with
    gradients in the update, once per distinct history).

    >>> query_text(QueryRequest("Who wrote Jaws?", "Who wrote Jaws?"))
    'Who wrote Jaws?'
    >>> print(query_text(QueryRequest("Q?", "Benchley", [{"sub_query": "Jaws author", "status": "retrieved", "answer": "Peter Benchley"}])))
    Original Question: Q?
    History: [{"sub_query": "Jaws author", "status": "retrieved", "answer": "Peter Benchley"}]
    Query: Benchley
    >>> print(query_text(QueryRequest("Q?", "Q?", [{"sub_query": "Q?", "status": "retrieved", "answer": "Jaws: a novel"}])))
    Q?
    Found: Jaws: a novel
    >>> query_text(QueryRequest("Q?", "Benchley", [{"sub_query": "x", "status": "retrieved", "answer": "y"}]), history=False)
    'Benchley'
    """
    same = req.query.strip() == req.question.strip()
    if not history or (same and not req.history):
        text = req.query
    elif same:
        text = f"{req.question}\nFound: " + " | ".join(h["answer"] for h in req.history)
    else:
        text = (f"Original Question: {req.question}\nHistory: {json.dumps(req.history, ensure_ascii=False)}\n"
                f"Query: {req.query}")
    return f"{instruction}{text}" if instruction else text


class StochasticRetriever:
    """Sample k of a dense pool by Plackett–Luce, with the (trainable) query encoder.

    index: a loaded `DenseIndex` (its `embeddings` [rows, dim] and faiss `index`);
    encoder: anything with `encode(texts) -> np.ndarray [n, dim]` (a `QueryEncoder`).
    """

    def __init__(self, index, encoder, *, pool: int = 30, temperature: float = 0.05,
                 history: bool = True, instruction: str = "", history_words: int = 8):
        if pool < 1:
            raise ConfigError(f"retriever.pool must be >= 1, got {pool}")
        if not temperature > 0:
            raise ConfigError(f"retriever.temperature must be > 0, got {temperature}")
        self.index, self.encoder = index, encoder
        self.pool, self.temperature = min(int(pool), len(index)), float(temperature)
        self.history, self.instruction, self.history_words = history, instruction, int(history_words)
        self.embeddings = torch.from_numpy(np.ascontiguousarray(index.embeddings, dtype=np.float32))

    def __len__(self) -> int:
        return len(self.index)

    def text(self, req: QueryRequest) -> str:
        return query_text(req, history=self.history, instruction=self.instruction)

    def _vectors(self, texts: list[str]) -> np.ndarray:
        return np.ascontiguousarray(self.encoder.encode(list(texts)), dtype=np.float32)

    def search_hops(self, questions: list[str], k: int, hops: int) -> list[list[Hit]]:
        """Deterministic multi-hop retrieval without a generator: hop 1 is `search`; each later hop
        embeds the question with the history of what earlier hops found and takes the top k of
        the passages not found yet. Returns the hops' hits in order (k · hops per question)."""
        out: list[list[Hit]] = [[] for _ in questions]
        history: list[list[dict]] = [[] for _ in questions]
        for _ in range(hops):
            reqs = [QueryRequest(q, q, list(h), [self.index.corpus.row(x.id) for x in o])
                    for q, h, o in zip(questions, history, out)]
            for i, hits in enumerate(self._top(reqs, k)):
                out[i] += hits
                history[i].append(found_entry(questions[i], hits, self.history_words))
        return out

    def searcher(self, hops: int = 1):
        """`search(queries, k)` for `hops` hops: plain top k, or `search_hops` (k per hop)."""
        return self.search if hops == 1 else (lambda queries, k: self.search_hops(queries, k, hops))

    def _top(self, requests: list[QueryRequest], k: int) -> list[list[Hit]]:
        texts = [self.text(r) for r in requests]
        extra = max((len(r.exclude) for r in requests), default=0)
        scores, rows = self.index.nearest_rows(self._vectors(texts), min(k + extra, len(self)))
        corpus, out = self.index.corpus, []
        for r, srow, rrow in zip(requests, scores, rows):
            banned = set(r.exclude)
            out.append([corpus.hit(int(i), float(sc)) for sc, i in zip(srow, rrow) if i >= 0 and i not in banned][:k])
        return out

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Deterministic mode: faiss top-k for the current encoder (blank queries get no hits)."""
        todo = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        out: list[list[Hit]] = [[] for _ in queries]
        if todo:
            hits = self.index.search_vectors(self._vectors([queries[i] for i in todo]), min(int(k), len(self)))
            for i, h in zip(todo, hits):
                out[i] = h
        return out

    def sample(self, requests: list[QueryRequest], k: int,
               generator: torch.Generator | None = None) -> list[tuple[list[Hit], RetrievalAction | None]]:
        """Per request: the k sampled hits (draw order) and the action; a blank query gets
        ([], None): no passages, and nothing for the policy to be credited with."""
        out: list[tuple[list[Hit], RetrievalAction | None]] = [([], None) for _ in requests]
        todo = [i for i, r in enumerate(requests) if r.query.strip()]
        if not todo:
            return out
        texts = [self.text(requests[i]) for i in todo]
        # A GRPO group asks the same text n times: embed and search each distinct text once.
        slot = {t: i for i, t in enumerate(dict.fromkeys(texts))}
        where = np.array([slot[t] for t in texts])
        uniq_vectors = self._vectors(list(slot))
        # Rows found by earlier hops are left out of the pool (then cut back to `pool`), so every
        # pool has the same size and the trainer rescoring `candidate_rows` sees exactly this pool.
        extra = max(len(requests[i].exclude) for i in todo)
        pool = min(self.pool, len(self) - extra)
        _, uniq_rows = self.index.nearest_rows(uniq_vectors, pool + extra)
        vectors, rows = uniq_vectors[where], uniq_rows[where]                  # [n, d], [n, M + extra]
        if extra:
            banned = [set(requests[i].exclude) for i in todo]
            rows = np.stack([[r for r in row if r not in b][:pool] for b, row in zip(banned, rows)])
        rows = rows[:, :pool]
        if (rows < 0).any():   # an IVF index visiting few cells, or HNSW, found fewer than the pool
            raise RagrlError(f"the dense index found fewer than retriever.pool={pool} candidates for a "
                             "query; lower retriever.pool, or rebuild the index with a larger nprobe")
        rows_t = torch.from_numpy(rows.astype(np.int64))
        # Scores recomputed the way the trainer will (q · e in float32), not faiss's own.
        scores = torch.einsum("nd,nmd->nm", torch.from_numpy(vectors), self.embeddings[rows_t])
        picks = pl_sample(scores, min(int(k), pool), generator=generator, temperature=self.temperature)
        logps = pl_log_prob(scores, picks, self.temperature)
        corpus = self.index.corpus
        for j, i in enumerate(todo):
            cand = rows[j].tolist()
            chosen = picks[j].tolist()
            hits = [corpus.hit(cand[p], float(scores[j, p])) for p in chosen]
            out[i] = (hits, RetrievalAction(texts[j], cand, chosen, float(logps[j]), self.temperature,
                                            [corpus.ids[r] for r in cand]))
        return out


def history_retriever(dense, encoder, settings) -> StochasticRetriever:
    """`encoder` over the dense index `dense` with a retriever run's history settings
    (`settings.history`, `settings.history_words`, `settings.instruction`: its `retriever:` section,
    as its sampler reads them), for deterministic top-k search."""
    return StochasticRetriever(dense, encoder, history=settings.history, instruction=settings.instruction,
                               history_words=settings.history_words)


def multi_hop_searcher(dense, encoder, settings):
    """search(questions, k) as a retriever run searches: `settings.hops` hops of k, later hops with
    the history of earlier ones (`history_retriever`)."""
    return history_retriever(dense, encoder, settings).searcher(settings.hops)
