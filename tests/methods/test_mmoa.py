"""MMOA-RAG: the selector's grammar, the penalties, the pipeline runner's episodes and branches, its
SFT examples and settings (MAPPO's training: test_mmoa_mappo.py). Real tokenizer, a real (tiny
random) model for the grammar, a real BM25 index."""
import pytest

from ragrl.methods.mmoa.protocol import (MMOAProtocol, generator_penalized, parse_selection, parse_subquestions,
                               selector_grammar, split_budget)
from ragrl.datasets import load_questions
from ragrl.errors import ConfigError
from ragrl.retrieval.resolve import make_retriever
from ragrl.methods.mmoa.reward import mmoa_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.methods.mmoa.pipeline import run_mmoa_episodes
from ragrl.methods.mmoa.settings import MMOASettings, evaluation_settings


def test_constrained_selector_decoding_only_produces_valid_id_lists(tiny_model_dir):
    """A random model samples freely (temperature 1) under the grammar: every output parses as a
    non-empty list of distinct in-range ids, with no penalty."""
    from ragrl.models.lm_weights import load_policy
    from ragrl.engines.base import SamplingParams
    from ragrl.engines.hf import HFEngine

    model, tok = load_policy(str(tiny_model_dir))
    engine = HFEngine(model, tok)
    prompt = tok.encode("Choose documents:", add_special_tokens=False)
    seen = set()
    for n_docs in (1, 3, 7, 10):
        gens = engine.generate([prompt], SamplingParams(max_new_tokens=24, temperature=1.0, n=40, seed=n_docs,
                                                        allowed_tokens=selector_grammar(tok, n_docs)))[0]
        for g in gens:
            ids, penalized = parse_selection(g.text, n_docs)
            assert not penalized and ids and len(ids) == len(set(ids)) and max(ids) < n_docs, g.text
            assert all(lp <= 0.0 for lp in g.logprobs)   # raw log-probs, recorded as such
            seen.add(len(ids))
    assert len(seen) > 2   # the grammar lets the model choose how many to keep


def test_penalties_on_hand_made_cases():
    q = "Who composed the opera?"
    five = "\n".join(f"{i}. sub {i}" for i in range(1, 6))
    assert parse_subquestions(five, q) == (["sub 1", "sub 2", "sub 3", "sub 4"], True)      # cut to 4, penalized
    assert parse_subquestions("\n".join(["x"] * 9), q) == ([q], True)                       # unusable: fallback
    assert parse_subquestions("", q) == ([q], False)
    assert parse_subquestions("a" * 301, q)[1] is True                                      # over 300 characters
    assert parse_selection("Document1,Document9", 5) == ([1], True)                          # out of range
    assert parse_selection("Doc1", 5) == ([], True)                                         # malformed
    assert parse_selection("Document2,Document2", 5) == ([2], True)                          # repeated
    assert parse_selection("Document2", 5) == ([2], False)
    assert generator_penalized(" ".join(["word"] * 31)) and not generator_penalized(" ".join(["word"] * 30))
    assert split_budget(1) == [10] and split_budget(2) == [5, 5] and split_budget(4) == [3, 3, 2, 2]


def test_selector_beta_and_the_weights_are_checked_when_the_reward_is_built():
    from ragrl.rewards.registry import make_reward
    assert make_reward({"mmoa": {"selector_gold": 3.0, "selector_beta": 2.0}})
    for bad in (0, -1.0, "2", True):
        with pytest.raises(ConfigError, match="selector_beta must be a number > 0"):
            make_reward({"mmoa": {"selector_gold": 3.0, "selector_beta": bad}})
    assert make_reward({"mmoa": {"rewriter_gold": 3, "selector_penalty": 0.5}})
    for name in ("rewriter_gold", "selector_gold", "rewriter_penalty"):
        for bad in ("3", True, None):
            with pytest.raises(ConfigError, match=f"{name} must be a number"):
                make_reward({"mmoa": {name: bad}})


@pytest.fixture(scope="module")
def index(demo_bm25_dir):
    return make_retriever(demo_bm25_dir)


def test_pipeline_runner_writes_one_trajectory_per_agent(tiny_model_dir, index):
    from ragrl.models.lm_weights import load_policy
    from ragrl.engines.hf import HFEngine

    model, tok = load_policy(str(tiny_model_dir))
    samples = load_questions("demo-eval", limit=2)
    trajs, stats = run_mmoa_episodes(HFEngine(model, tok), MMOAProtocol(), index, samples,
                                     RolloutConfig(n=2, temperature=1.0, seed=0))
    assert [t.agent for t in trajs] == ["rewriter", "selector", "generator"] * 4
    assert len({t.group for t in trajs}) == 6          # one group per (question, agent): GRPO never mixes agents
    for k in range(0, 12, 3):
        r, s, g = trajs[k:k + 3]
        assert r.answer == s.answer == g.answer          # the shared outcome
        n_docs = len(r.metrics["retrieved"])
        assert 1 <= n_docs <= 10 and len(set(r.metrics["retrieved"])) == n_docs      # de-duplicated
        assert set(s.metrics["selected"]) <= set(r.metrics["retrieved"]) and s.metrics["penalized"] is False
        # what the trainer logs per step (rollout/<name>)
        assert s.metrics["scalars"]["selector_kept"] == len(s.metrics["selected"])
        assert r.metrics["scalars"] == {"rewriter_subquestions": len(r.metrics["subquestions"])}
        # what the generator read, ids and texts, as a search agent records them (a search reward reads them)
        assert [pid for pid, _ in g.shown_passages()] == s.metrics["selected"]
        assert set(r.metrics["retrieved"]) <= {pid for pid, _ in r.shown_passages()}
        assert all(text.strip() for _, text in g.shown_passages() + r.shown_passages())
        for t in (r, s, g):
            assert t.action_mask[:t.prompt_len] == [0] * t.prompt_len and sum(t.action_mask) > 0
            assert len(t.token_ids) == len(t.logprobs) == len(t.action_mask)
    # the shared F1 plus the agent's own penalty
    t = trajs[0]
    t.metrics["penalized"] = True
    assert mmoa_reward(t, samples[0]) == pytest.approx(mmoa_reward(trajs[2], samples[0]) - 0.5)


def test_pipeline_branches_at_the_selector_and_groups_each_pipelines_selections(tiny_model_dir, index):
    """mmoa.selector_samples = 3: each pipeline keeps one rewriter output and its candidates, the
    selector samples 3 selections of them (one group per pipeline, so a group baseline compares
    selections of the same candidates) and the generator answers each; evaluation never branches."""
    from ragrl.eval.harness import EvalConfig, evaluate
    from ragrl.models.lm_weights import load_policy
    from ragrl.engines.hf import HFEngine

    model, tok = load_policy(str(tiny_model_dir))
    engine = HFEngine(model, tok)
    samples = load_questions("demo-eval", limit=2)
    trajs, _ = run_mmoa_episodes(engine, MMOAProtocol(), index, samples,
                                 RolloutConfig(n=2, temperature=1.0, seed=0), settings=MMOASettings(selector_samples=3))
    assert [t.agent for t in trajs] == (["rewriter"] + ["selector", "generator"] * 3) * 4   # 2 questions x n=2
    differ = 0
    for k in range(0, 28, 7):
        r, sels, gens = trajs[k], trajs[k + 1:k + 7:2], trajs[k + 2:k + 7:2]
        prompt = sels[0].token_ids[:sels[0].prompt_len]
        assert all(s.token_ids[:s.prompt_len] == prompt for s in sels)        # the same candidates, one prompt
        assert all(t.metrics["retrieved"] == r.metrics["retrieved"] for t in sels + gens)
        assert len({s.group for s in sels}) == 1
        for s, g in zip(sels, gens):
            assert s.answer == g.answer and s.metrics["selected"] == g.metrics["selected"]   # its own answer
        assert r.answer == gens[0].answer and r.metrics["selected"] == sels[0].metrics["selected"]
        differ += len({tuple(s.token_ids[s.prompt_len:]) for s in sels}) > 1
    assert differ >= 1                                   # sampled per branch, not copied
    selector_groups = {t.group for t in trajs if t.agent == "selector"}
    other_groups = {t.group for t in trajs if t.agent != "selector"}
    assert len(selector_groups) == 4 and len(other_groups) == 4 and not selector_groups & other_groups
    branched = evaluation_settings(MMOASettings(selector_samples=3))   # what evaluation passes the runner
    assert branched.selector_samples == 1
    res = evaluate(engine, index, samples, EvalConfig(agent="mmoa", systems=["agent"], n=2, runner_settings=branched,
                                                      rollout=RolloutConfig(temperature=0.0)))
    answers = res["mmoa"]["trajectories"]
    assert [t.agent for t in answers] == ["generator", "generator"]   # one answer a question
    # the answer carries its pipeline's searches (the rewriter's sub-questions), as compare counts them
    assert [t.num_searches for t in answers] == [len(t.metrics["subquestions"]) for t in answers]
    assert any(t.num_searches > 0 for t in answers)


def test_greedy_agents_decode_greedily_while_the_others_sample(tiny_model_dir, index):
    """mmoa.greedy_agents=[selector, generator] at temperature 1: the 3 selections of one pipeline
    (one prompt) are the same, and so are the answers to the same kept documents, while the
    rewriter still samples; evaluation resets the list."""
    from ragrl.models.lm_weights import load_policy
    from ragrl.engines.hf import HFEngine

    model, tok = load_policy(str(tiny_model_dir))
    engine = HFEngine(model, tok)
    samples = load_questions("demo-eval", limit=2)
    cfg = RolloutConfig(n=3, temperature=1.0, seed=0)
    own = MMOASettings(selector_samples=3, greedy_agents=["selector", "generator"])
    trajs, _ = run_mmoa_episodes(engine, MMOAProtocol(), index, samples, cfg, settings=own)
    assert [t.agent for t in trajs] == (["rewriter"] + ["selector", "generator"] * 3) * 6
    rewrites = {}
    for k in range(0, 42, 7):
        r, sels, gens = trajs[k], trajs[k + 1:k + 7:2], trajs[k + 2:k + 7:2]
        assert len({tuple(s.token_ids[s.prompt_len:]) for s in sels}) == 1       # greedy: one selection
        assert len({g.answer for g in gens}) == 1                                # the same documents, one answer
        rewrites.setdefault(r.sample_id, set()).add(tuple(r.token_ids[r.prompt_len:]))
    assert any(len(v) > 1 for v in rewrites.values())                            # the rewriter still samples
    with pytest.raises(ConfigError, match="'retriever' is not an agent of the MMOA pipeline"):
        run_mmoa_episodes(engine, MMOAProtocol(), index, samples, RolloutConfig(),
                          settings=MMOASettings(greedy_agents=["retriever"]))


def test_pipeline_branches_at_the_generator_and_groups_each_selections_answers(tiny_model_dir, index):
    """mmoa.generator_samples = 3: each selection is answered 3 times from one prompt (its kept
    documents), the 3 answers one group, so a group baseline compares answers to the same context;
    the selector (and rewriter) trajectory carries its first answer; evaluation never branches."""
    from ragrl.eval.harness import EvalConfig, evaluate
    from ragrl.models.lm_weights import load_policy
    from ragrl.engines.hf import HFEngine

    model, tok = load_policy(str(tiny_model_dir))
    engine = HFEngine(model, tok)
    samples = load_questions("demo-eval", limit=2)
    trajs, _ = run_mmoa_episodes(engine, MMOAProtocol(), index, samples, RolloutConfig(n=1, temperature=1.0, seed=0),
                                 settings=MMOASettings(selector_samples=2, generator_samples=3))
    per_pipeline = ["rewriter"] + (["selector"] + ["generator"] * 3) * 2
    assert [t.agent for t in trajs] == per_pipeline * 2                   # 2 questions x n=1
    differ = 0
    for q in range(2):
        block = trajs[q * 9:(q + 1) * 9]
        for k in range(2):
            sel, gens = block[1 + 4 * k], block[2 + 4 * k:5 + 4 * k]
            prompt = gens[0].token_ids[:gens[0].prompt_len]
            assert all(g.token_ids[:g.prompt_len] == prompt for g in gens)   # one context
            assert all(g.metrics["selected"] == sel.metrics["selected"] for g in gens)
            assert len({g.group for g in gens}) == 1 and sel.answer == gens[0].answer
            differ += len({tuple(g.token_ids[g.prompt_len:]) for g in gens}) > 1
        assert block[0].answer == block[2].answer                            # the rewriter's: the first answer
    assert differ >= 1                                                       # sampled per branch, not copied
    by_agent = {a: {t.group for t in trajs if t.agent == a} for a in ("rewriter", "selector", "generator")}
    assert len(by_agent["generator"]) == 4 and len(by_agent["selector"]) == 2 and len(by_agent["rewriter"]) == 2
    assert not (by_agent["generator"] & (by_agent["selector"] | by_agent["rewriter"]))
    assert not by_agent["selector"] & by_agent["rewriter"]
    res = evaluate(engine, index, samples, EvalConfig(agent="mmoa", systems=["agent"], n=2,
                                                      runner_settings=evaluation_settings(MMOASettings(generator_samples=3)),
                                                      rollout=RolloutConfig(temperature=0.0)))
    assert [t.agent for t in res["mmoa"]["trajectories"]] == ["generator", "generator"]   # one answer a question


def test_sft_examples_target_gold_passages_and_answers(index):
    from ragrl.models.lm_weights import load_tokenizer
    from ragrl.methods.mmoa.sft import mmoa_sft_examples

    tok = load_tokenizer("smollm2-135m-instruct")
    samples = [s for s in load_questions("demo-eval") if s.get("gold_passage_ids")][:5]
    trajs, counts = mmoa_sft_examples(tok, MMOAProtocol(), samples, index)
    assert counts["rewriter"] == counts["generator"] == 5 and counts["selector"] >= 1
    for t in trajs:
        target = t.turns[0].action_text
        assert tok.decode(t.token_ids[t.prompt_len:-1]) == target and sum(t.action_mask) == len(t.token_ids) - t.prompt_len
        if t.agent == "selector":
            assert parse_selection(target, 10)[1] is False
        if t.agent == "generator":
            assert target == next(s for s in samples if str(s["id"]) == t.sample_id)["answers"][0]


def test_agent_settings_that_cannot_apply_are_refused():
    from ragrl.train.check import check_agents
    from ragrl.train.recipe import load_train_config

    with pytest.raises(ConfigError, match="'retriever' is not an agent of 'mmoa'"):
        check_agents(load_train_config("mmoa_mappo", ["frozen_agents=[retriever]"], variant="tiny"))
    with pytest.raises(ConfigError, match="single policy"):
        check_agents(load_train_config("search_r1_grpo", ["agent_adapters=per_agent"], variant="tiny"))
    with pytest.raises(ConfigError, match="frozen_agents"):
        check_agents(load_train_config("search_r1_grpo", ["frozen_agents=[generator]"], variant="tiny"))
    with pytest.raises(ConfigError, match="model.lora is false"):
        check_agents(load_train_config("mmoa_mappo", ["agent_adapters=per_agent", "model.lora=false"], variant="tiny"))
    from ragrl.train.check import check_combinations

    # the pipeline's own settings are MMOA-RAG's section: refused in another method's run, checked in its own
    with pytest.raises(ConfigError, match="mmoa.selector_samples is a setting of MMOA-RAG.*this run is search_r1"):
        check_combinations(load_train_config("search_r1_grpo", ["mmoa.selector_samples=2"], variant="tiny"))
    with pytest.raises(ConfigError, match="mmoa.selector_samples must be an integer >= 1, got 0"):
        check_combinations(load_train_config("mmoa_mappo", ["mmoa.selector_samples=0"], variant="tiny"))
    check_combinations(load_train_config("mmoa_mappo", ["mmoa.selector_samples=4"], variant="tiny"))   # accepted
    with pytest.raises(ConfigError, match="mmoa.generator_samples is a setting of MMOA-RAG"):
        check_combinations(load_train_config("search_r1_grpo", ["mmoa.generator_samples=3"], variant="tiny"))
    with pytest.raises(ConfigError, match="mmoa.generator_samples must be an integer >= 1, got 0"):
        check_combinations(load_train_config("mmoa_mappo", ["mmoa.generator_samples=0"], variant="tiny"))
    with pytest.raises(ConfigError, match="mmoa.greedy_agents: 'retriever' is not an agent of the MMOA pipeline"):
        check_combinations(load_train_config("mmoa_mappo", ["mmoa.greedy_agents=[retriever]"], variant="tiny"))
    with pytest.raises(ConfigError, match="mmoa.greedy_agents is a setting of MMOA-RAG"):
        check_combinations(load_train_config("search_r1_grpo", ["mmoa.greedy_agents=[generator]"], variant="tiny"))
    check_combinations(load_train_config("mmoa_mappo", ["mmoa.greedy_agents=[selector,generator]"], variant="tiny"))
    with pytest.raises(ConfigError, match=r"unknown config key 'mmoa.selector_sample'; did you mean 'mmoa.selector_samples'"):
        load_train_config("mmoa_mappo", ["mmoa.selector_sample=2"], variant="tiny")


def test_the_pipelines_old_rollout_keys_still_load_as_its_own_with_a_deprecation_message(caplog):
    """rollout.selector_samples (and the other two) moved into the `mmoa:` section: a recipe or a run's
    config.yaml written before still loads, read as the new key, and says so; both spellings at once
    are refused."""
    from ragrl.train.recipe import load_train_config

    with caplog.at_level("WARNING", logger="ragrl.config"):
        cfg = load_train_config("mmoa_mappo", ["rollout.selector_samples=3", "rollout.greedy_agents=[selector]"],
                                variant="tiny")
    assert (cfg.mmoa.selector_samples, cfg.mmoa.greedy_agents) == (3, ["selector"])
    assert not hasattr(cfg.rollout, "selector_samples")
    assert "'rollout.selector_samples' is deprecated: it is now 'mmoa.selector_samples'" in caplog.text
    with pytest.raises(ConfigError, match="'rollout.selector_samples' and 'mmoa.selector_samples' are both set"):
        load_train_config("mmoa_mappo", ["rollout.selector_samples=3", "mmoa.selector_samples=2"], variant="tiny")
    # a run's config.yaml written before the move holds every key at its default: read, and not announced
    caplog.clear()
    with caplog.at_level("WARNING", logger="ragrl.config"):
        assert load_train_config("search_r1_grpo", ["rollout.generator_samples=1"]).mmoa.generator_samples == 1
    assert "generator_samples" not in caplog.text
