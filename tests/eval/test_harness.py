"""The eval harness: every system on the same questions, scores that recompute by hand, a report
whose numbers recompute from its JSONL, and deterministic greedy decoding.

The tiny random model (fast) runs all three systems; real SmolLM2 runs naive_rag on 4 questions.
"""
import json
from dataclasses import replace

import pytest

from ragrl.rollout.baselines import baseline_answer
from ragrl.rollout.protocol import get_protocol
from ragrl.datasets import load_questions
from ragrl.errors import ConfigError
from ragrl.eval.harness import EvalConfig, evaluate, naive_rag, run_system, score
from ragrl.eval.report import recompute_summary, write_report
from ragrl.models.lm_weights import load_policy
from ragrl.retrieval.resolve import make_retriever
from ragrl.rewards.qa import cover_em, exact_match, f1_score
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import prompt_ids
from ragrl.engines.hf import HFEngine

FAST_ROLLOUT = RolloutConfig(temperature=0.0, max_turns=2, max_turn_tokens=24, max_response_tokens=96,
                             max_obs_tokens=64)


@pytest.fixture(scope="module")
def index(demo_bm25_dir):
    return make_retriever(demo_bm25_dir)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    return HFEngine(*load_policy(str(tiny_model_dir)))


@pytest.fixture(scope="module")
def questions():
    return load_questions("demo-eval", limit=6)


@pytest.fixture(scope="module")
def tiny_results(tiny_engine, index, questions):
    cfg = EvalConfig(n=6, batch_size=4, rollout=FAST_ROLLOUT)  # two batches: 4 + 2
    return cfg, evaluate(tiny_engine, index, questions, cfg)


def test_naive_rag_over_a_multi_hop_search_records_each_hop_with_the_question(tiny_engine, index, questions):
    """A retriever run's reader-fed evaluation is naive RAG over its hops: one search turn per hop
    (the question as its query, that hop's passages), the answer turn last, every passage shown."""
    def two_hops(queries, k):   # hop 1: the top k; hop 2: the next k
        deep = index.search(queries, 2 * k)
        return [hs[:k] + hs[k:2 * k] for hs in deep]

    cfg = EvalConfig(topk=2, max_answer_tokens=8)
    trajs = naive_rag(tiny_engine, two_hops, questions[:3], cfg, hop_size=2)
    deep = index.search([q["question"] for q in questions[:3]], 4)
    for t, q, hs in zip(trajs, questions, deep):
        assert [u.kind for u in t.turns] == ["search", "search", "answer"] and t.num_searches == 2
        assert [u.queries for u in t.turns[:2]] == [[q["question"]]] * 2
        assert [u.passage_ids for u in t.turns[:2]] == [[[h.id for h in hs[:2]]], [[h.id for h in hs[2:]]]]
        assert t.retrieved_ids == [h.id for h in hs] and t.num_turns == 1
        prompt = tiny_engine.tokenizer.decode(t.token_ids[: t.prompt_len])
        assert all(f'(Title: "{h.title}")' in prompt for h in hs)   # the reader saw all four


def check_scores(trajs, questions):
    """Per-question metrics equal a hand recomputation from the answer and the golds."""
    assert [t.sample_id for t in trajs] == [q["id"] for q in questions]
    for t, q in zip(trajs, questions):
        assert t.golds == q["answers"] and t.question == q["question"]
        pred = t.answer or ""
        assert t.metrics["em"] == exact_match(pred, q["answers"])
        assert t.metrics["f1"] == f1_score(pred, q["answers"])
        assert t.metrics["cover_em"] == cover_em(pred, q["answers"])
        assert t.metrics["gen_tokens"] == sum(t.action_mask)


def test_every_system_answers_every_question_and_scores_by_hand(tiny_results, tiny_engine, questions, index):
    cfg, results = tiny_results
    assert list(results) == ["direct", "naive_rag", "search_r1"]
    for system, entry in results.items():
        check_scores(entry["trajectories"], questions)
        assert entry["wall_s"] > 0
    for t in results["direct"]["trajectories"] + results["naive_rag"]["trajectories"]:
        assert t.num_turns == 1 and t.answer == baseline_answer(t.turns[-1].action_text.replace("<|im_end|>", ""))
    for t, q in zip(results["naive_rag"]["trajectories"], questions):
        # naive RAG's one search is recorded as a turn whose query is the question, then the answer
        assert [u.kind for u in t.turns] == ["search", "answer"] and t.turns[0].queries == [q["question"]]
        assert t.num_searches == 1 and len(t.turns[0].passage_ids[0]) == cfg.topk
    for t in results["direct"]["trajectories"]:
        assert t.num_searches == 0 and t.retrieved_ids == []
    hits = index.search([q["question"] for q in questions], cfg.topk)
    for t, hs in zip(results["naive_rag"]["trajectories"], hits):
        assert t.retrieved_ids == [h.id for h in hs] and t.num_searches == 1
    protocol = get_protocol("search_r1")
    for t, q in zip(results["search_r1"]["trajectories"], questions):
        assert t.token_ids[: t.prompt_len] == prompt_ids(tiny_engine.tokenizer, protocol, q["question"])
        assert 1 <= t.num_turns <= FAST_ROLLOUT.max_turns and t.metrics["protocol"] == "search_r1"
        assert t.answer == (protocol.parse(t.turns[-1].action_text).answer if t.stop_reason == "answer" else None)


def test_score_gives_credit_for_a_gold_answer(tiny_results):
    t = tiny_results[1]["direct"]["trajectories"][0]
    gold = score(replace(t, answer=f"  {t.golds[0].upper()}. ", metrics={}))
    assert (gold.metrics["em"], gold.metrics["f1"], gold.metrics["cover_em"]) == (1.0, 1.0, 1.0)
    empty = score(replace(t, answer=None, metrics={}))
    assert (empty.metrics["em"], empty.metrics["f1"]) == (0.0, 0.0)


def test_report_numbers_recompute_exactly_from_the_jsonl(tiny_results, tmp_path):
    _, results = tiny_results
    report = write_report(tmp_path, results, {"model": "tiny", "agent": "search_r1", "n": 6}, baseline="naive_rag")
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["systems"] == json.loads(json.dumps(report["systems"]))
    assert set(on_disk["paired"]) == {"direct", "search_r1"}
    for system, summary in on_disk["systems"].items():
        jsonl = tmp_path / on_disk["files"][system]
        assert len(jsonl.read_text().splitlines()) == 6
        assert recompute_summary(jsonl, wall_time_s=summary["wall_time_s"]) == summary
        assert summary["n"] == 6 and summary["wall_time_s"] == results[system]["wall_s"]
        em = [t.metrics["em"] for t in results[system]["trajectories"]]
        assert summary["em"]["mean"] == 100 * sum(em) / 6
    assert "| naive_rag |" in (tmp_path / "report.md").read_text()


def test_greedy_eval_is_deterministic(tiny_engine, index, questions, tiny_results):
    cfg, first = tiny_results
    again = evaluate(tiny_engine, index, questions, cfg)
    for system in first:
        a, b = first[system]["trajectories"], again[system]["trajectories"]
        assert [t.token_ids for t in a] == [t.token_ids for t in b]
        assert [t.answer for t in a] == [t.answer for t in b]


def test_bad_systems_are_config_errors(tiny_engine, questions):
    with pytest.raises(ConfigError, match="bogus"):
        evaluate(tiny_engine, None, questions, EvalConfig(systems=["direct", "bogus"], n=2))
    with pytest.raises(ConfigError, match="naive_rag needs a retriever"):
        run_system("naive_rag", tiny_engine, None, questions[:1], EvalConfig())


def test_questions_without_ids_keep_distinct_ids_across_batches(tiny_engine, questions):
    bare = [{"question": q["question"], "answers": q["answers"]} for q in questions[:5]]
    out = evaluate(tiny_engine, None, bare, EvalConfig(systems=["direct"], n=5, batch_size=2, max_answer_tokens=4))
    assert [t.sample_id for t in out["direct"]["trajectories"]] == ["0", "1", "2", "3", "4"]


def test_smollm2_naive_rag_reads_the_passages_and_is_deterministic(smollm2_policy, index):
    engine = HFEngine(*smollm2_policy)
    tok = engine.tokenizer
    questions = load_questions("demo-eval", limit=4)
    cfg = EvalConfig(systems=["naive_rag"], n=4, batch_size=4, max_answer_tokens=16)
    first = evaluate(engine, index, questions, cfg)["naive_rag"]["trajectories"]
    again = evaluate(engine, index, questions, cfg)["naive_rag"]["trajectories"]
    assert [t.answer for t in first] == [t.answer for t in again]
    assert [t.token_ids for t in first] == [t.token_ids for t in again]
    check_scores(first, questions)
    hits = index.search([q["question"] for q in questions], cfg.topk)
    for t, q, hs in zip(first, questions, hits):
        prompt = tok.decode(t.token_ids[: t.prompt_len])
        # The passages, best first, then the question, then the assistant's turn opens.
        at = [prompt.index(f'Doc {i} (Title: "{h.title}")') for i, h in enumerate(hs, 1)]
        assert at == sorted(at) and at[-1] < prompt.index(f"Question: {q['question']}")
        assert prompt.endswith("<|im_start|>assistant\n")
        assert t.retrieved_ids == [h.id for h in hs]
        assert t.answer == baseline_answer(t.turns[-1].action_text) and t.answer  # SmolLM2 does reply
        assert 0 < sum(t.action_mask) <= 16
