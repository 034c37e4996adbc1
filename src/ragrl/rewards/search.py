"""Search-behaviour rewards: cost per search, a bonus for searching, gold recall, answer in the
retrieved documents.

>>> r = "<think>look</think><search> Jaws director </search><information>Doc 1</information><answer>x</answer>"
>>> search_count(r)
1
>>> search_cost_reward(r, {}, cost=0.25)
-0.25
"""
from __future__ import annotations

from ragrl.errors import RagrlError
from ragrl.rewards.qa import answer_in, golds_of, is_yes_no, protocol_of, response_text
from ragrl.rollout.protocol import TextProtocol
from ragrl.rollout.trajectory import Trajectory


def search_count(completion, protocol: str | TextProtocol | None = None) -> int:
    """Search *actions* taken (a multi-query RAG-R1 search counts once).

    Trajectory → `num_searches`; text → the protocol's own count (`TextProtocol.count_searches`), so a
    new protocol gets every search-based reward without a change here.
    """
    if isinstance(completion, Trajectory):
        return completion.num_searches
    return protocol_of(completion, protocol).count_searches(response_text(completion))


def search_cost_reward(completion, sample=None, cost: float = 0.1, protocol: str | TextProtocol | None = None) -> float:
    """SmartRAG's retrieval cost: −cost for every search action."""
    return -cost * search_count(completion, protocol)


def retrieval_reward(completion, sample=None, bonus: float = 0.5, protocol: str | TextProtocol | None = None) -> float:
    """R1-Searcher stage 1's retrieve reward: `bonus` (0.5) if the rollout searched at least once.

    >>> retrieval_reward("<answer>x</answer>", {})
    0.0
    """
    return bonus if search_count(completion, protocol) >= 1 else 0.0


def gold_recall_reward(completion, sample) -> float:
    """Fraction of the sample's `gold_passage_ids` that the rollout retrieved (any turn).

    A ragrl addition (no paper uses it as is): a dense signal for learning to search, as the
    answer reward is sparse on a small model. 0.0 when the sample lists no gold passages.
    """
    if not isinstance(completion, Trajectory):
        raise RagrlError("gold_recall needs a Trajectory (text holds no passage ids)")
    golds = set((sample or {}).get("gold_passage_ids") or [])
    if not golds:
        return 0.0
    return len(golds & set(completion.retrieved_ids)) / len(golds)


def answer_in_docs_reward(completion, sample) -> float:
    """1.0 if a gold answer occurs (SQuAD-normalised, whole words) in a retrieved document.

    DeepRetrieval's idea (reward the retriever when what it found holds the answer): unlike
    `gold_recall` it needs no gold passage ids, and it credits the passage that *answers* a
    multi-hop question, not only the first hop's. Yes/no questions score 0.0 (every passage
    holds "yes" or "no" somewhere, so there is no signal). Reads the search turns' observations.

    >>> from ragrl.rollout.trajectory import Trajectory, Turn
    >>> t = Trajectory("q1", "Who directed Jaws?", ["Steven Spielberg"], [], [], [], 0,
    ...                turns=[Turn("Jaws", "search", observation="Jaws. A 1975 film by Steven Spielberg.")])
    >>> answer_in_docs_reward(t, {"answers": ["Steven Spielberg"]})
    1.0
    >>> answer_in_docs_reward(t, {"answers": ["George Lucas"]})
    0.0
    """
    if not isinstance(completion, Trajectory):
        raise RagrlError("answer_in_docs needs a Trajectory (text alone does not say which part was retrieved)")
    golds = golds_of(completion, sample)
    if not golds or is_yes_no(golds):
        return 0.0
    return answer_in([t.observation for t in completion.turns if t.kind == "search"], golds)
