"""SmartRAG: episodes under its rules (first-word actions, an invalid step ends the episode, a
retrieval quota), its reward with cost accounting, its SFT data builder, its PPO recipe wiring.
Real SmolLM2 tokenizer and BM25 index; turns are injected with ScriptedEngine."""
import pytest

from ragrl.rollout.protocol import get_protocol
from ragrl.datasets import load_questions
from ragrl.models.lm_weights import load_tokenizer
from ragrl.retrieval.base import Hit
from ragrl.retrieval.resolve import make_retriever
from ragrl.methods.smartrag.reward import smartrag_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.trajectory import Trajectory
from ragrl.methods.smartrag.sft import smartrag_targets
from tests.rollout.scripted import CountingRetriever, ScriptedEngine, check_token_invariants


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def index(demo_bm25_dir):
    return make_retriever(demo_bm25_dir)


@pytest.fixture(scope="module")
def sample():
    return load_questions("demo-eval", limit=1)[0]


def play(tok, index, sample, turns, **cfg) -> tuple[Trajectory, CountingRetriever]:
    protocol = get_protocol("smartrag")
    retriever = CountingRetriever(index)
    engine = ScriptedEngine(tok, protocol, {sample["question"]: turns})
    rcfg = RolloutConfig(**{"max_turns": 4, "max_turn_tokens": 48, "topk": 2, "max_searches": 2, **cfg})
    (t,), _ = run_episodes(engine, protocol, retriever, [sample], rcfg)
    return t, retriever


def test_search_then_answer_without_close_markers(tok, index, sample):
    t, retriever = play(tok, index, sample, ["[Search] Maria Golovin opera", "[Answer] Menotti"])
    check_token_invariants(t, tok, {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")})
    assert [turn.kind for turn in t.turns] == ["search", "answer"]
    assert retriever.calls == [["Maria Golovin opera"]] and t.answer == "Menotti" and t.format_errors == 0


@pytest.mark.parametrize("first,error", [
    ("[Search] Maria Golovin [Answer] Menotti", "two actions in one step"),
    ("[Search]   ", "empty query"),
    ("Let me think. [Search] Maria Golovin", "a step must start with [Search] or [Answer]"),
])
def test_an_unparseable_step_ends_the_episode_with_no_feedback(tok, index, sample, first, error):
    t, retriever = play(tok, index, sample, [first, "[Answer] Menotti"])
    assert [(turn.kind, turn.error) for turn in t.turns] == [("invalid", error)]
    assert (t.stop_reason, t.format_errors, t.answer, t.num_turns) == ("format_error", 1, None, 1)
    assert t.turns[0].observation == "" and retriever.calls == []
    assert smartrag_reward(t, sample) == -1.0


def test_a_search_past_the_quota_is_a_format_error(tok, index, sample):
    t, retriever = play(tok, index, sample, ["[Search] a", "[Search] b", "[Search] c", "[Answer] Menotti"])
    assert [turn.kind for turn in t.turns] == ["search", "search", "invalid"]
    assert t.turns[-1].error == "search past the quota of 2" and len(retriever.calls) == 2
    assert (t.num_searches, t.stop_reason) == (2, "format_error")
    assert smartrag_reward(t, sample, cost=0.2) == pytest.approx(-1.0 - 0.4)


def test_reward_is_em_plus_f1_minus_cost_per_retrieval(tok, index, sample):
    golds = {"answers": ["Gian Carlo Menotti"]}
    right, _ = play(tok, index, sample, ["[Search] q1", "[Search] q2", "[Answer] Gian Carlo Menotti"])
    assert smartrag_reward(right, golds, cost=0.2) == pytest.approx(2.0 - 0.4)
    assert smartrag_reward(right, golds, cost=0.0) == pytest.approx(2.0)
    partial, _ = play(tok, index, sample, ["[Answer] Menotti"])        # no retrieval, F1 = 2*(1*1/3)/(1+1/3)
    assert smartrag_reward(partial, golds, cost=0.5) == pytest.approx(0.5)
    # the same on text, over any alias (max), with the protocol read from the text's tags
    assert smartrag_reward("[Answer] Menotti", {"answers": ["x", "Menotti"]}) == pytest.approx(2.0)


def test_sft_builder_answers_known_questions_directly_and_searches_the_rest(tok, index):
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus

    protocol = get_protocol("smartrag")
    samples = [s for s in load_questions("demo-eval") if s.get("gold_passage_ids")][:4]
    corpus = load_corpus(DEMO_CORPUS)
    passages = {pid: Hit(pid, corpus.titles[i], corpus.texts[i], 0.0) for i, pid in enumerate(corpus.ids)}
    known = [True, False, True, False]
    trajs, counts = smartrag_targets(tok, protocol, samples, known, index, passages, RolloutConfig(topk=3))
    assert counts["direct"] == 2 and counts["search"] + counts["dropped"] == 2 and counts["search"] >= 1
    by_id = {t.sample_id: t for t in trajs}
    for s, k in zip(samples, known):
        t = by_id.get(str(s["id"]))
        if k:
            assert [turn.kind for turn in t.turns] == ["answer"] and t.num_searches == 0
            assert tok.decode(t.token_ids[t.prompt_len:]).strip() == f"[Answer] {s['answers'][0]} [/Answer]"
        elif t is not None:
            assert [turn.kind for turn in t.turns] == ["search", "answer"]
            assert t.turns[0].queries == [s["question"]]
            assert set(s["gold_passage_ids"][:3]) <= set(t.turns[0].passage_ids[0])   # gold put in
            assert protocol.is_valid_format("".join(x.action_text + x.observation for x in t.turns))


def test_closed_book_check_reads_the_models_answers(sample):
    from ragrl.engines.base import Generation
    from ragrl.methods.smartrag.sft import closed_book_right

    tok = load_tokenizer("smollm2-135m-instruct")
    other = dict(sample, id="other", question="Who wrote Hamlet?", answers=["William Shakespeare"])

    class Replies:   # injects the model's closed-book answers (the harness's direct prompt is real)
        tokenizer = tok

        def generate(self, prompts, params):
            texts = [sample["answers"][0], "Charles Dickens"]
            return [[Generation(tok.encode(x, add_special_tokens=False), [-0.1] * len(tok.encode(x, add_special_tokens=False)),
                                "eos", None, text=x)] for x in texts[:len(prompts)]]

    assert closed_book_right(Replies(), [sample, other]) == [True, False]


def test_closed_book_cover_em_counts_an_answer_said_in_a_sentence_but_not_one_copied_from_the_question():
    from ragrl.engines.base import Generation
    from ragrl.methods.smartrag.sft import closed_book_right

    tok = load_tokenizer("smollm2-135m-instruct")
    samples = [dict(id="a", question="In what country is Kuczynka?", answers=["Poland"]),
               dict(id="b", question="What is the capital of Waupaca County?", answers=["Waupaca"]),
               dict(id="c", question="Who wrote Hamlet?", answers=["William Shakespeare"])]
    replies = ["Kuczynka is a village in southern Poland.", "Waupaca County is a county in Wisconsin.",
               "Hamlet was written by Charles Dickens."]

    class Replies:
        tokenizer = tok

        def generate(self, prompts, params):
            out = []
            for x in replies[:len(prompts)]:
                ids = tok.encode(x, add_special_tokens=False)
                out.append([Generation(ids, [-0.1] * len(ids), "eos", None, text=x)])
            return out

    assert closed_book_right(Replies(), samples, criterion="em") == [False, False, False]
    assert closed_book_right(Replies(), samples, criterion="cover_em") == [True, False, False]


def test_known_if_is_refused_with_a_builder_that_does_not_read_it():
    from ragrl.errors import ConfigError
    from ragrl.train.check import check_combinations
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("smartrag_ppo", ["smartrag.known_if=cover_em", "sft.builder=gold_search"], variant="tiny")
    with pytest.raises(ConfigError, match="smartrag.known_if=cover_em is read only by sft.builder=smartrag"):
        check_combinations(cfg)
    # in another method's run, SmartRAG's section is refused whole
    cfg = load_train_config("search_r1_grpo", ["smartrag.known_if=cover_em"], variant="tiny")
    with pytest.raises(ConfigError, match="smartrag.known_if is a setting of SmartRAG"):
        check_combinations(cfg)
    # the key it had before still loads, read as the new one
    assert load_train_config("smartrag_ppo", ["sft.known_if=cover_em"]).smartrag.known_if == "cover_em"


def test_smartrag_ppo_recipe_runs_with_adaptive_kl_in_the_reward(tiny_model_dir, demo_bm25_dir, tmp_path):
    """Two PPO steps of the tiny recipe on a tiny random model: value head, KL in the reward, and
    RL4LMs' controller moving the coefficient by at most 2% per update."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    cfg = load_train_config("smartrag_ppo", [
        f"model.name={tiny_model_dir}", "model.dtype=float32", f"data.index={demo_bm25_dir}", "data.train=demo-train",
        "steps=2", "questions_per_step=2", "rollout.max_turn_tokens=8", "rollout.max_response_tokens=48",
        "sft.steps=0", f"out_dir={tmp_path / 'run'}", "save_every=10"], variant="tiny")
    trainer = Trainer(cfg)
    rows = trainer.train(progress=False)
    assert len(rows) == 2 and "value_loss" in rows[0] and "kl_ref" in rows[0]
    # logged after the step's update: the initial 0.001 moved by exactly ±2% (KL far from target)
    assert min(abs(rows[0]["kl_coef"] - 0.001 * f) for f in (0.98, 1.02)) < 1e-12
    ratio = trainer.kl.value / 0.001
    assert ratio != 1.0 and 0.98 ** 2 - 1e-12 <= ratio <= 1.02 ** 2 + 1e-12
    assert all(r["reward_mean"] <= 2.0 for r in rows)


def test_threshold_mode_forces_the_action_the_threshold_picks(demo_bm25_dir):
    """SmartRAG's inference mode on the real SmolLM2: threshold 0 always searches first, threshold
    1 always answers at once; p_search is the same number either way."""
    from ragrl.eval.harness import EvalConfig, evaluate
    from ragrl.models.lm_weights import load_policy
    from ragrl.engines.threshold import ThresholdDecisionEngine
    from ragrl.engines.hf import HFEngine

    model, tok = load_policy("smollm2-135m-instruct")
    protocol = get_protocol("smartrag")
    samples = load_questions("demo-eval", limit=2)
    rcfg = RolloutConfig(max_turns=2, max_turn_tokens=12, max_response_tokens=80, topk=2, max_searches=1)
    firsts = {}
    for threshold in (0.0, 1.0):
        engine = ThresholdDecisionEngine(HFEngine(model, tok), protocol.query[0], protocol.answer[0], threshold)
        res = evaluate(engine, make_retriever(demo_bm25_dir), samples,
                       EvalConfig(agent="smartrag", systems=["agent"], n=2, rollout=rcfg))
        trajs = res["smartrag"]["trajectories"]
        firsts[threshold] = ([t.turns[0].action_text.split()[0] for t in trajs], engine.decisions[:2])
    assert firsts[0.0][0] == ["[Search]", "[Search]"] and firsts[1.0][0] == ["[Answer]", "[Answer]"]
    assert firsts[0.0][1] == pytest.approx(firsts[1.0][1]) and all(0 < p < 1 for p in firsts[0.0][1])
