"""Per-search payoff on hand-built episodes: which search first brought a gold passage or the answer."""
from __future__ import annotations

from ragrl.eval.search_payoff import (
    break_even_cost,
    payoff_summary,
    search_events,
    search_payoff,
)
from ragrl.rollout.trajectory import Trajectory, Turn

PASSAGES = {"p1": "Lyon A city in France.", "p2": "Jaws A 1975 film directed by Steven Spielberg.",
            "p3": "Spielberg Steven Spielberg was born in Cincinnati.", "p4": "Ohio A state."}


def _traj(turns, agent="policy"):
    return Trajectory(sample_id="q1", question="Where was the director of Jaws born?", golds=["Cincinnati"],
                      token_ids=[1], action_mask=[0], logprobs=[0.0], prompt_len=1, agent=agent, turns=turns)


def test_a_search_agent_episode_credits_each_first_find():
    """Three searches: the first finds nothing useful, the second the first gold passage (p2), the
    third the second gold passage and the answer (p3); an answer turn holds no query."""
    episode = [_traj([Turn("<search>Lyon</search>", "search", queries=["Lyon"], passage_ids=[["p1"]]),
                      Turn("<search>Jaws director</search>", "search", queries=["Jaws director"], passage_ids=[["p1", "p2"]]),
                      Turn("<search>Spielberg born</search>", "search", queries=["Spielberg born"], passage_ids=[["p2", "p3"]]),
                      Turn("<answer>Cincinnati</answer>", "answer")])]
    events = search_events(episode)
    assert [q for q, _ in events] == ["Lyon", "Jaws director", "Spielberg born"]
    rows = search_payoff(events, ["p2", "p3"], ["Cincinnati"], lambda pid: PASSAGES[pid])
    assert [(r["new_gold"], r["new_answer"], r["paid"]) for r in rows] == [(0, False, False), (1, False, True),
                                                                          (1, True, True)]
    summary = payoff_summary([rows, []])          # a second episode that never searched adds nothing
    assert summary == {"searches": 3, "paid": 200 / 3, "gold": 200 / 3, "answer": 100 / 3}


def test_a_pipeline_episode_counts_each_sub_question_and_not_the_reader():
    """A rewriter's two sub-questions are two searches; the selector's and generator's passage lists
    (no queries) are what they read, not searches."""
    episode = [_traj([Turn("", "generator", passage_ids=[["p3"]])], "generator"),
               _traj([Turn("", "rewriter", queries=["Jaws director", "Spielberg birthplace"],
                           passage_ids=[["p2"], ["p3", "p4"]])], "rewriter"),
               _traj([Turn("", "selector", passage_ids=[["p3"]])], "selector")]
    events = search_events(episode)
    assert events == [("Jaws director", ["p2"]), ("Spielberg birthplace", ["p3", "p4"])]
    rows = search_payoff(events, ["p2", "p3"], ["Cincinnati"], PASSAGES.get)
    assert [r["paid"] for r in rows] == [True, True] and rows[1]["new_answer"]


def test_yes_no_answers_never_count_as_found_and_repeats_pay_nothing():
    events = [("q", ["p1"]), ("q again", ["p1"])]
    rows = search_payoff(events, ["p1"], ["yes"], PASSAGES.get)
    assert [(r["new_gold"], r["new_answer"]) for r in rows] == [(1, False), (0, False)]
    assert payoff_summary([]) == {"searches": 0, "paid": None, "gold": None, "answer": None}


def test_break_even_cost_by_hand():
    # F1 34.0 with 1.6 searches a question against 26.0 without: 0.08 / 1.6 = 0.05 a search
    assert break_even_cost(34.0, 26.0, 1.6) == 0.05
    assert break_even_cost(20.0, 26.0, 2.0) == -0.03        # its searching loses F1 at any cost
    assert break_even_cost(30.0, 26.0, 0.0) is None
