"""`rollout.query_prefix: question`: the runner searches the question followed by each query the policy
wrote (query expansion), with the real SmolLM2 over a real BM25 index of the demo corpus, turn by turn
and in the static engine's slots."""
from __future__ import annotations

import pytest

from ragrl.datasets import load_questions
from ragrl.engines.hf import HFEngine
from ragrl.engines.static import StaticEngine
from ragrl.paths import DEMO_EVAL
from ragrl.retrieval.inprocess import InProcessRetriever
from ragrl.rollout.config import RolloutConfig, evaluation_key
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.protocol import get_protocol

import ragrl.methods  # noqa: F401  (registers the search_r1 protocol)

# At temperature 0.5 the instruct model closes its forced first search on these questions (at 1.0 most of
# its turns do not parse).
SHAPE = dict(first_action="search", max_turns=3, topk=3, passage_words=20, max_turn_tokens=32,
             max_response_tokens=160, max_obs_tokens=96, n=2, temperature=0.5, seed=5)


class RecordingRetriever(InProcessRetriever):
    """The real in-process retriever, recording every query it is asked for."""

    def __init__(self, index):
        super().__init__(index)
        self.asked: list[str] = []

    def search(self, queries, k):
        self.asked += list(queries)
        return super().search(queries, k)


def no_generate(*_):
    raise AssertionError("the in-slot path must not fall back to turn-by-turn generate")


@pytest.mark.parametrize("engine_kind", ["hf", "static"])
def test_each_search_is_the_question_then_the_query_the_policy_wrote(smollm2_policy, demo_bm25_index, engine_kind):
    """Every search turn records the query as searched (the question, a space, the policy's query), its
    action text keeps what the policy wrote, its passages are the index's own top k for the searched
    query, and the index is never asked for a query without the question in front."""
    model, tok = smollm2_policy
    protocol = get_protocol("search_r1")
    samples = load_questions(DEMO_EVAL, limit=4)
    retriever = RecordingRetriever(demo_bm25_index)
    if engine_kind == "hf":
        engine = HFEngine(model, tok)
    else:
        engine = StaticEngine(model, tok, max_batch_size=4, check_every=4)
        engine.generate = no_generate
    trajs, _ = run_episodes(engine, protocol, retriever, samples, RolloutConfig(**SHAPE, query_prefix="question"))
    searches = 0
    for t in trajs:
        for turn in t.turns:
            if turn.kind != "search":
                continue
            written = protocol.parse(turn.action_text).queries
            assert turn.queries == [f"{t.question} {q}" for q in written], (turn.action_text, turn.queries)
            hits = InProcessRetriever(demo_bm25_index).search(turn.queries, 3)
            assert turn.passage_ids == [[h.id for h in hs] for hs in hits]
            searches += 1
    assert searches >= 4, f"only {searches} searches in {len(trajs)} episodes"
    questions = {s["question"] for s in samples}
    assert retriever.asked and all(any(q.startswith(f"{x} ") for x in questions) for q in retriever.asked)


def test_without_the_prefix_the_query_is_searched_as_written_and_the_cache_key_tells_them_apart(
        smollm2_policy, demo_bm25_index):
    model, tok = smollm2_policy
    protocol = get_protocol("search_r1")
    cfg = RolloutConfig(**SHAPE)
    trajs, _ = run_episodes(HFEngine(model, tok), protocol, InProcessRetriever(demo_bm25_index),
                            load_questions(DEMO_EVAL, limit=2), cfg)
    searched = [u for t in trajs for u in t.turns if u.kind == "search"]
    assert len(searched) >= 2 and all(u.queries == protocol.parse(u.action_text).queries for u in searched)
    assert "query_prefix" not in evaluation_key(cfg)   # entries cached before the setting stay valid
    assert evaluation_key(RolloutConfig(**SHAPE, query_prefix="question"))["query_prefix"] == "question"
