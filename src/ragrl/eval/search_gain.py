"""The search gain at equal passages (issue #53): does an agent's own searching find what the question
alone does not, at the same number of passages?

Per question: 1 if the passages the agent was shown hold a gold answer (answer@shown), minus 1 if the
question's own top N from the same index does, N the number of distinct passages the agent was shown
(0 when it never searched: nothing against nothing). Yes/no questions are left out (every passage
holds a yes). An agent that searches more is never flattered by it: the question gets as many
passages. Training's periodic evaluation reports it (`agent_metrics`); `ragrl compare` has its own
cached copy of the question's search (`compare.systems.question_hit_at`) with the same definition.
"""
from __future__ import annotations

from collections.abc import Sequence

from ragrl.eval.stats import bootstrap_ci
from ragrl.retrieval.base import Retriever
from ragrl.rewards.qa import answer_in, is_yes_no
from ragrl.rewards.search import first_answer_rank
from ragrl.rollout.trajectory import Trajectory

QUESTION_DEPTH = 30   # how deep the question's own search goes (deeper where an agent was shown more)


def search_gain_scores(trajs: Sequence[Trajectory], retriever: Retriever) -> list[dict | None]:
    """Per trajectory (one per question): {"answer_shown", "question_hit", "search_gain", "shown"}, or
    None for a yes/no question. Every question's own search is one batched call.

    >>> from ragrl.retrieval.base import Hit
    >>> from ragrl.rollout.trajectory import Turn
    >>> class Two:   # the question's own search finds the answer at rank 2
    ...     def search(self, queries, k):
    ...         return [[Hit("a", "A", "nothing", 1.0), Hit("b", "B", "Spielberg", 0.5)][:k] for _ in queries]
    >>> def shown(*texts):
    ...     ids = [f"p{i}" for i in range(len(texts))]
    ...     return Trajectory("q", "Who directed Jaws?", ["Spielberg"], [], [], [], 0, turns=[
    ...         Turn("Jaws", "search", queries=["Jaws"], passage_ids=[ids], passage_texts=[list(texts)])])
    >>> [s["search_gain"] for s in search_gain_scores([shown("x"), shown("x", "Spielberg")], Two())]
    [0.0, 0.0]
    >>> search_gain_scores([shown("Spielberg")], Two())[0]   # found at 1 what the question finds at 2
    {'answer_shown': 1.0, 'question_hit': 0.0, 'search_gain': 1.0, 'shown': 1}
    >>> search_gain_scores([shown("x", "y")], Two())[0]["search_gain"]   # missed what the question found
    -1.0
    """
    out: list[dict | None] = []
    todo: list[tuple[int, Trajectory, list[str]]] = []
    for i, t in enumerate(trajs):
        if is_yes_no(t.golds):
            out.append(None)
            continue
        texts = [text for _, text in t.shown_passages()]
        out.append({"answer_shown": answer_in(texts, t.golds) if texts else 0.0, "shown": len(texts)})
        todo.append((i, t, texts))
    if todo:
        depth = max(QUESTION_DEPTH, max(len(texts) for _, _, texts in todo))
        hits = retriever.search([t.question for _, t, _ in todo], depth)
        for (i, t, texts), found in zip(todo, hits):
            rank = first_answer_rank([h.full_text for h in found], t.golds)
            row = out[i]
            row["question_hit"] = float(rank is not None and rank <= len(texts))
            row["search_gain"] = row["answer_shown"] - row["question_hit"]
            out[i] = {k: row[k] for k in ("answer_shown", "question_hit", "search_gain", "shown")}
    return out


def search_gain_summary(scores: Sequence[dict | None], *, seed: int = 0) -> dict[str, float]:
    """Means in percent with 95% bootstrap CIs over the questions that are not yes/no:
    search_gain (+ _lo, _hi), answer_shown (+ _lo, _hi), and passages_shown per question."""
    rows = [s for s in scores if s is not None]
    if not rows:
        return {}
    out: dict[str, float] = {}
    for key in ("search_gain", "answer_shown"):
        mean, lo, hi = bootstrap_ci([r[key] for r in rows], seed=seed)
        out.update({key: 100.0 * mean, f"{key}_lo": 100.0 * lo, f"{key}_hi": 100.0 * hi})
    out["passages_shown"] = sum(r["shown"] for r in rows) / len(rows)
    return out
