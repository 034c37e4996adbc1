"""The rewards on what a search found (issue #53): answer rank and the gain over the question, by
hand on built trajectories, against a real BM25 index for the question's own search, refused on load
where they cannot act, and trained on for one real step."""
from __future__ import annotations

import pytest

from ragrl.errors import ConfigError, RagrlError
from ragrl.rewards.registry import make_reward, query_rank_depth
from ragrl.rewards.search import (
    QUERY_RANK,
    QUESTION_RANK,
    answer_rank_reward,
    first_answer_rank,
    query_answer_ranks,
    query_rank_reward,
    question_answer_ranks,
    search_gain_reward,
)
from ragrl.rollout.trajectory import Trajectory, Turn


def episode(*searches: list[tuple[str, str]]) -> Trajectory:
    """A trajectory whose k-th search retrieved the (id, text) pairs searches[k]."""
    turns = [Turn(f"query {k}", "search", queries=[f"query {k}"], passage_ids=[[pid for pid, _ in hits]],
                  passage_texts=[[text for _, text in hits]]) for k, hits in enumerate(searches)]
    return Trajectory("q", "Who designed the bridge?", ["Lena Quist"], [], [], [], 0, turns=turns)


SAMPLE = {"answers": ["Lena Quist"]}


def test_answer_rank_counts_distinct_passages_across_searches_by_hand():
    # search 1: p1, p2, p3 (no answer); search 2: p2 again (not counted twice), p4 (the answer) -> rank 4
    t = episode([("p1", "a"), ("p2", "b"), ("p3", "c")], [("p2", "b"), ("p4", "designed by Lena Quist")])
    assert [pid for pid, _ in t.shown_passages()] == ["p1", "p2", "p3", "p4"]
    assert first_answer_rank([text for _, text in t.shown_passages()], SAMPLE["answers"]) == 4
    assert answer_rank_reward(t, SAMPLE) == pytest.approx(0.4)              # 4 <= 6: the third tier
    assert answer_rank_reward(t, SAMPLE, tiers=[[4, 0.9]]) == pytest.approx(0.9)
    assert answer_rank_reward(t, SAMPLE, tiers=[[3, 0.9]]) == 0.0
    assert answer_rank_reward(episode(), SAMPLE) == 0.0                     # no search
    assert answer_rank_reward(episode([("p1", "yes it is")]), {"answers": ["yes"]}) == 0.0


def test_a_runner_that_records_no_texts_is_named_not_scored_zero():
    t = Trajectory("q", "?", ["x"], [], [], [], 0, turns=[Turn("x", "search", queries=["x"], passage_ids=[["p1"]])])
    with pytest.raises(RagrlError, match="recorded ids only"):
        answer_rank_reward(t, {"answers": ["x"]})


def test_bad_tiers_are_refused_when_the_reward_is_built():
    with pytest.raises(ConfigError, match="rising bounds"):
        make_reward({"answer_rank": {"weight": 1.0, "tiers": [[0, 1.0]]}})
    with pytest.raises(ConfigError, match="rising bounds"):
        make_reward({"answer_rank": {"weight": 1.0, "tiers": "top"}})
    assert make_reward({"answer_rank": {"weight": 1.0, "tiers": [[1, 1.0], [5, 0.5]]}}) is not None


def test_search_gain_against_the_questions_own_search_on_a_real_index(demo_bm25_index):
    from ragrl.datasets import load_questions

    samples = [dict(q) for q in load_questions("demo-eval", limit=20) if q["answers"][0].lower() not in ("yes", "no")]
    question_answer_ranks(samples, demo_bm25_index, depth=10)
    hits = demo_bm25_index.search([s["question"] for s in samples], 10)
    for s, found in zip(samples, hits):   # by hand: the first of the question's own top 10 holding an answer
        texts = [f"{h.title} {h.text}" for h in found]
        assert s[QUESTION_RANK] == first_answer_rank(texts, s["answers"])
    found_some = [s for s in samples if s[QUESTION_RANK] is not None]
    assert found_some
    s = found_some[0]
    rank = s[QUESTION_RANK]
    answer = s["answers"][0]
    shown_with = episode([(f"p{i}", "nothing") for i in range(rank - 1)] + [("pa", f"it is {answer}")])
    shown_without = episode([(f"p{i}", "nothing") for i in range(max(rank, 1))])
    assert search_gain_reward(shown_with, s) == 0.0        # found it, but so does the question at N = rank
    assert search_gain_reward(shown_without, s) == -1.0    # the question's own top `rank` holds it
    if rank > 1:   # fewer passages than the question needs: finding it is a gain (no floor on N)
        assert search_gain_reward(episode([("pa", f"it is {answer}")]), s, min_n=0) == 1.0
    # an episode that never searches is held to naive RAG's 3 passages, not to none
    assert search_gain_reward(episode(), s) == (-1.0 if rank <= 3 else 0.0)
    assert search_gain_reward(episode(), s, min_n=0) == 0.0
    with pytest.raises(RagrlError, match="question_answer_rank"):
        search_gain_reward(shown_with, {"answers": [answer]})


def test_search_outcome_rewards_are_refused_where_they_cannot_act():
    from ragrl.train.check import check_combinations
    from ragrl.train.recipe import load_train_config

    with pytest.raises(ConfigError, match="search_gain compares an LM agent"):
        check_combinations(load_train_config("harr_grpo", ["reward_schedule=[[0, {search_gain: 1.0}]]"], "tiny"))
    with pytest.raises(ConfigError, match="does not record"):
        check_combinations(load_train_config("mmoa_mappo", ["reward={answer_rank: 1.0}"], "tiny"))
    with pytest.raises(ConfigError, match="query_rank searches again the queries an LM agent wrote"):
        check_combinations(load_train_config("harr_grpo", ["reward_schedule=[[0, {query_rank: 1.0}]]"], "tiny"))
    with pytest.raises(ConfigError, match="query_rank reads each search's queries"):
        check_combinations(load_train_config("mmoa_mappo", ["reward={query_rank: 1.0}"], "tiny"))
    with pytest.raises(ConfigError, match="'query_rank': tiers must be"):
        make_reward({"query_rank": {"weight": 1.0, "tiers": [[10, 1.0], [3, 0.5]]}})
    check_combinations(load_train_config("search_r1_grpo", ["reward={search_gain: 1.0, answer_rank: 0.5}"], "tiny"))


def test_one_training_step_on_the_gain_over_the_question(tiny_model_dir, tmp_path, monkeypatch):
    """The trainer writes each question's own rank before scoring, and every reward is a gain in {-1, 0, 1}."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    cfg = load_train_config("search_r1_grpo", [
        f"model.name={tiny_model_dir}", "model.dtype=float32", "steps=1", "questions_per_step=2", "rollout.n=2",
        "rollout.max_turn_tokens=12", "rollout.max_response_tokens=60", "sft.steps=0", "eval_every=0",
        "reward={search_gain: 1.0}", f"out_dir={tmp_path / 'run'}", "save_every=100"], "tiny")
    trainer = Trainer(cfg)
    rows = trainer.train(progress=False)
    mean = rows[0]["reward_mean"]   # of 4 trajectories, each -1, 0 or 1
    assert len(rows) == 1 and -1.0 <= mean <= 1.0 and 4 * mean == pytest.approx(round(4 * mean), abs=1e-5)
    annotated = [q for q in trainer.questions if QUESTION_RANK in q]
    assert len(annotated) == 2   # the step's two questions, searched once, kept on the question


def test_query_rank_searches_each_episodes_queries_again_at_depth_on_a_real_index(demo_bm25_index):
    """query_answer_ranks by hand: each query's own top `depth`, the best rank over an episode's
    queries; the reward's tiers over it; the depth the trainer searches is the deepest tier's."""
    from ragrl.datasets import load_questions

    samples = {str(q["id"]): dict(q) for q in load_questions("demo-eval", limit=6)}
    asked = [s for s in samples.values() if s["answers"][0].lower() not in ("yes", "no")][:2]
    a, b = asked
    def searched(sample, *queries):
        return Trajectory(str(sample["id"]), sample["question"], list(sample["answers"]), [], [], [], 0,
                          turns=[Turn(q, "search", queries=[q]) for q in queries])
    after_runner = searched(a, "zzz qqq")    # the runner searched the question first (first_action: question)
    after_runner.turns.insert(0, Turn(a["question"], "search", queries=[a["question"]], by_runner=True))
    trajs = [searched(a, a["question"]), searched(a, "zzz qqq", a["question"]), searched(b, "zzz qqq"), searched(b),
             after_runner]
    query_answer_ranks(trajs, samples, demo_bm25_index, depth=30)
    by_hand = first_answer_rank([f"{h.title} {h.text}" for h in demo_bm25_index.search([a["question"]], 30)[0]],
                                a["answers"])
    assert trajs[0].metrics[QUERY_RANK] == by_hand
    assert trajs[1].metrics[QUERY_RANK] == by_hand          # the better of its two queries
    nonsense = first_answer_rank([f"{h.title} {h.text}" for h in demo_bm25_index.search(["zzz qqq"], 30)[0]],
                                 b["answers"])
    assert trajs[2].metrics[QUERY_RANK] == nonsense
    assert trajs[3].metrics[QUERY_RANK] is None and query_rank_reward(trajs[3], b) == 0.0   # no search
    # the runner's search of the question is not the policy's query: only "zzz qqq" is graded
    policy_only = first_answer_rank([f"{h.title} {h.text}" for h in demo_bm25_index.search(["zzz qqq"], 30)[0]],
                                    a["answers"])
    assert by_hand is not None and policy_only != by_hand and trajs[4].metrics[QUERY_RANK] == policy_only
    tiers = [[1, 1.0], [3, 0.7], [10, 0.4], [30, 0.2]]
    expected = 0.0 if by_hand is None else next(v for bound, v in tiers if by_hand <= bound)
    assert query_rank_reward(trajs[0], a) == expected
    assert query_rank_depth(make_reward({"query_rank": 1.0, "f1": 1.0})) == 30
    assert query_rank_depth(make_reward({"query_rank": {"weight": 1.0, "tiers": [[5, 1.0], [50, 0.1]]}})) == 50
    assert query_rank_depth(make_reward({"answer_rank": 1.0})) == 0
    with pytest.raises(RagrlError, match="query_answer_rank"):
        query_rank_reward(searched(a, "x"), a)
