"""Search-behaviour rewards: cost per search (SmartRAG), R1-Searcher's two stages, gold recall,
answer in the retrieved documents.

>>> r = "<think>look</think><search> Jaws director </search><information>Doc 1</information><answer>x</answer>"
>>> search_count(r)
1
>>> search_cost_reward(r, {}, cost=0.25)
-0.25
"""
from __future__ import annotations

from ragrl.agents.base import Protocol
from ragrl.errors import RagrlError
from ragrl.rewards.format import is_well_formed
from ragrl.rewards.qa import answer_in, answer_of, f1_score, golds_of, is_yes_no, protocol_of, response_text
from ragrl.rollout.trajectory import Trajectory


def search_count(completion, protocol: str | Protocol | None = None) -> int:
    """Search *actions* taken (a multi-query RAG-R1 search counts once).

    Trajectory → `num_searches`; text → the protocol's own count (`Protocol.count_searches`), so a
    new protocol gets every search-based reward without a change here.
    """
    if isinstance(completion, Trajectory):
        return completion.num_searches
    return protocol_of(completion, protocol).count_searches(response_text(completion))


def search_cost_reward(completion, sample=None, cost: float = 0.1, protocol: str | Protocol | None = None) -> float:
    """SmartRAG's retrieval cost: −cost for every search action."""
    return -cost * search_count(completion, protocol)


def retrieval_reward(completion, sample=None, bonus: float = 0.5, protocol: str | Protocol | None = None) -> float:
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


def r1_searcher_stage1_reward(completion, sample=None, protocol: str | Protocol | None = None) -> float:
    """R1-Searcher stage 1 (Song et al., 2025, arXiv:2503.05592): retrieve reward (0.5 if it
    searched at least once) + format reward (0.5 if well formed). No answer reward.

    >>> ok = "<think>a <|begin_of_query|> q <|end_of_query|>\\n<|begin_of_documents|>d<|end_of_documents|>\\nb</think><answer>x</answer>"
    >>> r1_searcher_stage1_reward(ok)
    1.0
    >>> r1_searcher_stage1_reward("<answer>x</answer>")
    0.5
    """
    proto = protocol_of(completion, protocol, default="r1_searcher")
    return retrieval_reward(completion, bonus=0.5, protocol=proto) + 0.5 * is_well_formed(completion, proto)


def r1_searcher_stage2_reward(
    completion, sample, penalty: float = 2.0, protocol: str | Protocol | None = None
) -> float:
    """R1-Searcher stage 2: answer F1, minus `penalty` (2 in the paper) if the format is wrong.

    >>> r1_searcher_stage2_reward("<think>x</think><answer>Paris France</answer>", {"answers": ["Paris"]})
    0.6666666666666666
    >>> r1_searcher_stage2_reward("<answer>Paris</answer> extra", {"answers": ["Paris"]})
    -1.0
    """
    proto = protocol_of(completion, protocol, default="r1_searcher")
    f1 = f1_score(answer_of(completion, proto), golds_of(completion, sample))
    return f1 - (0.0 if is_well_formed(completion, proto) else penalty)
