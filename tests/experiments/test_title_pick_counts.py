"""title_pick_counts: per mode, a blind pick among the title candidates never beats the best one, and
the counts nest (demo slice, BM25, the real tokenizer)."""
from experiments.search_agents.title_pick_counts import MODES, pick_counts
from ragrl.datasets import load_questions
from ragrl.models.lm_weights import load_tokenizer
from ragrl.retrieval.resolve import retriever_for
from ragrl.rewards.qa import is_yes_no
from ragrl.train.recipe import load_train_config

SHAPE = ["rollout.first_action=question", "rollout.second_action=search", "rollout.second_query=title"]


def test_pick_counts_nest_and_the_best_candidate_bounds_every_pick(smollm2_path):
    cfg = load_train_config("search_r1_grpo", SHAPE, variant="tiny")
    questions = [q for q in load_questions(cfg.data.train, limit=60)
                 if q.get("gold_passage_ids") and not is_yes_no(q["answers"])]
    out = pick_counts(cfg, questions, load_tokenizer(cfg.model.name), retriever_for(cfg.data.index, cfg.data.corpus))
    assert out["questions"] == len(questions)
    assert 0 < out["with_candidates"] <= out["questions"]
    assert out["with_a_missed_gold_candidate"] <= out["with_candidates"]
    for mode in MODES:
        m = out[mode]
        assert -100 <= m["blind_pick"] <= m["best_candidate"] <= 100, (mode, m)
        assert 0 <= m["picks_that_lose"] <= 100
