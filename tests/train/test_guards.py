"""The trainer's guards (issue #43): a non-finite update is skipped, a collapse rolls back to the
last good checkpoint with the recipe's remedy (and stops after max_rollbacks), a retrieval server
that goes away stops the run with a checkpoint of its last completed step and --resume continues
exactly. Runs are the real trainer on the tiny model (BM25 over 100 demo passages); the faults are
injected (a NaN in the policy's log-probs, a reward that falls, the real HTTP server stopped)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from ragrl.errors import ConfigError, RetrievalOutage, TrainingCollapsed
from ragrl.train.checkpoint import latest_checkpoint
from ragrl.train.config import GuardConfig
from ragrl.train.guards import CollapseWatch, sampled_entropy
from ragrl.train.recipe import load_train_config
from ragrl.train.run_dir import read_metrics
from tests.train.test_trainer import tiny_sets, tiny_trainer_config

# ---------------------------------------------------------------- the rules, by hand

def row(reward=0.5, **kw):
    return {"reward_mean": reward, "format_error_rate": 0.0, "updates": 1, "guard/nonfinite_skipped": 0.0, **kw}


def test_reward_drop_compares_with_the_mean_of_the_last_window_steps_after_patience():
    watch = CollapseWatch(GuardConfig(reward_drop=0.3, window=2, patience=2))
    assert watch.observe(0, row(0.9)) is None and watch.observe(1, row(0.5)) is None   # level 0.7 from now on
    assert watch.observe(2, row(0.45)) is None                  # 0.45 > 0.7 - 0.3: holds not
    assert watch.recent == [0.5, 0.45]                          # level now 0.475
    assert watch.observe(3, row(0.1)) is None                   # holds once (patience 2)
    trip = watch.observe(4, row(0.1))
    assert trip is not None and trip.rule == "reward_drop" and trip.step == 4
    assert trip.threshold == pytest.approx(0.475 - 0.3) and trip.value == 0.1
    assert "reward_drop tripped at step 4" in trip.describe()


def test_each_rule_trips_on_its_own_reading_and_only_when_set():
    assert CollapseWatch(GuardConfig()).observe(0, row(kl_ref=9.0, action_entropy=0.0, format_error_rate=1.0)) is None
    cases = [(GuardConfig(kl_ceiling=0.5), row(kl_ref=0.6), "kl_ceiling"),
             (GuardConfig(entropy_floor=0.1), row(action_entropy=0.05), "entropy_floor"),
             (GuardConfig(format_error_ceiling=0.5), row(format_error_rate=0.75), "format_error_ceiling")]
    for cfg, bad, rule in cases:
        assert CollapseWatch(cfg).observe(0, row(kl_ref=0.1, action_entropy=1.0)) is None
        trip = CollapseWatch(cfg).observe(0, bad)
        assert trip is not None and trip.rule == rule


def test_nonfinite_trips_after_nonfinite_steps_steps_whose_every_update_was_skipped():
    watch = CollapseWatch(GuardConfig(nonfinite_steps=2))
    skipped = row(updates=0, **{"guard/nonfinite_skipped": 1.0})
    assert watch.observe(0, skipped) is None
    assert watch.observe(1, row()) is None                       # a good step ends the streak
    assert watch.observe(2, skipped) is None
    trip = watch.observe(3, skipped)
    assert trip is not None and trip.rule == "nonfinite" and trip.value == 2


def test_sampled_entropy_is_the_mean_negative_log_prob_of_the_actions():
    lp = torch.tensor([[-0.5, -1.5, 0.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sampled_entropy(lp, mask) == pytest.approx(4.0 / 3)
    assert math.isnan(sampled_entropy(lp, torch.zeros_like(mask)))


def test_a_guard_that_could_never_act_is_refused_when_the_recipe_resolves(tiny_model_dir, tmp_path):
    from ragrl.train.check import check_combinations

    refused = {("guard.kl_ceiling=0.5", "algo.kl_coef=0"): "guard.kl_ceiling.*algo.kl_coef",
               ("guard.timeout_reward=-1",): "guard.timeout_reward.*neither is set",
               ("guard.remedy_lr_factor=0",): "guard.remedy_lr_factor must be in",
               ("guard.window=0",): "guard.window must be >= 1"}
    for sets, message in refused.items():
        with pytest.raises(ConfigError, match=message):
            check_combinations(tiny_trainer_config(tiny_model_dir, tmp_path, *sets))
    check_combinations(tiny_trainer_config(tiny_model_dir, tmp_path, "guard.timeout_reward=-1",
                                           "rollout.max_episode_s=30"))


# ---------------------------------------------------------------- the real trainer

def poison_update_at(monkeypatch, trainer, step: int) -> None:
    """A NaN in the policy's log-probs in the update of `step` (the fault: a NaN gradient)."""
    forward = trainer.policy.forward

    def poisoned(batch, **kw):
        out = forward(batch, **kw)
        if trainer.step == step and torch.is_grad_enabled():
            out["logprobs"] = out["logprobs"] * float("nan")
        return out
    monkeypatch.setattr(trainer.policy, "forward", poisoned)


def test_a_nan_gradient_skips_that_update_and_training_goes_on(tiny_model_dir, tmp_path, monkeypatch, caplog):
    from ragrl.train.trainer import Trainer

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    trainer = Trainer(tiny_trainer_config(tiny_model_dir, tmp_path, "steps=3", "save_every=100"))
    poison_update_at(monkeypatch, trainer, 1)
    rows = trainer.train(progress=False)
    assert [r["updates"] for r in rows][1] == 0 and rows[1]["guard/nonfinite_skipped"] >= 1
    assert rows[0]["updates"] >= 1 and rows[2]["updates"] >= 1 and rows[2]["guard/nonfinite_skipped"] == 0
    # Adam stepped exactly for the updates taken, and no weight or moment holds a NaN.
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    assert all(torch.isfinite(p).all() for p in params)
    steps = {int(trainer.optimizer.state[p]["step"]) for p in params if p in trainer.optimizer.state}
    assert steps == {rows[0]["updates"] + rows[2]["updates"]}
    assert "update skipped: non-finite" in caplog.text
    logged = read_metrics(tmp_path / "run")
    assert [r["guard/nonfinite_skipped"] > 0 for r in logged] == [False, True, False]


def fall_at(monkeypatch, trainer, step: int, times: int):
    """The forced collapse: every trajectory of `step` scores -5 (the first `times` visits), 1 otherwise."""
    visits = {"n": 0}

    def reward_for(spec):
        def reward(traj, sample):
            if trainer.step == step and visits["n"] < times:
                return -5.0
            return 1.0
        return reward

    import ragrl.train.trainer as trainer_module
    original = trainer_module.Trainer.train_step

    def counting_step(self):
        out = original(self)
        if self.step == step:
            visits["n"] += 1
        return out
    monkeypatch.setattr(trainer_module, "make_reward", reward_for)
    monkeypatch.setattr(trainer_module.Trainer, "train_step", counting_step)


GUARD = ["guard.reward_drop=0.5", "guard.window=2", "steps=5", "save_every=2", "lr=0.001"]


def test_a_collapse_rolls_back_to_the_last_good_checkpoint_applies_the_remedy_and_goes_on(
        tiny_model_dir, tmp_path, monkeypatch, caplog):
    from ragrl.train.trainer import Trainer

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    trainer = Trainer(tiny_trainer_config(tiny_model_dir, tmp_path, *GUARD))
    fall_at(monkeypatch, trainer, 3, times=1)
    trainer.train(progress=False)
    run = tmp_path / "run"
    logged = read_metrics(run)
    assert [r["step"] for r in logged] == [0, 1, 2, 3, 4]          # one row a step on the branch that survived
    event = logged[2]                                             # the first step after the rollback to step_000002
    assert event["guard/rollback"] == 1 and event["guard/tripped_step"] == 3 and event["guard/trip/reward_drop"] == -5
    assert [r["guard/rollbacks"] for r in logged] == [0, 0, 1, 1, 1]
    assert logged[2]["lr"] == pytest.approx(0.5 * logged[1]["lr"]) and logged[2]["guard/lr_scale"] == 0.5
    assert logged[4]["reward_mean"] == 1.0
    # The discarded branch stays on record, the step that tripped marked.
    discarded = [json.loads(line) for line in (run / "rolled_back.jsonl").read_text().splitlines()]
    assert [r["step"] for r in discarded] == [2, 3] and discarded[1]["guard/trip"] == 1
    assert len(trainer.watch.skipped_ids) == 2 and len(trainer.questions) == 2
    assert "rolled back to step_000002" in caplog.text
    # The remedy is checkpointed: a resume keeps the left-out questions and the lower learning rate.
    state = json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())
    assert state["guard"]["rollbacks"] == 1 and state["guard"]["lr_scale"] == 0.5


def test_a_collapse_after_max_rollbacks_stops_naming_the_rule_and_the_step(tiny_model_dir, tmp_path, monkeypatch):
    from ragrl.train.trainer import Trainer

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    trainer = Trainer(tiny_trainer_config(tiny_model_dir, tmp_path, *GUARD, "guard.max_rollbacks=0"))
    fall_at(monkeypatch, trainer, 3, times=1)
    with pytest.raises(TrainingCollapsed, match=r"reward_drop tripped at step 3.*max_rollbacks=0.*step_000002") as e:
        trainer.train(progress=False)
    assert e.value.exit_code == 3
    logged = read_metrics(tmp_path / "run")
    assert logged[-1]["step"] == 3 and logged[-1]["guard/trip/reward_drop"] == -5


# ---------------------------------------------------------------- a retrieval server that goes away

@pytest.fixture
def served(tmp_path, monkeypatch):
    """start(port=0): a real retrieval server (HTTP, in a thread) over the BM25 index of the tiny
    config's corpus (tiny_trainer_config writes it first); stopped at the end of the test."""
    from ragrl.retrieval.index import load_index
    from ragrl.retrieval.resolve import cached_bm25_index
    from ragrl.retrieval.server import ServerThread, create_app

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    servers = []

    def start(port=0):
        server = ServerThread(create_app(load_index(cached_bm25_index(str(tmp_path / "corpus.jsonl")))), port=port)
        server.start()
        servers.append(server)
        return server
    yield start
    for s in servers:
        if s.thread.is_alive():
            s.stop()


def comparable(r: dict) -> dict:
    """A row without its wall-clock readings."""
    return {k: v for k, v in r.items() if not ("time" in k or "wall" in k or k.endswith(("_s", "per_s")))}


def test_a_server_gone_for_good_stops_with_a_checkpoint_and_resume_continues_exactly(
        tiny_model_dir, tmp_path, monkeypatch, served):
    """The server goes away twice: in step 1's rollout (nothing of step 1 is kept), then in step 1's
    evaluation (its update is kept, its row pending). Each time the run stops with exit code 75 and a
    checkpoint; each --resume once the server is back continues, and the metrics equal an
    uninterrupted run's."""
    from ragrl.train.trainer import Trainer

    # MMOA-RAG's pipeline searches at every step, whatever the (random) tiny model writes.
    sets = tiny_sets(tiny_model_dir, tmp_path)
    server = served()
    port = int(server.url.rsplit(":", 1)[1])
    sets += ["steps=2", "save_every=100", "eval_every=1", "data.eval_n=2", "guard.retrieval_wait_s=1",
             f"data.index={server.url}", "algo.minibatch_size=4"]
    reference = Trainer(load_train_config("mmoa_mappo", [*sets, f"out_dir={tmp_path / 'ref'}"], "tiny"))
    want = [{"step": i, **comparable(r)} for i, r in enumerate(reference.train(progress=False))]
    run = tmp_path / "run"

    for phase, at, kept in (("rollout", 1, "step_000001"), ("evaluate", 2, "step_000002")):
        trainer = Trainer(load_train_config("mmoa_mappo", sets, "tiny"))
        owner = trainer.setup if phase == "rollout" else trainer
        call = getattr(owner, phase)

        def stop_then_call(*a, trainer=trainer, call=call, at=at, server=server, **kw):   # the server falls over
            if trainer.step == at and server.thread.is_alive():
                server.stop()
            return call(*a, **kw)
        monkeypatch.setattr(owner, phase, stop_then_call)
        with pytest.raises(RetrievalOutage, match=server.url) as e:
            trainer.train(resume=phase != "rollout", progress=False)
        assert e.value.exit_code == 75
        # Nothing half-way: the last completed step is checkpointed (an evaluated step's update included).
        assert latest_checkpoint(run).name == kept
        assert [r["step"] for r in read_metrics(run)] == [0]
        server = served(port)   # the server is back, on the same address

    Trainer(load_train_config("mmoa_mappo", sets, "tiny")).train(resume=True, progress=False)
    got = [comparable(r) for r in read_metrics(run)]
    assert [r["step"] for r in got] == [0, 1]
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a["step"], k)
