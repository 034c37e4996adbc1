"""Did each search pay off? Per search, whether it brought a gold passage or the answer into view
for the first time; per system, the share of searches that did; and the break-even cost per search
at which a system's searching stops paying in F1.

A search is one query sent to the retriever, in the order the episode sent them: each query of each
turn that holds queries (`Turn.queries`, with that query's results in `Turn.passage_ids`), across
every trajectory of the episode (a pipeline's rewriter searches; its generator reads).

>>> events = [("q1", ["p1", "p2"]), ("q2", ["p2", "p3"]), ("q3", ["p3"])]
>>> texts = {"p1": "Paris is big", "p2": "Lyon", "p3": "the capital is Paris"}
>>> [(r["new_gold"], r["new_answer"], r["paid"]) for r in search_payoff(events, ["p3"], ["Paris"], texts.get)]
[(0, True, True), (1, False, True), (0, False, False)]
>>> break_even_cost(30.0, 20.0, 2.0)    # +10 F1 points for 2 searches: 0.05 F1 (0-1) a search
0.05
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ragrl.rewards.qa import answer_in, is_yes_no
from ragrl.rollout.trajectory import Trajectory


def search_events(trajs: Sequence[Trajectory]) -> list[tuple[str, list[str]]]:
    """(query, its passage ids) for each search of one episode's trajectories, in order."""
    events = []
    for t in trajs:
        for turn in t.turns:
            for j, query in enumerate(turn.queries):
                ids = turn.passage_ids[j] if j < len(turn.passage_ids) else []
                events.append((query, list(ids)))
    return events


def search_payoff(events: Sequence[tuple[str, list[str]]], gold_ids: Sequence[str], answers: Sequence[str],
                  passage_text: Callable[[str], str | None]) -> list[dict]:
    """Per search: `new_gold` (gold passages it was first to bring), `new_answer` (it was first to
    bring a passage holding a gold answer; always False for yes/no questions, whose answer is in
    every passage) and `paid` (either). `passage_text(id)` gives a passage's title and text."""
    golds, seen = set(gold_ids), set()
    check_answer = bool(answers) and not is_yes_no(list(answers))
    answer_seen = False
    out = []
    for _, ids in events:
        new = [i for i in ids if i not in seen]
        seen.update(ids)
        new_gold = len(golds & set(new))
        new_answer = False
        if check_answer and not answer_seen and new:
            new_answer = bool(answer_in([passage_text(i) or "" for i in new], list(answers)))
            answer_seen = new_answer
        out.append({"new_gold": new_gold, "new_answer": new_answer, "paid": bool(new_gold) or new_answer})
    return out


def payoff_summary(per_episode: Sequence[Sequence[dict]]) -> dict:
    """Shares (percent) over all searches of a system: `paid`, `gold` (a first gold passage),
    `answer` (the answer first in view), and the searches counted; None shares without searches."""
    rows = [r for episode in per_episode for r in episode]
    n = len(rows)
    share = (lambda k: 100.0 * sum(bool(r[k]) for r in rows) / n) if n else (lambda k: None)
    return {"searches": n, "paid": share("paid"), "gold": share("new_gold"), "answer": share("new_answer")}


def break_even_cost(f1: float, f1_without_search: float, searches_per_q: float) -> float | None:
    """The cost per search (in F1 units, 0-1, as a reward like SmartRAG's charges it) at which a
    system's F1 gain over answering without search is used up: (F1 - F1 without) / 100 / searches.
    None when it does not search; negative when its searching loses F1 at any cost."""
    if searches_per_q <= 0:
        return None
    return round((f1 - f1_without_search) / 100.0 / searches_per_q, 6)
