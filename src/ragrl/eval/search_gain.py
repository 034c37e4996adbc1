"""The search gain at equal passages (issue #53): does an agent's own searching find what the question
alone does not, at the same number of passages?

Per question: 1 if the passages the agent was shown hold a gold answer (answer@shown), minus 1 if the
question's own top N from the same index does, N the number of distinct passages the agent was shown
(0 when it never searched: nothing against nothing). Yes/no questions are left out (every passage
holds a yes). An agent that searches more is never flattered by it: the question gets as many
passages. `ragrl eval` and training's periodic evaluation report it (`summarize` averages the
per-question metrics written here); `ragrl compare` writes the same metrics from its own cached copy
of the question's search (`compare.systems.question_hit_at`).
"""
from __future__ import annotations

from collections.abc import Sequence

from ragrl.retrieval.base import Retriever
from ragrl.rewards.qa import answer_in, is_yes_no
from ragrl.rewards.search import QUESTION_RANK, question_answer_ranks
from ragrl.rollout.trajectory import Trajectory

QUESTION_DEPTH = 30   # how deep the question's own search goes (deeper where an agent was shown more)


def annotate_search_gain(trajs: Sequence[Trajectory], retriever: Retriever) -> None:
    """Write into each trajectory's metrics (one trajectory per question): `answer_shown`,
    `question_shown` (the question's own top N holds an answer) and `search_gain`, all None for a
    yes/no question, and `shown` (N). The same keys `ragrl compare` writes; `summarize` averages
    them. Every question's own search is one batched call.

    >>> from ragrl.retrieval.base import Hit
    >>> from ragrl.rollout.trajectory import Turn
    >>> class Two:   # the question's own search finds the answer at rank 2
    ...     def search(self, queries, k):
    ...         return [[Hit("a", "A", "nothing", 1.0), Hit("b", "B", "Spielberg", 0.5)][:k] for _ in queries]
    >>> def shown(*texts, golds=("Spielberg",)):
    ...     ids = [f"p{i}" for i in range(len(texts))]
    ...     return Trajectory("q", "Who directed Jaws?", list(golds), [], [], [], 0, turns=[
    ...         Turn("Jaws", "search", queries=["Jaws"], passage_ids=[ids], passage_texts=[list(texts)])])
    >>> ts = [shown("x"), shown("x", "Spielberg"), shown("Spielberg"), shown("x", "y"), shown("x", golds=["yes"])]
    >>> annotate_search_gain(ts, Two())
    >>> [t.metrics["search_gain"] for t in ts]   # at N=1 neither; at N=2 both; found at 1; missed; yes/no
    [0.0, 0.0, 1.0, -1.0, None]
    >>> {k: ts[2].metrics[k] for k in ("answer_shown", "question_shown", "search_gain", "shown")}
    {'answer_shown': 1.0, 'question_shown': 0.0, 'search_gain': 1.0, 'shown': 1}
    """
    if not trajs:
        return
    shown = [[text for _, text in t.shown_passages()] for t in trajs]
    # the question's own search, as search_gain's reward reads it: one batched call, the rank of the
    # first answer-bearing passage within the depth (None: none, or a yes/no question)
    questions = [{"question": t.question, "answers": t.golds} for t in trajs]
    question_answer_ranks(questions, retriever, max(QUESTION_DEPTH, *map(len, shown)))
    for t, texts, q in zip(trajs, shown, questions):
        t.metrics["shown"] = len(texts)
        if is_yes_no(t.golds):
            t.metrics.update(answer_shown=None, question_shown=None, search_gain=None)
            continue
        answer_shown = answer_in(texts, t.golds)
        question_shown = float(q[QUESTION_RANK] is not None and q[QUESTION_RANK] <= len(texts))
        t.metrics.update(answer_shown=answer_shown, question_shown=question_shown, search_gain=answer_shown - question_shown)


def records_shown_passages(trajs: Sequence[Trajectory]) -> bool:
    """Whether the runner recorded the text of every passage its searches showed (the multi-turn and
    retrieval-only runners do; a pipeline records ids only), which the search gain reads."""
    return all(text for t in trajs for _, text in t.shown_passages())
