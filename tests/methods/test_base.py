"""A seventh method, declared entirely in this file: its own text protocol, reward, advantage
estimator, policy loss and recipe, registered with one `register_method` call, trains one step on
the tiny model. An eighth brings an episode shape of its own (a runner that is not multi-turn) and
settings of its own (its recipe section, typed and checked on load, given to its runner and its
check). Nothing in the core changes for either (the core files are not touched by this test; the
registries are)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

import pytest
import yaml

from ragrl.algos import advantages as adv
from ragrl.algos.losses import agg_loss
from ragrl.engines.base import SamplingParams
from ragrl.algos.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, uniform_estimator
from ragrl.errors import ConfigError
from ragrl.methods import METHODS, Method, register_method, unregister_method
from ragrl.rewards.qa import answer_of, f1_score, golds_of
from ragrl.rollout.protocol import PROTOCOLS, Action, TextProtocol, chat_ids, get_protocol
from ragrl.rollout.snippets import format_hits
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn
from ragrl.train.recipe import load_train_config, run_recipe
from ragrl.yaml_config import setting


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
    # every part is checked before any is registered: a refused method leaves no part behind
    fresh = type("Fresh", (AskProtocol,), {"name": "fresh_protocol"})
    with pytest.raises(ConfigError, match="reward 'short_f1' is registered twice"):
        register_method(Method(name="other", paper="", trains="", protocols=(fresh,), rewards={"short_f1": print}))
    assert "fresh_protocol" not in PROTOCOLS
    assert METHODS["ask_say"] is seventh_method and "other" not in METHODS


# ---------------------------------------------------------------- an eighth method: its own episode shape and settings

@dataclass
class DraftSettings:
    """The `draft:` section of a recipe."""

    answer_tokens: int = setting(6, help="Tokens of the one answer an episode writes.")
    opening: Literal["none", "hint"] = setting("none", help="hint: the prompt first says to answer in a few words.")


class DraftProtocol(AskProtocol):
    """One closed-book answer a question, played by the `draft` runner (no search, one turn)."""

    name = "draft"
    runner = "draft"


RUNNER_SEEN: list[DraftSettings] = []
CHECK_SEEN: list[DraftSettings] = []


def run_drafts(engine, protocol, retriever, samples, cfg, *, group_offset=0, settings=None):
    """The episode shape: each of a question's cfg.n samples writes one answer of at most
    settings.answer_tokens tokens to the question alone; one trajectory each, grouped by question."""
    RUNNER_SEEN.append(settings)
    own = settings or DraftSettings()
    tok = engine.tokenizer
    trajs = []
    for i, sample in enumerate(samples):
        text = ("Answer in a few words. " if own.opening == "hint" else "") + sample["question"]
        prompt = chat_ids(tok, [{"role": "user", "content": text}])
        params = [SamplingParams(max_new_tokens=own.answer_tokens, temperature=cfg.temperature,
                                 seed=cfg.seed * 1000 + i * cfg.n + j) for j in range(cfg.n)]
        for g in (gen[0] for gen in engine.generate([prompt] * cfg.n, params)):
            answer = tok.decode(g.token_ids, skip_special_tokens=True).strip()
            trajs.append(Trajectory(
                sample_id=str(sample.get("id", i)), question=sample["question"], golds=list(sample["answers"]),
                token_ids=prompt + g.token_ids, action_mask=[0] * len(prompt) + [1] * len(g.token_ids),
                logprobs=[0.0] * len(prompt) + list(g.logprobs), prompt_len=len(prompt), group=group_offset + i,
                turns=[Turn(action_text=answer, kind="answer")], answer=answer, num_turns=1,
                stop_reason=EpisodeEnd.ANSWER, metrics={"answer_tokens": len(g.token_ids)}))
    return trajs, {"generate_s": 0.0, "retrieval_s": 0.0, "gen_tokens": sum(t.num_action_tokens for t in trajs)}


def draft_f1(completion, sample) -> float:
    """F1 of the episode's answer.

    >>> draft_f1(Trajectory("q", "Q?", ["Paris"], [], [], [], 0, answer="Paris"), {"answers": ["Paris"]})
    1.0
    """
    return f1_score(completion.answer or "", golds_of(completion, sample))


def check_draft(cfg, settings: DraftSettings) -> None:
    CHECK_SEEN.append(settings)
    if settings.answer_tokens > cfg.rollout.max_response_tokens:
        raise ConfigError(f"draft.answer_tokens={settings.answer_tokens} is over rollout.max_response_tokens")


DRAFT_RECIPE = {
    "name": "draft_grpo", "agent": "draft", "steps": 1, "questions_per_step": 2, "save_every": 1,
    "reward": {"draft_f1": 1.0}, "model": {"dtype": "float32"},
    "data": {"train": "demo-train", "eval": "demo-eval", "eval_n": 2},
    "algo": {"estimator": "grpo", "minibatch_size": 4, "micro_batch_size": 2},
    "rollout": {"n": 2, "max_response_tokens": 32}, "draft": {"answer_tokens": 5, "opening": "hint"},
}


@pytest.fixture
def eighth_method():
    method = register_method(Method(name="draft", paper="a test's own episode shape", trains="the LM",
                                    protocols=(DraftProtocol,), runners={"draft": run_drafts},
                                    rewards={"draft_f1": draft_f1}, answer_rewards=("draft_f1",),
                                    settings=DraftSettings, ranges={"answer_tokens": "[1, inf)"},
                                    check=check_draft))
    RUNNER_SEEN.clear()
    CHECK_SEEN.clear()
    yield method
    unregister_method("draft")
    assert "draft" not in PROTOCOLS and "draft" not in METHODS


def test_a_method_with_its_own_episode_shape_and_settings_trains_one_step(eighth_method, tmp_path, tiny_model_dir,
                                                                         demo_bm25_dir):
    recipe = tmp_path / "draft_grpo.yaml"
    recipe.write_text(yaml.safe_dump(DRAFT_RECIPE))
    cfg = load_train_config(str(recipe), [f"model.name={tiny_model_dir}", f"data.index={demo_bm25_dir}",
                                          f"out_dir={tmp_path / 'run'}"])
    assert cfg.draft == DraftSettings(answer_tokens=5, opening="hint")
    run_dir = run_recipe(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and "reward_mean" in rows[0] and rows[0]["time/update_s"] > 0
    # its runner played the episodes with its section, and its check saw the same section
    assert RUNNER_SEEN and all(s == DraftSettings(5, "hint") for s in RUNNER_SEEN)
    assert CHECK_SEEN and CHECK_SEEN[-1] == DraftSettings(5, "hint")
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["draft"] == {"answer_tokens": 5, "opening": "hint"}   # the resolved config holds it
    assert (run_dir / "final_adapter" / "adapter_config.json").is_file()


def test_its_settings_are_typed_and_checked_on_load(eighth_method, tmp_path):
    recipe = tmp_path / "draft.yaml"
    recipe.write_text(yaml.safe_dump(DRAFT_RECIPE))
    with pytest.raises(ConfigError, match=r"unknown config key 'draft.answer_token'; did you mean 'draft.answer_tokens'"):
        load_train_config(str(recipe), ["draft.answer_token=4"])
    with pytest.raises(ConfigError, match=r"draft.opening: 'hnt' is not one of none, hint; did you mean 'hint'"):
        load_train_config(str(recipe), ["draft.opening=hnt"])
    with pytest.raises(ConfigError, match="config key 'draft.answer_tokens': expected int"):
        load_train_config(str(recipe), ["draft.answer_tokens=many"])
    with pytest.raises(ConfigError, match=r"draft.answer_tokens must be >= 1, got 0"):   # its own range
        run_recipe(load_train_config(str(recipe), ["draft.answer_tokens=0", f"out_dir={tmp_path / 'a'}"]))
    with pytest.raises(ConfigError, match="draft.answer_tokens=64 is over rollout.max_response_tokens"):   # its check
        run_recipe(load_train_config(str(recipe), ["draft.answer_tokens=64", f"out_dir={tmp_path / 'b'}"]))
    # its section in another method's run would be ignored: refused
    with pytest.raises(ConfigError, match="draft.opening is a setting of a test's own episode shape"):
        run_recipe(load_train_config("search_r1_grpo", ["draft.opening=hint", f"out_dir={tmp_path / 'c'}"], "tiny"))
    assert not any((tmp_path / d).exists() for d in "abc")


def test_a_second_method_may_not_take_a_settings_section(eighth_method):
    with pytest.raises(ConfigError, match="settings section 'draft' is registered twice"):
        register_method(Method(name="draft2", paper="", trains="", settings=DraftSettings, settings_key="draft"))
    with pytest.raises(ConfigError, match="must be a dataclass"):
        register_method(Method(name="draft3", paper="", trains="", settings=dict))
    assert "draft2" not in METHODS and "draft3" not in METHODS
