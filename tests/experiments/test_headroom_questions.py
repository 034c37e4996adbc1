"""headroom_questions: the training questions the missed_after_question warm start keeps, unchanged and in
file order, each one whose own top k misses a gold passage (on the demo slice, BM25)."""
from experiments.search_agents.headroom_questions import headroom_questions
from ragrl.datasets import load_questions
from ragrl.retrieval.resolve import retriever_for
from ragrl.train.recipe import load_train_config

SHAPE = ["rollout.first_action=question", "rollout.second_action=search", "sft.builder=missed_after_question",
         "sft.direct_frac=0"]


def test_headroom_questions_are_the_kept_ones_whose_own_search_misses_a_gold(smollm2_path):
    kept, total = headroom_questions("search_r1_grpo", "tiny", SHAPE)
    cfg = load_train_config("search_r1_grpo", SHAPE, variant="tiny")
    every = load_questions(cfg.data.train)
    assert total == len(every) and 0 < len(kept) < total
    order = [q["id"] for q in every]
    assert [q["id"] for q in kept] == sorted((q["id"] for q in kept), key=order.index)   # file order
    by_id = {q["id"]: q for q in every}
    assert all(q == by_id[q["id"]] for q in kept)                                        # rows unchanged
    own = retriever_for(cfg.data.index, cfg.data.corpus).search([q["question"] for q in kept], cfg.rollout.topk)
    for q, hits in zip(kept, own):
        assert set(q["gold_passage_ids"]) - {h.id for h in hits}, q["id"]
