from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import pytest
import yaml

from ragrl.yaml_config import config_to_dict, dump_config, load_config, parse_overrides, setting
from ragrl.errors import ConfigError


@dataclass
class Optim:
    lr: float = 1e-6
    warmup_steps: int = 0
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass
class Reward:
    name: str = "em"
    weights: dict[str, float] = field(default_factory=dict)


@dataclass
class Recipe:
    model: str = "smollm2-135m"
    algo: Literal["grpo", "ppo", "reinforce++"] = "grpo"
    steps: int = 100
    bf16: bool = False
    max_turns: Optional[int] = None
    run_name: str | None = None
    out_dir: Path = Path("runs")
    stop: list[str] = field(default_factory=lambda: ["</search>"])
    optim: Optim = field(default_factory=Optim)
    rewards: list[Reward] = field(default_factory=list)

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults_without_a_recipe():
    assert load_config(Recipe) == Recipe()


def test_nested_dataclasses_from_yaml(tmp_path):
    path = write(tmp_path / "r.yaml", """
model: smollm2-360m
algo: ppo
steps: 50
optim: {lr: 1e-5, betas: [0.8, 0.9]}
rewards:
  - {name: f1}
  - {name: cost, weights: {search: -0.1}}
""")
    cfg = load_config(Recipe, path)
    assert cfg.model == "smollm2-360m" and cfg.algo == "ppo" and cfg.steps == 50
    assert cfg.optim == Optim(lr=1e-5, warmup_steps=0, betas=(0.8, 0.9))  # "1e-5" is a str in YAML 1.1
    assert isinstance(cfg.optim.lr, float)
    assert cfg.rewards == [Reward("f1"), Reward("cost", {"search": -0.1})]


def test_overrides_are_typed(tmp_path):
    cfg = load_config(Recipe, None, ["optim.lr=3e-6", "steps=7", "bf16=true", "max_turns=4",
                                     "run_name=1.10", "stop=[a, b]", "out_dir=/tmp/x", "algo=reinforce++",
                                     "optim.warmup_steps=1e2"])
    assert cfg.optim.lr == 3e-6 and cfg.steps == 7 and cfg.bf16 is True and cfg.max_turns == 4
    assert cfg.run_name == "1.10"  # a str field keeps the text exactly as typed
    assert cfg.stop == ["a", "b"] and cfg.out_dir == Path("/tmp/x") and cfg.algo == "reinforce++"
    assert cfg.optim.warmup_steps == 100
    assert load_config(Recipe, None, ["max_turns=null"]).max_turns is None


def test_parse_overrides():
    assert parse_overrides(["a.b=1", "a.c=x y", "d=[1, 2]", "e="]) == {"a": {"b": 1, "c": "x y"}, "d": [1, 2], "e": None}
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["steps"])
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["optim..lr=1"])


def test_unknown_key_suggests_close_match(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.lrr'; did you mean 'optim.lr'\?"):
        load_config(Recipe, None, ["optim.lrr=1e-5"])
    path = write(tmp_path / "r.yaml", "stepz: 3\n")
    with pytest.raises(ConfigError, match=r"'stepz'; did you mean 'steps'"):
        load_config(Recipe, path)
    with pytest.raises(ConfigError, match=r"unknown config key 'rewards\[0\]\.nmae'; did you mean 'rewards\[0\]\.name'"):
        load_config(Recipe, write(tmp_path / "r2.yaml", "rewards: [{nmae: em}]\n"))


def test_wrong_types_name_key_type_and_value(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'steps': expected int, got str 'many'"):
        load_config(Recipe, None, ["steps=many"])
    with pytest.raises(ConfigError, match=r"'bf16': expected bool, got int 1"):
        load_config(Recipe, None, ["bf16=1"])
    with pytest.raises(ConfigError, match=r"algo: 'dpo' is not one of grpo, ppo, reinforce\+\+; did you mean 'ppo'\?"):
        load_config(Recipe, None, ["algo=dpo"])
    with pytest.raises(ConfigError, match=r"'optim.betas': expected 2 items, got 3"):
        load_config(Recipe, None, ["optim.betas=[1, 2, 3]"])
    with pytest.raises(ConfigError, match=r"'optim': expected Optim, got int 3"):
        load_config(Recipe, None, ["optim=3"])
    with pytest.raises(ConfigError, match=r"'rewards\[0\].weights.search': expected float"):
        load_config(Recipe, write(tmp_path / "r.yaml", "rewards: [{weights: {search: lots}}]\n"))
    with pytest.raises(ConfigError, match="steps must be >= 0"):  # __post_init__ validation
        load_config(Recipe, None, ["steps=-1"])


def test_variants_deep_merge(tmp_path):
    path = write(tmp_path / "r.yaml", """
steps: 1000
optim: {lr: 1e-6, warmup_steps: 10}
variants:
  tiny: {steps: 2, optim: {warmup_steps: 0}}
""")
    assert load_config(Recipe, path).steps == 1000
    tiny = load_config(Recipe, path, variant="tiny")
    assert tiny.steps == 2 and tiny.optim.warmup_steps == 0 and tiny.optim.lr == 1e-6
    assert load_config(Recipe, path, ["steps=3"], variant="tiny").steps == 3  # overrides win over variants
    with pytest.raises(ConfigError, match=r"no variant 'tiyn'; did you mean 'tiny'"):
        load_config(Recipe, path, variant="tiyn")


def test_base_inheritance_is_relative_and_detects_loops(tmp_path):
    (tmp_path / "common").mkdir()
    write(tmp_path / "common" / "base.yaml", """
model: smollm2-360m
steps: 500
optim: {lr: 2e-6, warmup_steps: 5}
variants: {tiny: {steps: 1}}
""")
    child = write(tmp_path / "child.yaml", "base: common/base.yaml\nsteps: 80\noptim: {lr: 1e-6}\n")
    cfg = load_config(Recipe, child)
    assert cfg.model == "smollm2-360m" and cfg.steps == 80
    assert cfg.optim.lr == 1e-6 and cfg.optim.warmup_steps == 5
    assert load_config(Recipe, child, variant="tiny").steps == 1  # variants are inherited too
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="inheritance loop"):
        load_config(Recipe, tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="recipe not found"):
        load_config(Recipe, write(tmp_path / "c.yaml", "base: missing.yaml\n"))


def test_bad_yaml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(Recipe, write(tmp_path / "r.yaml", "steps: [1, 2\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(Recipe, write(tmp_path / "r2.yaml", "- 1\n- 2\n"))


def test_dump_load_round_trip(tmp_path):
    cfg = load_config(Recipe, None, ["run_name=yes", "optim.lr=3e-6", "max_turns=4", "algo=ppo",
                                     "rewards=[{name: f1, weights: {f1: 1.0, search: -0.05}}]"])
    assert cfg.run_name == "yes"  # not YAML's boolean
    path = dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(Recipe, path) == cfg
    data = config_to_dict(cfg)
    assert data["optim"]["betas"] == [0.9, 0.999] and data["out_dir"] == "runs"
    assert yaml.safe_load(path.read_text()) == data


def test_an_override_inside_an_untyped_mapping_is_resolved_to_its_value():
    """`--set reward.smartrag.cost=0.5` reaches the reward as the number 0.5 (the cost sweep)."""
    from ragrl.rewards.registry import make_reward
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("smartrag_ppo", ["reward.smartrag.cost=0.5"], "tiny")
    assert cfg.reward == {"smartrag": {"cost": 0.5, "invalid_penalty": 1.0}}
    assert make_reward(cfg.reward).terms[0].options == {"cost": 0.5, "invalid_penalty": 1.0}


@dataclass
class WithReward:
    steps: int = setting(1, help="Steps.")
    reward: dict = setting(factory=lambda: {"f1": 1.0}, whole=True, help="The reward spec.")


def test_a_whole_setting_a_child_recipe_sets_replaces_its_bases_in_the_recipe_and_inherited_variants(tmp_path):
    """R1-Searcher's recipes are children of Search-R1's: their own reward must not gain Search-R1's
    f1 (nor its tiny variant's format term), as merging did. Within one file a variant still merges
    into its recipe's reward, and so does --set reward.NAME=W."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(
        {"reward": {"f1": 1.0}, "variants": {"tiny": {"steps": 3, "reward": {"f1": 1.0, "format": 0.2}}}}))
    (tmp_path / "child.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "reward": {"stage1": 1.0}}))
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(
        {"base": "base.yaml", "reward": {"stage2": 1.0}, "variants": {"tiny": {"reward": {"extra": 0.5}}}}))
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "steps": 7}))
    assert load_config(WithReward, tmp_path / "child.yaml").reward == {"stage1": 1.0}
    tiny = load_config(WithReward, tmp_path / "child.yaml", variant="tiny")
    assert tiny.reward == {"stage1": 1.0} and tiny.steps == 3      # the variant's sizes are still inherited
    assert load_config(WithReward, tmp_path / "own.yaml", variant="tiny").reward == {"stage2": 1.0, "extra": 0.5}
    assert load_config(WithReward, tmp_path / "plain.yaml", variant="tiny").reward == {"f1": 1.0, "format": 0.2}
    assert load_config(WithReward, tmp_path / "child.yaml", ["reward.format=0.1"]).reward == {"stage1": 1.0, "format": 0.1}
    # --set of the whole setting replaces it (terms set after it still merge), in a variant too
    assert load_config(WithReward, tmp_path / "own.yaml", ["reward={em: 1.0}"], variant="tiny").reward == {"em": 1.0}
    assert load_config(WithReward, tmp_path / "own.yaml", ["reward={em: 1.0}", "reward.f1=0.3"]).reward == {
        "em": 1.0, "f1": 0.3}


def test_the_shipped_r1_searcher_recipes_keep_the_papers_rewards():
    from ragrl.train.recipe import load_train_config

    for variant in (None, "tiny"):
        assert load_train_config("r1_searcher_stage1", [], variant).reward == {"r1_searcher_stage1": 1.0}
        assert load_train_config("r1_searcher_stage2", [], variant).reward == {"r1_searcher_stage2": 1.0}
