"""MMOA-RAG: the selector's grammar, the penalties, per-agent samples under MAPPO, frozen agents,
and the pipeline runner feeding the same trainer as the multi-turn runner. Real tokenizer,
a real (tiny random) model for the grammar, a real BM25 index."""
import json

import pytest
import torch

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


def test_each_agents_advantages_use_its_own_values():
    """GAE runs per sample: an agent's returns depend on its own rewards only, and its raw
    advantages on its own values (before the batch whitening)."""
    from ragrl.algos.advantages import gae, place_outcome_reward

    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)   # 3 agents' samples
    rewards = place_outcome_reward(torch.tensor([1.0, 0.0, 0.5]), mask)
    values = torch.tensor([[0, 0.2, 0.4, 0], [0, 0, 0.1, 0.3], [0.6, 0.7, 0, 0]])
    adv, ret = gae(rewards, values, mask, whiten=False)
    other = values.clone()
    other[1] = torch.tensor([0, 0, 0.9, 0.9])          # change only agent 1's critic values
    adv2, ret2 = gae(rewards, other, mask, whiten=False)
    assert torch.equal(adv[[0, 2]], adv2[[0, 2]]) and torch.allclose(ret, ret2, atol=1e-6)
    assert torch.allclose(adv[1, 2:], torch.tensor([0.0 - 0.1, 0.0 - 0.3]))   # gamma = lam = 1: R - V


def test_mappo_trainer_consumes_pipeline_trajectories_and_freezes_agents(tiny_model_dir, demo_bm25_dir, tmp_path):
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    base = [f"model.name={tiny_model_dir}", "model.dtype=float32", f"data.index={demo_bm25_dir}",
            "data.train=demo-train", "steps=1", "questions_per_step=2", "sft.steps=0", "save_every=10"]
    cfg = load_train_config("mmoa_mappo", base + [f"out_dir={tmp_path / 'all'}"], variant="tiny")
    rows = Trainer(cfg).train(progress=False)
    assert rows[0]["updates"] >= 1 and "value_loss" in rows[0]
    # frozen rewriter and selector: only the generator's samples reach the update
    cfg = load_train_config("mmoa_mappo", base + [f"out_dir={tmp_path / 'gen'}", "frozen_agents=[rewriter,selector]"],
                            variant="tiny")
    trainer = Trainer(cfg)
    seen = []
    collate = trainer.policy.collate
    trainer.policy.collate = lambda trajs: (seen.extend(t.agent for t in trajs), collate(trajs))[1]
    trainer.train(progress=False)
    assert seen and set(seen) == {"generator"}
    # every agent frozen: refused, and nothing changed
    cfg = load_train_config("mmoa_mappo", base + [f"out_dir={tmp_path / 'none'}",
                                                  "frozen_agents=[rewriter,selector,generator]"], variant="tiny")
    trainer = Trainer(cfg)
    before = [p.detach().clone() for p in trainer.policy.trainable_parameters()]
    with pytest.raises(ConfigError, match="no trajectory to learn from"):
        trainer.train(progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.trainable_parameters()))


def test_critic_warmup_trains_only_the_value_head_for_its_steps(tiny_model_dir, demo_bm25_dir, tmp_path, monkeypatch):
    from ragrl.train import trainer as trainer_module
    from ragrl.train import update as update_module
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("mmoa_mappo", [f"model.name={tiny_model_dir}", "model.dtype=float32",
                                           f"data.index={demo_bm25_dir}", "data.train=demo-train", "steps=3",
                                           "critic_warmup=2", "questions_per_step=2", "sft.steps=0",
                                           "save_every=10", f"out_dir={tmp_path / 'run'}"], variant="tiny")
    trainer = trainer_module.Trainer(cfg)
    lora = [p for p in trainer.policy.module.parameters() if p.requires_grad]
    head = list(trainer.policy.value_head.parameters())
    moved = []   # per step: (critic_only, LoRA changed, value head changed)
    real = update_module.ppo_update

    def recording(policy, *args, critic_only=False, **kw):
        before = [p.detach().clone() for p in lora + head]
        out = real(policy, *args, critic_only=critic_only, **kw)
        changed = [not torch.equal(b, p) for b, p in zip(before, lora + head)]
        moved.append((critic_only, any(changed[:len(lora)]), any(changed[len(lora):])))
        return out

    monkeypatch.setattr(update_module, "ppo_update", recording)
    rows = trainer.train(progress=False)
    assert moved == [(True, False, True), (True, False, True), (False, True, True)]
    assert [r["critic_only"] for r in rows] == [1.0, 1.0, 0.0]
    # one reward mean and penalty rate per agent; together they make up the overall mean
    for r in rows:
        per_agent = [r[f"reward/{a}"] for a in ("rewriter", "selector", "generator")]
        assert r["reward_mean"] == pytest.approx(sum(per_agent) / 3, abs=1e-6)
        assert all(0.0 <= r[f"penalized/{a}"] <= 1.0 for a in ("rewriter", "selector", "generator"))
        assert 1.0 <= r["rollout/rewriter_subquestions"] <= 4.0 and 0.0 <= r["rollout/selector_kept"] <= 10.0


@pytest.mark.parametrize("selector_samples,generator_samples", [(1, 1), (2, 1), (1, 2)])
def test_mappo_with_group_baseline_centres_each_agents_rewards_on_its_own_samples(tiny_model_dir, demo_bm25_dir,
                                                                                   tmp_path, monkeypatch,
                                                                                   selector_samples, generator_samples):
    """gae_baseline (the `tiny_grouped` variant, one step): the critic still scores every agent's
    sample, but its targets are the rewards centred per (question, agent) group of rollout.n
    samples, so with gamma = lam = 1 they sum to 0 in each group (and a group's samples share one
    prompt, hence one agent). With mmoa.selector_samples = 2 the selector's groups are its 2
    selections of one pipeline, and each pipeline's generator answers both; with
    mmoa.generator_samples = 2 the generator's groups are the 2 answers to one selection."""
    from ragrl.train import trainer as trainer_module
    from ragrl.train import update as update_module
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("mmoa_mappo", [f"model.name={tiny_model_dir}", "model.dtype=float32",
                                           f"data.index={demo_bm25_dir}", "data.train=demo-train", "steps=1",
                                           "rollout.n=2", "questions_per_step=2", "sft.steps=0", "save_every=10",
                                           "eval_every=1", "data.eval=demo-eval", "data.eval_n=2",
                                           f"mmoa.selector_samples={selector_samples}",
                                           f"mmoa.generator_samples={generator_samples}",
                                           f"out_dir={tmp_path / 'run'}"], variant="tiny_grouped")
    assert (cfg.algo.estimator, cfg.algo.lam, cfg.keep_best) == ("gae_baseline", 1.0, "selector_f1")
    trainer = trainer_module.Trainer(cfg)
    assert trainer.policy.has_values
    seen = []
    real = update_module.prepare

    def recording(policy, batch, *a, **k):
        # The tiny random model's rewards are flat (every rewriter penalised, F1 0): give each
        # sample a distinct score, so that centring has something to remove.
        batch.scores = torch.arange(len(batch.scores), dtype=batch.scores.dtype) * 0.1
        seen.append((batch, real(policy, batch, *a, **k)))
        return seen[-1][1]

    monkeypatch.setattr(update_module, "prepare", recording)
    rows = trainer.train(progress=False)
    assert rows[0]["updates"] >= 1 and "value_loss" in rows[0]
    assert "eval/selector_f1" in rows[-1] and (tmp_path / "run" / "best_adapter").is_dir()   # keep_best ran
    assert 0.0 <= rows[-1]["eval/selector_kept"] <= 10.0
    batch, prep = seen[0]
    mask = batch.action_mask.bool()
    first = mask.float().argmax(dim=1)
    target = prep.returns[torch.arange(len(first)), first]         # the centred outcome of each sample
    groups = batch.group_ids.tolist()
    k, g = selector_samples, generator_samples   # 2 questions x n=2 pipelines: 1 rewriter, k selector, k x g generator
    assert len(groups) == 2 * 2 * (1 + k * (1 + g))
    sizes = sorted(groups.count(x) for x in set(groups))
    # (question, rewriter) groups; selector: per question (k=1) or per pipeline; generator: per
    # question (g=1) or per selection
    expected = [2] * 2 + ([2] * 2 if k == 1 else [k] * 4) + ([2 * k] * 2 if g == 1 else [g] * (4 * k))
    assert sizes == sorted(expected)
    for g in set(groups):
        rows = [r for r, x in enumerate(groups) if x == g]
        mean = float(batch.scores[rows].mean())
        for i in rows:
            assert float(target[i]) == pytest.approx(float(batch.scores[i]) - mean, abs=1e-5)
        assert float(target[rows].sum()) == pytest.approx(0.0, abs=1e-5)


def test_eval_start_evaluates_the_start_and_offers_it_to_keep_best(tiny_model_dir, demo_bm25_dir, tmp_path,
                                                                  monkeypatch):
    """eval_start=true: the starting policy is evaluated before the first step (`start/<metric>` in
    step 0's row) and is keep_best's first candidate. The tiny random model answers nothing right
    (F1 0 before and after its step), so the tie keeps the start: best.json says step 0 and
    best_adapter holds the start's weights, not the trained ones (lr 1e-2 moves them)."""
    from safetensors.torch import load_file

    from ragrl.train import trainer as trainer_module
    from ragrl.train import update as update_module
    from ragrl.train.recipe import load_train_config

    real = update_module.prepare

    def varied(policy, batch, *a, **k):
        # Flat rewards (all 0) would leave the weights where they began: give each sample its own.
        batch.scores = torch.arange(len(batch.scores), dtype=batch.scores.dtype) * 0.1
        return real(policy, batch, *a, **k)

    monkeypatch.setattr(update_module, "prepare", varied)

    cfg = load_train_config("mmoa_mappo", [f"model.name={tiny_model_dir}", "model.dtype=float32",
                                           f"data.index={demo_bm25_dir}", "data.train=demo-train", "steps=1",
                                           "rollout.n=2", "questions_per_step=2", "sft.steps=0", "save_every=10",
                                           "eval_every=1", "data.eval=demo-eval", "data.eval_n=2", "keep_best=f1",
                                           "eval_start=true", "lr=1e-2", f"out_dir={tmp_path / 'run'}"],
                            variant="tiny_grouped")
    rows = trainer_module.Trainer(cfg).train(progress=False)
    assert rows[0]["start/f1"] == 0.0 and rows[0]["eval/f1"] == 0.0 and "start/selector_f1" in rows[0]
    assert json.loads((tmp_path / "run" / "best.json").read_text())["step"] == 0
    best = load_file(str(tmp_path / "run" / "best_adapter" / "adapter_model.safetensors"))
    final = load_file(str(tmp_path / "run" / "final_adapter" / "adapter_model.safetensors"))
    assert best.keys() == final.keys()
    assert any(not torch.equal(best[k], final[k]) for k in best)          # the start, not the trained policy
    b_keys = [k for k in best if "lora_B" in k]
    assert b_keys and all(float(best[k].abs().max()) == 0.0 for k in b_keys)   # LoRA's start: B = 0


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


def _lora_state(model, adapter):
    from peft import get_peft_model_state_dict
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=adapter).items()}


def test_per_agent_adapters_train_only_unfrozen_agents_and_export_one_folder_each(tiny_model_dir, demo_bm25_dir,
                                                                                  tmp_path):
    """agent_adapters=per_agent: one LoRA copy per agent; with the selector and generator frozen, one
    MAPPO step changes the rewriter's adapter (the random model's rewrites are penalized, so its
    advantages are not zero) and leaves theirs bit-identical; the export holds one folder per
    agent, and `load_adapters` reads it back as per-agent adapters."""
    from ragrl.models.agent_adapters import agent_adapter_map, load_adapters
    from ragrl.models.lm_weights import load_policy
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    out = tmp_path / "per_agent"
    cfg = load_train_config("mmoa_mappo", [f"model.name={tiny_model_dir}", "model.dtype=float32",
                                           f"data.index={demo_bm25_dir}", "data.train=demo-train", "steps=1",
                                           "questions_per_step=2", "sft.steps=0", "save_every=10", "lr=1e-2",
                                           f"out_dir={out}", "agent_adapters=per_agent",
                                           "frozen_agents=[selector,generator]"], variant="tiny")
    trainer = Trainer(cfg)
    model = trainer.policy.module
    assert agent_adapter_map(model) == {a: a for a in ("rewriter", "selector", "generator")}
    assert "default" not in model.peft_config
    before = {a: _lora_state(model, a) for a in ("rewriter", "selector", "generator")}
    trainer.train(progress=False)
    after = {a: _lora_state(model, a) for a in ("rewriter", "selector", "generator")}
    for frozen in ("selector", "generator"):
        assert all(torch.equal(before[frozen][k], after[frozen][k]) for k in before[frozen])
    assert any(not torch.equal(before["rewriter"][k], after["rewriter"][k]) for k in before["rewriter"])
    final = out / "final_adapter"
    assert {p.name for p in final.iterdir() if p.is_dir()} >= {"rewriter", "selector", "generator"}
    base, _ = load_policy(str(tiny_model_dir))
    loaded = load_adapters(base, final)
    assert agent_adapter_map(loaded) == {a: a for a in ("rewriter", "selector", "generator")}
    got = _lora_state(loaded, "rewriter")
    assert all(torch.allclose(got[k], after["rewriter"][k]) for k in got)


def test_tiny_joint_variant_is_run_ks_settings_and_trains_a_step(tiny_model_dir, demo_bm25_dir, tmp_path):
    """`--variant tiny_joint` (the README's run K): every agent trained with its own adapter, the
    rewriter credited with its pipeline's kept documents, sampled at 0.7 with one selection a
    pipeline; one step on the tiny model trains, logs each agent's reward and exports three adapters."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    out = tmp_path / "joint"
    cfg = load_train_config("mmoa_mappo", [f"model.name={tiny_model_dir}", "model.dtype=float32",
                                           f"data.index={demo_bm25_dir}", "data.train=demo-train", "steps=1",
                                           "rollout.n=2", "questions_per_step=2", "sft.steps=0", f"out_dir={out}"],
                            variant="tiny_joint")
    assert (cfg.agent_adapters, cfg.frozen_agents, cfg.mmoa.greedy_agents) == ("per_agent", [], [])
    assert (cfg.reward["mmoa"]["rewriter_gold"], cfg.reward["mmoa"]["selector_gold"]) == (3.0, 3.0)
    assert (cfg.rollout.temperature, cfg.mmoa.selector_samples, cfg.algo.estimator) == (0.7, 1, "gae_baseline")
    assert (cfg.keep_best, cfg.eval_every) == (None, 0)
    rows = Trainer(cfg).train(progress=False)
    assert len(rows) == 1 and rows[0]["updates"] >= 1
    assert {"reward/rewriter", "reward/selector", "reward/generator"} <= set(rows[0])
    assert {p.name for p in (out / "final_adapter").iterdir() if p.is_dir()} >= {"rewriter", "selector", "generator"}


def test_per_agent_forward_runs_each_row_under_its_own_agents_adapter(tiny_model_dir):
    """A mixed batch (rows of two agents) gives each row what that agent's adapter alone gives it,
    so a row's log-probs and values never come from another agent's weights; gradients reach only
    the adapters of the rows' agents."""
    from peft import LoraConfig, get_peft_model

    from ragrl.models.agent_adapters import activate_agent, make_agent_adapters
    from ragrl.models.lm_weights import load_policy
    from ragrl.policy.lm import LMPolicy
    from ragrl.rollout.trajectory import Trajectory
    from ragrl.policy.lm_model import ValueHead

    base, tok = load_policy(str(tiny_model_dir))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    make_agent_adapters(model, ["rewriter", "selector", "generator"], trainable={"rewriter", "selector"})
    g = torch.Generator().manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:                       # zero at init: make the agents differ
            p.data.normal_(0, 0.5, generator=g)
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.proj.weight, std=0.5)
    policy = LMPolicy(model, tok, head, agents=("rewriter", "selector", "generator"))
    trajs = [Trajectory(sample_id=str(i), question="q", golds=[], token_ids=list(range(5 + i, 25 + 2 * i)),
                        action_mask=[0] * 6 + [1] * (14 + i), logprobs=[0.0] * (20 + i), prompt_len=6, group=i,
                        agent=agent) for i, agent in enumerate(["selector", "rewriter", "selector", "rewriter"])]
    batch = policy.collate(trajs)
    assert batch.agent_ids.tolist() == [1, 0, 1, 0]
    out = policy.forward(batch, with_values=True)
    for i, t in enumerate(trajs):
        activate_agent(model, t.agent)
        with torch.no_grad():
            alone = LMPolicy(model, tok, head).forward(policy.collate([t]).select([0]), with_values=True)
        n = len(t.token_ids)
        assert torch.allclose(out["logprobs"][i, :n], alone["logprobs"][0], atol=1e-5)
        assert torch.allclose(out["values"][i, :n], alone["values"][0], atol=1e-5)
    model.zero_grad()
    (out["logprobs"].sum() + out["values"].sum()).backward()
    grads = {a: sum(float(p.grad.abs().sum()) for n, p in model.named_parameters()
                    if f".{a}." in n and p.grad is not None) for a in ("rewriter", "selector", "generator")}
    assert grads["rewriter"] > 0 and grads["selector"] > 0 and grads["generator"] == 0


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
