"""The reward phase of a step (train/scoring.py): each episode finds its own question by id, a reward
that compares a search with the question gets the question's own ranks from the real index first,
an episode cut by the wall-time bound takes the recipe's reward, and the metrics are set."""
from __future__ import annotations

import pytest

from ragrl.errors import RagrlError
from ragrl.rewards.registry import make_reward
from ragrl.rewards.search import QUERY_RANK, QUESTION_RANK
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn
from ragrl.train.scoring import score_step


def episode(sample_id: str, answer: str, passages: list[tuple[str, str]], stop=EpisodeEnd.ANSWER,
            golds=()) -> Trajectory:
    turn = Turn("q", "search", queries=["q"], passage_ids=[[p for p, _ in passages]],
                passage_texts=[[t for _, t in passages]])
    return Trajectory(sample_id, "?", list(golds), [], [], [], 0, turns=[turn], answer=answer, stop_reason=stop)


SAMPLES = [{"id": "a", "question": "Who designed the bridge?", "answers": ["Lena Quist"], "gold_passage_ids": ["p1", "p2"]},
           {"id": "b", "question": "Which river?", "answers": ["Oder"]}]


def test_each_episode_is_scored_against_its_own_question_by_id():
    trajs = [episode("b", "Oder", [("p9", "x")], golds=["Oder"]), episode("a", "Lena Quist", [("p1", "y"), ("p3", "z")]),
             episode("a", "wrong", [("p4", "w")], stop=EpisodeEnd.TIMEOUT, golds=["Lena Quist"])]
    score_step(SAMPLES, trajs, make_reward({"f1": 1.0}), retriever=None, question_depth=10, timeout_reward=-1.0)
    assert [t.reward for t in trajs] == [1.0, 1.0, -1.0]   # the cut episode takes guard.timeout_reward
    assert trajs[1].metrics["gold_recall"] == 0.5           # p1 of p1, p2
    assert "gold_recall" not in trajs[0].metrics            # question b lists no gold passages
    assert trajs[0].metrics["em"] == 1.0 and trajs[2].metrics["em"] == 0.0
    score_step(SAMPLES, trajs[2:], make_reward({"f1": 1.0}), retriever=None, question_depth=10, timeout_reward=None)
    assert trajs[2].reward == 0.0                            # scored as it stands


def test_a_reward_against_the_question_asks_the_real_index_once(demo_bm25_index):
    from ragrl.datasets import load_questions

    samples = [dict(q) for q in load_questions("demo-eval", limit=4)]
    trajs = [episode(str(s.get("id", i)), "", [("p", "nothing")]) for i, s in enumerate(samples)]
    score_step(samples, trajs, make_reward({"search_gain": 1.0}), retriever=demo_bm25_index, question_depth=10,
               timeout_reward=None)
    assert all(QUESTION_RANK in s for s in samples)
    assert {t.reward for t in trajs} <= {-1.0, 0.0}   # one passage holding no answer never gains
    with pytest.raises(RagrlError, match="no index"):
        score_step([dict(q) for q in load_questions("demo-eval", limit=1)], trajs[:1],
                   make_reward({"search_gain": 1.0}), retriever=None, question_depth=10, timeout_reward=None)


def test_a_reward_on_the_episodes_own_queries_searches_them_on_the_real_index(demo_bm25_index):
    from ragrl.datasets import load_questions

    samples = [dict(q) for q in load_questions("demo-eval", limit=3)]
    trajs = [episode(str(s.get("id", i)), "", [("p", "nothing")]) for i, s in enumerate(samples)]
    for t, s in zip(trajs, samples):
        t.turns[0].queries = [s["question"]]
    score_step(samples, trajs, make_reward({"query_rank": 1.0}), retriever=demo_bm25_index, question_depth=10,
               timeout_reward=None)
    assert all(QUERY_RANK in t.metrics for t in trajs)
    assert {t.reward for t in trajs} <= {0.0, 0.2, 0.4, 0.7, 1.0}   # the default tiers
    assert any(t.metrics[QUERY_RANK] is not None for t in trajs)
    with pytest.raises(RagrlError, match="no index"):
        score_step(samples[:1], trajs[:1], make_reward({"query_rank": 1.0}), retriever=None, question_depth=10,
                   timeout_reward=None)
