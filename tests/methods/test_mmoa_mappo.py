"""MMOA-RAG under MAPPO: each agent's advantages from its own values, the trainer consuming the
pipeline's trajectories with frozen agents, the critic's warm-up, the group baseline, the start's
evaluation, and per-agent adapters. Real tokenizer, a real (tiny random) model, a real BM25 index."""
import json

import pytest
import torch

from ragrl.errors import ConfigError


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
