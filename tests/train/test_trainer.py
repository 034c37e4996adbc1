"""One update of the real trainer path (prepare + ppo_update) on a tiny random Llama with LoRA:
it learns on a fixed batch, observation tokens add no loss terms, and batching/data order hold."""
from dataclasses import replace

import pytest
import torch

from ragrl.policy.lm import LMPolicy
from ragrl.algos.losses import ppo_policy_loss, value_loss
from ragrl.rollout.trajectory import Trajectory
from ragrl.policy.batch import TrajBatch, collate
from ragrl.train.config import AlgoConfig, ModelConfig
from ragrl.policy.lm_model import build_policy, forward_actions
from ragrl.train.rng import seed_everything
from ragrl.train.update import Prepared, ppo_update, prepare

PROMPT, ACT1, OBS = 8, 8, 6          # prompt tokens, first action, observation (mask 0)
LENGTHS = [40, 36, 32, 40, 29, 38]    # real tokens per row; the rest is right padding


def policy(model_dir, *, value_head=False):
    seed_everything(0)  # LoRA's A matrices are drawn from the global RNG
    return build_policy(ModelConfig(name=str(model_dir), lora=True, lora_r=8, lora_alpha=16),
                        with_value_head=value_head)


def synthetic_batch(model, lengths=LENGTHS, scores=(1.0, 0.0, 0.2, 0.9, 0.6, 0.1)) -> TrajBatch:
    """Rows in groups of 2: prompt, action, observation gap, action, padding (random ids).
    old_logprobs are the model's own, so the first PPO ratio is exactly 1."""
    g = torch.Generator().manual_seed(0)
    B, L = len(lengths), max(lengths)
    ids = torch.randint(0, 49152, (B, L), generator=g)
    attn = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]).long()
    act = attn.float().clone()
    act[:, :PROMPT] = 0
    act[:, PROMPT + ACT1: PROMPT + ACT1 + OBS] = 0
    with torch.no_grad():
        old = forward_actions(model, ids, attn, act)["logprobs"]
    return TrajBatch(ids, attn, act, old, torch.tensor(scores), torch.arange(B) // 2)


def params_of(model, value_head=None):
    ps = [p for p in model.parameters() if p.requires_grad]
    return ps + (list(value_head.parameters()) if value_head is not None else [])


def losses_on(model, value_head, prep: Prepared, cfg: AlgoConfig) -> tuple[float, float | None]:
    b = prep.batch
    with torch.no_grad():
        out = forward_actions(model, b.input_ids, b.attention_mask, b.action_mask, value_head=value_head)
        pg, _ = ppo_policy_loss(out["logprobs"], b.old_logprobs, prep.advantages, b.action_mask,
                                cfg.clip_low, cfg.clip_high, None, cfg.loss_agg)
        vl = None
        if value_head is not None:
            vl = float(value_loss(out["values"], prep.old_values, prep.returns, b.action_mask,
                                  cfg.critic[1], cfg.loss_agg)[0])
    return float(pg), vl


def one_update(model, value_head, prep, cfg, lr, max_grad_norm=1.0, optim=torch.optim.AdamW):
    opt = optim(params_of(model, value_head), lr=lr)
    model.train()
    return ppo_update(LMPolicy(model, None, value_head), opt, prep, cfg, 0.0 if not cfg.kl_coef else cfg.kl_coef,
                      max_grad_norm, torch.Generator().manual_seed(1))


def test_grpo_update_changes_weights_and_lowers_the_policy_loss(tiny_model_dir):
    model, _, _ = policy(tiny_model_dir)
    cfg = AlgoConfig(estimator="grpo", minibatch_size=8, micro_batch_size=2)
    prep = prepare(LMPolicy(model, None, None), synthetic_batch(model), cfg, 0.0, cfg.micro_batch_size)
    assert prep.advantages.abs().sum() > 0
    assert torch.all(prep.advantages[prep.batch.action_mask == 0] == 0)
    before_params = [p.detach().clone() for p in params_of(model)]
    before, _ = losses_on(model, None, prep, cfg)
    stats = one_update(model, None, prep, cfg, lr=1e-2)
    after, _ = losses_on(model, None, prep, cfg)
    assert stats["updates"] == 1 and stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert any(not torch.equal(a, p) for a, p in zip(before_params, params_of(model)))
    assert after < before - 1e-3, (before, after)


def test_gae_update_lowers_the_value_loss(tiny_model_dir):
    model, _, value_head = policy(tiny_model_dir, value_head=True)
    cfg = AlgoConfig(estimator="gae", gamma=1.0, lam=1.0, value_coef=1.0, minibatch_size=8, micro_batch_size=3)
    prep = prepare(LMPolicy(model, None, value_head), synthetic_batch(model), cfg, 0.0, cfg.micro_batch_size)
    # zero-initialised head: V = 0, so with gamma = lam = 1 every return is the row's score
    m = prep.batch.action_mask.bool()
    assert torch.allclose(prep.returns[m], prep.batch.scores[:, None].expand_as(m)[m])
    pg_before, v_before = losses_on(model, value_head, prep, cfg)
    one_update(model, value_head, prep, cfg, lr=2e-2)
    pg_after, v_after = losses_on(model, value_head, prep, cfg)
    assert v_after < v_before - 1e-3, (v_before, v_after)
    assert pg_after < pg_before


def test_critic_warmup_steps_the_value_head_only_and_leaves_lora_and_its_adam_state_alone(tiny_model_dir):
    model, _, value_head = policy(tiny_model_dir, value_head=True)
    cfg = AlgoConfig(estimator="gae", gamma=1.0, lam=1.0, value_coef=1.0, entropy_coef=0.01, kl_coef=0.1,
                     minibatch_size=8, micro_batch_size=3)
    pol = LMPolicy(model, None, value_head)
    prep = prepare(pol, synthetic_batch(model), cfg, 0.1, cfg.micro_batch_size)
    lora = [p for p in model.parameters() if p.requires_grad]
    lora_before = [p.detach().clone() for p in lora]
    head_before = [p.detach().clone() for p in value_head.parameters()]
    _, v_before = losses_on(model, value_head, prep, cfg)
    opt = torch.optim.AdamW(params_of(model, value_head), lr=2e-2, weight_decay=0.1)
    model.train()
    stats = ppo_update(pol, opt, prep, cfg, 0.1, 1.0, torch.Generator().manual_seed(1), critic_only=True)
    _, v_after = losses_on(model, value_head, prep, cfg)
    assert stats["updates"] == 1 and "kl_loss" not in stats and "entropy" not in stats
    assert all(torch.equal(a, b) for a, b in zip(lora, lora_before))          # bit-identical, weight decay too
    assert all(opt.state.get(p) in (None, {}) for p in lora)                     # no Adam moments started
    assert all(p.requires_grad and p.grad is None for p in lora)                 # trainable again afterwards
    assert any(not torch.equal(a, b) for a, b in zip(value_head.parameters(), head_before))
    assert v_after < v_before - 1e-3, (v_before, v_after)
    # the next (normal) update trains the LoRA weights again
    ppo_update(pol, opt, prep, cfg, 0.1, 1.0, torch.Generator().manual_seed(2))
    assert any(not torch.equal(a, b) for a, b in zip(lora, lora_before))


def poisoned_off_actions(prep: Prepared) -> Prepared:
    """The same targets, with NaN/inf wherever action_mask is 0 (prompt, observation, padding)."""
    off = prep.batch.action_mask == 0
    poison = lambda t, v: torch.where(off, torch.full_like(t, v), t)  # noqa: E731
    batch = replace(prep.batch, old_logprobs=poison(prep.batch.old_logprobs, float("-inf")))
    return Prepared(batch, poison(prep.advantages, 1e30), poison(prep.returns, float("nan")),
                    poison(prep.old_values, float("nan")), poison(prep.ref_logprobs, float("inf")), prep.stats)


def grads_after_update(model_dir, mutate=lambda p: p):
    model, _, value_head = policy(model_dir, value_head=True)
    cfg = AlgoConfig(estimator="gae", kl_coef=0.1, entropy_coef=0.01, dual_clip=3.0,
                     loss_agg="seq_mean_token_mean", minibatch_size=8, micro_batch_size=4)
    prep = mutate(prepare(LMPolicy(model, None, value_head), synthetic_batch(model), cfg, 0.1, cfg.micro_batch_size))
    one_update(model, value_head, prep, cfg, lr=0.0, max_grad_norm=1e9, optim=torch.optim.SGD)
    return [p.grad.clone() for p in params_of(model, value_head)]


def test_observation_tokens_contribute_no_loss_terms(tiny_model_dir):
    base = grads_after_update(tiny_model_dir)
    poisoned = grads_after_update(tiny_model_dir, poisoned_off_actions)
    assert sum(float(g.abs().sum()) for g in base) > 0
    for a, b in zip(base, poisoned):
        assert torch.isfinite(b).all()
        assert torch.equal(a, b)

    # the check can fail: one *action* token's advantage does move the gradient
    def nudge_one_action(prep):
        adv = prep.advantages.clone()
        adv[0, PROMPT + 1] += 1.0
        return replace(prep, advantages=adv)

    moved = grads_after_update(tiny_model_dir, nudge_one_action)
    assert any(not torch.equal(a, b) for a, b in zip(base, moved))


def traj(n_prompt, actions, obs, reward, group):
    """A trajectory: prompt, then alternating action / observation id runs."""
    ids, mask, lps = list(range(1, n_prompt + 1)), [0] * n_prompt, [0.0] * n_prompt
    for a, o in zip(actions, obs + [0]):
        ids += [100 + i for i in range(a)] + [200 + i for i in range(o)]
        mask += [1] * a + [0] * o
        lps += [-0.5] * a + [0.0] * o
    return Trajectory(sample_id="s", question="q", golds=["a"], token_ids=ids, action_mask=mask, logprobs=lps,
                      prompt_len=n_prompt, group=group, reward=reward)


def test_collate_pads_right_and_masks_only_actions():
    trajs = [traj(3, [2, 3], [4], 1.0, 0), traj(5, [1], [], 0.5, 0), traj(1, [2, 2], [1], 0.0, 1)]
    b = collate(trajs, pad_id=7)
    lengths = [len(t.token_ids) for t in trajs]
    assert b.input_ids.shape == b.attention_mask.shape == b.action_mask.shape == b.old_logprobs.shape
    assert b.input_ids.shape == (3, max(lengths))
    for i, (t, n) in enumerate(zip(trajs, lengths)):
        assert b.input_ids[i, :n].tolist() == t.token_ids and torch.all(b.input_ids[i, n:] == 7)
        assert b.attention_mask[i].tolist() == [1] * n + [0] * (b.input_ids.shape[1] - n)
        assert b.action_mask[i, n:].sum() == 0 and b.old_logprobs[i, n:].abs().sum() == 0
    assert b.action_mask[0].tolist()[:12] == [0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1]
    # row 2 starts with an action token, but position 0 has nothing before it to predict it
    assert b.action_mask[2, 0] == 0 and b.action_mask[2, 1] == 1
    assert torch.all(b.old_logprobs[b.action_mask == 1] == -0.5)
    assert b.scores.tolist() == [1.0, 0.5, 0.0] and b.group_ids.tolist() == [0, 0, 1]
    sub = b.select([1])
    assert sub.input_ids.shape == (1, lengths[1])  # trimmed to the longest selected row
    bad = traj(3, [2], [], 0.0, 0)
    bad.logprobs.pop()
    with pytest.raises(ValueError, match="lengths differ"):
        collate([bad], pad_id=0)


def test_bfloat16_base_keeps_float32_adapters_log_probs_and_learns(tiny_model_dir):
    """model.dtype=bfloat16: the frozen base is bf16 (fast on AMX / GPUs), but what is trained
    and what PPO compares stays float32, and an update still lowers the loss."""
    seed_everything(0)
    model, _, _ = build_policy(ModelConfig(name=str(tiny_model_dir), lora=True, lora_r=8, lora_alpha=16,
                                           dtype="bfloat16"))
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    batch = synthetic_batch(model)
    assert batch.old_logprobs.dtype == torch.float32
    cfg = AlgoConfig(estimator="grpo", minibatch_size=8, micro_batch_size=2)
    prep = prepare(LMPolicy(model, None, None), batch, cfg, 0.0, cfg.micro_batch_size)
    before, _ = losses_on(model, None, prep, cfg)
    stats = one_update(model, None, prep, cfg, lr=1e-2)
    after, _ = losses_on(model, None, prep, cfg)
    assert stats["grad_norm"] > 0 and after < before - 1e-3, (before, after)


def test_unknown_dtype_is_a_config_error(tiny_model_dir):
    from ragrl.errors import ConfigError

    with pytest.raises(ConfigError, match="model.dtype"):
        build_policy(ModelConfig(name=str(tiny_model_dir), dtype="fp8"))


def test_auto_dtype_is_bfloat16_only_where_the_hardware_has_it():
    from ragrl.policy.lm_model import _cpu_has_native_bf16, torch_dtype

    native = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else _cpu_has_native_bf16()
    assert torch_dtype("auto") == (torch.bfloat16 if native else torch.float32)
    assert torch_dtype("float32") == torch.float32 and torch_dtype("bfloat16") == torch.bfloat16


def tiny_trainer_config(tiny_model_dir, tmp_path, *overrides):
    """The tiny recipe on the tiny model, 3 held-out and 4 train questions, a 100-passage corpus."""
    from ragrl.train.recipe import load_train_config

    return load_train_config("search_r1_grpo", [*tiny_sets(tiny_model_dir, tmp_path), *overrides], "tiny")


def tiny_sets(tiny_model_dir, tmp_path) -> list[str]:
    """Write tiny_trainer_config's data files under tmp_path; return its --set overrides, which name them."""
    from tests.train.test_trainer_resume import write_jsonl
    from ragrl.datasets import load_questions
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus

    write_jsonl(tmp_path / "eval.jsonl", load_questions("demo-eval")[:3])
    write_jsonl(tmp_path / "train.jsonl", load_questions("demo-train")[:4])
    corpus = load_corpus(DEMO_CORPUS)
    write_jsonl(tmp_path / "corpus.jsonl", [corpus.passage(i) for i in range(100)])
    return [f"model.name={tiny_model_dir}", "model.dtype=float32", f"out_dir={tmp_path / 'run'}",
            f"data.train={tmp_path / 'train.jsonl'}", f"data.eval={tmp_path / 'eval.jsonl'}",
            f"data.corpus={tmp_path / 'corpus.jsonl'}", "data.eval_n=3", "questions_per_step=2", "rollout.n=2",
            "rollout.max_turn_tokens=8", "rollout.max_response_tokens=24", "sft.steps=0"]


def test_trainer_evaluate_per_question_scores_pair_with_the_summary(tiny_model_dir, tmp_path, monkeypatch):
    """The held-out evaluation the learning curve pairs across steps: one 0-1 score per question,
    whose mean is the reported (percent) figure."""
    from ragrl.datasets import load_questions
    from ragrl.train.trainer import Trainer

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    cfg = tiny_trainer_config(tiny_model_dir, tmp_path)
    out = Trainer(cfg).evaluate(per_question=True)
    assert set(out["per_question"]) == {q["id"] for q in load_questions("demo-eval")[:3]}
    for key in ("em", "f1", "cover_em"):
        scores = [row[key] for row in out["per_question"].values()]
        assert all(0.0 <= s <= 1.0 for s in scores)
        assert out[key] == pytest.approx(100 * sum(scores) / len(scores))
        assert out[f"{key}_lo"] <= out[key] <= out[f"{key}_hi"]
    assert "per_question" not in Trainer(cfg).evaluate()


def test_time_budget_stops_before_a_step_that_would_overrun_and_checkpoints(tiny_model_dir, tmp_path, monkeypatch,
                                                                           caplog):
    """The bound is a safety: a run it cuts says so loudly (a WARNING naming the steps) and records the
    cut in training.json; a resume that reaches the recipe's steps clears the record."""
    from ragrl.train.checkpoint import latest_checkpoint
    from ragrl.train.run_dir import read_training_record
    from ragrl.train.trainer import Trainer

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    cfg = tiny_trainer_config(tiny_model_dir, tmp_path, "steps=3", "save_every=100")
    trainer = Trainer(cfg)
    with caplog.at_level("WARNING", logger="ragrl.train"):
        rows = trainer.train(progress=False, time_budget_s=0.0)   # the first step always runs
    assert len(rows) == 1 and latest_checkpoint(tmp_path / "run").name == "step_000001"
    assert trainer.cut_by_time_bound == 1
    assert "THE WALL-TIME BOUND CUT THIS RUN" in caplog.text and "after 1 of 3 steps" in caplog.text
    assert read_training_record(tmp_path / "run")["cut_by_time_bound"] == {"step": 1, "steps": 3, "bound_s": 0.0}
    resumed = Trainer(cfg)
    assert len(resumed.train(resume=True, progress=False)) == 2  # no budget: the remaining steps
    assert resumed.cut_by_time_bound is None and "cut_by_time_bound" not in read_training_record(tmp_path / "run")


def test_progress_bar_counts_time_under_a_budget_and_steps_otherwise():
    from ragrl.train.progress import TrainProgress

    row = {"reward_mean": 0.5, "f1": 0.25, "searches": 1.0}
    timed = TrainProgress(True, 1000, 3, time_budget_s=60.0, live=True)
    timed.update(row)
    timed.update(row)
    task = timed.p.tasks[0]
    timed.close()
    assert task.total == 60.0 and 0 <= task.completed < 60.0 and task.fields["step"] == 5
    stepped = TrainProgress(True, 10, 3, live=True)
    stepped.update(row)
    task = stepped.p.tasks[0]
    stepped.close()
    assert task.total == 10 and task.completed == 4 and task.fields["step"] == 4


def test_prepare_returns_each_rows_values_in_its_own_row_after_length_sorted_micro_batches(tiny_model_dir):
    """prepare runs micro batches in length order (an MMOA selector row is ~8x a rewriter row);
    the values and reference log-probs must still land in the rows they belong to."""
    model, _, value_head = policy(tiny_model_dir, value_head=True)
    torch.nn.init.normal_(next(value_head.parameters()), std=0.5)    # zero-initialised otherwise
    lengths = [40, 15, 38, 16, 30, 20]                                 # long and short rows interleaved
    batch = synthetic_batch(model, lengths=lengths)
    cfg = AlgoConfig(estimator="gae", kl_coef=0.1, minibatch_size=6, micro_batch_size=2)
    prep = prepare(LMPolicy(model, None, value_head), batch, cfg, 0.1, cfg.micro_batch_size)
    lp = LMPolicy(model, None, value_head)
    m = batch.action_mask.bool()
    with torch.no_grad():
        for i in range(len(lengths)):            # one row at a time: no padding, no reordering
            row = batch.select([i])
            n = row.action_mask.shape[1]
            values = lp.forward(row, with_values=True)["values"][0]
            with lp.reference():
                ref = lp.forward(row)["logprobs"][0]
            assert torch.allclose(prep.old_values[i, :n][m[i, :n]], values[m[i, :n]], atol=1e-4)
            assert torch.allclose(prep.ref_logprobs[i, :n][m[i, :n]], ref[m[i, :n]], atol=1e-4)
    assert prep.old_values[m].abs().sum() > 0


def test_train_cli_minutes_bounds_the_rl_steps_and_still_writes_the_final_adapter(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    """`ragrl train --minutes` (a lent GPU's fixed call length) reaches Trainer.train's budget: 3
    steps asked, a budget no second step fits in, so one step, its checkpoint and the final adapter."""
    from typer.testing import CliRunner

    from ragrl.cli.main import app
    from ragrl.train.checkpoint import latest_checkpoint
    from ragrl.train.run_dir import read_metrics

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    args = ["train", "search_r1_grpo", "--variant", "tiny", "--minutes", "0.0001"]
    for s in [*tiny_sets(tiny_model_dir, tmp_path), "steps=3", "save_every=100"]:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    assert [r["step"] for r in read_metrics(run)] == [0]
    assert latest_checkpoint(run).name == "step_000001"
    assert (run / "final_adapter" / "adapter_config.json").exists()
    bad = CliRunner().invoke(app, ["train", "search_r1_grpo", "--minutes", "-1"])
    assert bad.exit_code != 0 and "--minutes" in bad.output


def test_drop_flat_groups_updates_on_the_groups_whose_rewards_differ(tiny_model_dir, tmp_path, monkeypatch):
    """algo.drop_flat_groups: a step learns from the questions whose samples' rewards differ, and a step
    whose groups are all flat takes no gradient step. The rewards are set after the real ones (the tiny
    model's are all alike), a fake only to choose which groups are flat."""
    from ragrl.train.trainer import Trainer

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    trainer = Trainer(tiny_trainer_config(tiny_model_dir, tmp_path, "algo.drop_flat_groups=true", "eval_every=0",
                                          "eval_start=false"))
    rewards = {0: [0.5, 0.5], 1: [0.0, 1.0]}
    real_score = trainer._score

    def score_then_set(samples, trajs):
        experts = real_score(samples, trajs)
        seen: dict[int, int] = {}
        for t in trajs:
            i = seen[t.group] = seen.get(t.group, -1) + 1
            t.reward = rewards[t.group % 2][i]
        return experts

    monkeypatch.setattr(trainer, "_score", score_then_set)
    weights = lambda: [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]  # noqa: E731
    before = weights()
    row = trainer.train_step()
    assert (row["update_trajectories"], row["updates"], row["flat_group_frac"]) == (2.0, 1.0, 0.5)
    assert any(not torch.equal(a, b) for a, b in zip(before, weights()))

    rewards[1] = [0.25, 0.25]
    before = weights()
    trainer.step += 1
    row = trainer.train_step()
    assert (row["update_trajectories"], row["updates"], row["update_skipped"]) == (0.0, 0.0, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, weights()))
