"""RAG-R1 protocol: Search-R1's tags, but one <search> may hold several queries run in parallel.

Queries inside one <search> block are separated by ';' or newlines (a JSON list of strings,
`["q1", "q2"]`, is accepted too). Each query is whitespace-collapsed and cut to
`max_query_chars`; empty pieces are skipped; repeats (case-insensitive) are dropped. Only the
first `max_queries` are kept: extra queries are dropped and the action stays valid. The model
sees which queries ran, because the observation labels each document group with its query:

    <information>Query 1: q1
    Doc 1 (Title: "T") text
    Query 2: q2
    Doc 1 (Title: "U") text</information>

All other parsing rules are Search-R1's (see ragrl.methods.search_r1).
"""
from __future__ import annotations

import json
import re

from ragrl.errors import ConfigError
from ragrl.methods.base import Method, register_method
from ragrl.methods.search_r1 import SearchR1Protocol
from ragrl.rollout.snippets import squash

RAG_R1_SYSTEM = """\
Answer the question. Think inside <think> </think>. To look things up, write \
<search> query 1; query 2 </search> with up to {max_queries} queries separated by ";"; \
results for each query come back inside <information> </information>. Search as often as you need. \
When you know, write <answer> a few words </answer> with no explanation.
Example:
Question: Are Jaws and Alien by the same director?
<think>I need both directors.</think>
<search> Jaws director; Alien director </search>
<information>Query 1: Jaws director
Doc 1 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.
Query 2: Alien director
Doc 1 (Title: "Alien (film)") Alien is a 1979 film directed by Ridley Scott.</information>
<think>Spielberg and Scott are different people.</think>
<answer> no </answer>"""


class RagR1Protocol(SearchR1Protocol):
    """RAG-R1 (multi-query parallelism): up to `max_queries` queries per search action."""

    name = "rag_r1"
    group_by_query = True

    def __init__(self, max_queries: int = 3, max_query_chars: int = 512, max_answer_chars: int = 200):
        if not isinstance(max_queries, int) or isinstance(max_queries, bool) or max_queries < 1:
            raise ConfigError(f"rag_r1: max_queries must be a positive integer, got {max_queries!r}")
        super().__init__(max_query_chars=max_query_chars, max_answer_chars=max_answer_chars)
        self.max_queries = max_queries
        self.system_prompt = RAG_R1_SYSTEM.replace("{max_queries}", str(max_queries))

    def split_queries(self, content: str) -> list[str]:
        pieces = _json_list(content)
        if pieces is None:
            pieces = re.split(r"[;\n]", content)
        queries, seen = [], set()
        for piece in pieces:
            query = squash(piece)[: self.max_query_chars].strip()
            if query and query.lower() not in seen:
                seen.add(query.lower())
                queries.append(query)
        return queries[: self.max_queries]


def _json_list(content: str) -> list[str] | None:
    """`["a", "b"]` → ["a", "b"]; anything else → None (then ';'/newline splitting applies)."""
    stripped = content.strip()
    if not stripped.startswith("["):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


METHOD = register_method(Method(
    name="rag_r1",
    paper="RAG-R1 (Tan et al., 2025: multi-query parallelism)",
    trains="the LM, which may issue several queries per search, retrieved as one batch (PPO)",
    protocols=(RagR1Protocol,),
    recipes=("rag_r1_ppo",),
))
