"""A seventh method, declared entirely in this file: its own text protocol, reward, advantage
estimator, policy loss and recipe, registered with one `register_method` call, trains one step on the tiny model. Nothing in the core
changes for it (the core files are not touched by this test; the registries are)."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from ragrl.algos import advantages as adv
from ragrl.algos.losses import agg_loss
from ragrl.algos.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, uniform_estimator
from ragrl.errors import ConfigError
from ragrl.methods import METHODS, Method, register_method, unregister_method
from ragrl.rewards.qa import answer_of, f1_score, golds_of
from ragrl.rollout.protocol import PROTOCOLS, Action, TextProtocol, get_protocol
from ragrl.rollout.snippets import format_hits
from ragrl.train.recipe import load_train_config, run_recipe


class AskProtocol(TextProtocol):
    """A made-up protocol: `ASK: query` to search, `SAY: answer` to answer, one action a line."""

    name = "ask_say"
    stop_strings = ["\n"]

    def messages(self, question):
        return [{"role": "system", "content": "Write ASK: <query> to search or SAY: <answer> to answer."},
                {"role": "user", "content": question}]

    def parse(self, text):
        m = re.match(r"\s*(ASK|SAY):\s*(.+)", text or "")
        if not m:
            return Action("invalid", error="start with ASK: or SAY:")
        return Action("search", queries=[m.group(2).strip()]) if m.group(1) == "ASK" else \
            Action("answer", answer=m.group(2).strip())

    def format_observation(self, queries, hits):
        return "\nFOUND: " + " | ".join(format_hits(h) for h in hits) + "\n"

    def format_feedback(self, error):
        return f"\nERROR: {error}\n"

    def extract_answer(self, text):
        m = re.search(r"SAY:\s*(.+)", text or "")
        return m.group(1).strip() if m else None

    def is_valid_format(self, response):
        return self.extract_answer(response) is not None

    def count_searches(self, response):
        return len(re.findall(r"ASK:", response or ""))

    def has_tags(self, text):
        return "ASK:" in text or "SAY:" in text


def short_f1(completion, sample, bonus: float = 0.1) -> float:
    """F1, plus `bonus` for an answer of at most three words.

    >>> short_f1("SAY: Paris", {"answers": ["Paris"]}, bonus=0.5)
    1.5
    """
    answer = answer_of(completion, AskProtocol())
    return f1_score(answer, golds_of(completion, sample)) + (bonus if 0 < len(answer.split()) <= 3 else 0.0)


LOSS_CALLS: list[int] = []


def plain_pg(logprobs, old_logprobs, advantages, mask, cfg):
    """REINFORCE's loss, -A log pi, with no ratio and no clip (aggregated as the recipe says)."""
    LOSS_CALLS.append(int(mask.sum()))
    loss = agg_loss(-advantages.detach() * logprobs, mask, cfg.loss_agg)
    return loss, {"plain_pg_tokens": float(mask.sum())}


RECIPE = {
    "name": "ask_say_grpo", "agent": "ask_say", "steps": 1, "questions_per_step": 2, "save_every": 1,
    "reward": {"short_f1": {"weight": 1.0, "bonus": 0.2}},
    "model": {"dtype": "float32"}, "data": {"train": "demo-train", "eval": "demo-eval", "eval_n": 2},
    "algo": {"estimator": "centred", "policy_loss": "plain_pg", "minibatch_size": 4, "micro_batch_size": 2},
    "rollout": {"n": 2, "max_turns": 2, "max_turn_tokens": 12, "max_response_tokens": 32},
}


@pytest.fixture
def seventh_method():
    method = register_method(Method(name="ask_say", paper="a test's own method", trains="the LM",
                                    protocols=(AskProtocol,), rewards={"short_f1": short_f1},
                                    answer_rewards=("short_f1",), plot_keys=("reward_mean",),
                                    estimators={"centred": uniform_estimator(adv.grpo, ("scores", "group_ids", "mask"),
                                                                             scale_by_std=False)},
                                    policy_losses={"plain_pg": plain_pg}, recipes=("ask_say_grpo",)))
    yield method
    unregister_method("ask_say")
    assert "ask_say" not in PROTOCOLS and "ask_say" not in METHODS
    assert "centred" not in ADVANTAGE_ESTIMATORS and "plain_pg" not in POLICY_LOSSES


def test_a_method_declared_in_a_test_file_trains_one_step(seventh_method, tmp_path, tiny_model_dir, demo_bm25_dir):
    recipe = tmp_path / "ask_say_grpo.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    cfg = load_train_config(str(recipe), [f"model.name={tiny_model_dir}", f"data.index={demo_bm25_dir}",
                                          f"out_dir={tmp_path / 'run'}"])
    assert isinstance(get_protocol(cfg.agent), AskProtocol)
    LOSS_CALLS.clear()
    run_dir = run_recipe(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and "reward_mean" in rows[0] and rows[0]["time/update_s"] > 0
    # the update took its gradient through the method's own loss (2 micro batches of 2 episodes)
    assert len(LOSS_CALLS) == 2 and sum(LOSS_CALLS) > 0 and rows[0]["plain_pg_tokens"] > 0
    trajs_protocol = yaml.safe_load((run_dir / "config.yaml").read_text())["agent"]
    assert trajs_protocol == "ask_say"
    assert (run_dir / "final_adapter" / "adapter_config.json").is_file()


def test_its_names_are_checked_on_load_like_the_shipped_ones(seventh_method, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "reward": {"short_f2": 1.0}}))
    with pytest.raises(ConfigError, match="unknown reward 'short_f2'; did you mean 'short_f1'"):
        run_recipe(load_train_config(str(recipe), [f"out_dir={tmp_path / 'run'}"]))
    with pytest.raises(ConfigError, match="agent: 'ask_sya' is not one of .*did you mean 'ask_say'"):
        load_train_config(str(recipe), ["agent=ask_sya"])
    with pytest.raises(ConfigError, match="policy_loss: 'plain_gp' is not one of .*did you mean 'plain_pg'"):
        load_train_config(str(recipe), ["algo.policy_loss=plain_gp"])
    with pytest.raises(ConfigError, match="estimator: 'centered' is not one of .*did you mean 'centred'"):
        load_train_config(str(recipe), ["algo.estimator=centered"])
    assert not (tmp_path / "run").exists()


def test_a_second_method_may_not_take_a_registered_name(seventh_method):
    with pytest.raises(ConfigError, match="protocol 'ask_say' is registered twice"):
        register_method(Method(name="other", paper="", trains="", protocols=(type("P", (AskProtocol,), {}),)))
    with pytest.raises(ConfigError, match="SFT builder 'gold_search' is registered twice"):
        register_method(Method(name="other", paper="", trains="", sft_builders={"gold_search": print}))
    with pytest.raises(ConfigError, match="policy setup 'retriever' is registered twice"):
        register_method(Method(name="other", paper="", trains="", setups={"retriever": print}))
    assert METHODS["ask_say"] is seventh_method and "other" not in METHODS
