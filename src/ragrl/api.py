"""ragrl's Python API: the public, stable names a notebook or script uses (the README's "Python"
section). Everything else in the package may change between versions; these do not without a
deprecation.

    from ragrl.api import load_recipe, register_reward, train, compare, read_metrics

    cfg = load_recipe("search_r1_grpo", variant="tiny", overrides={"steps": 2})
    run_dir = train(cfg)
    table = compare([run_dir], data="demo-eval", n=10)

A reward is a plain function `f(completion, sample, **options) -> float`; `completion` is the
trajectory (or its text), `sample` the question row (`question`, `answers`, ...). Registered under a
name, a recipe's `reward:` block (or `cfg.reward`) weighs it like the built-in ones.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from ragrl.compare.comparison import run_comparison
from ragrl.errors import ConfigError, RagrlError
from ragrl.kit import inspect_kit
from ragrl.registry import load_plugins
from ragrl.rewards.qa import answer_of
from ragrl.rewards.registry import REWARDS, RewardFn
from ragrl.train.check import check_combinations
from ragrl.train.config import TrainConfig
from ragrl.train.recipe import load_train_config, run_recipe
from ragrl.train.run_dir import read_metrics

__all__ = ["TrainConfig", "answer_of", "compare", "inspect_kit", "load_recipe", "read_metrics",
           "register_reward", "train", "RagrlError", "ConfigError"]

_USER_REWARDS: set[str] = set()   # names register_reward added (a notebook may re-run its cell)


def _override_items(overrides: Mapping | list[str] | None) -> list[str]:
    """{"algo.lr": 1e-5, "reward": {"f1": 1}} or ["algo.lr=1e-5"] -> the `--set` items."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in overrides.items()]
    if isinstance(overrides, (list, tuple)) and all(isinstance(o, str) for o in overrides):
        return list(overrides)
    raise ConfigError(f"overrides must be a mapping of dotted keys to values or a list of 'key=value', "
                      f"got {type(overrides).__name__}")


def load_recipe(recipe: str | Path, *, variant: str | None = None,
                overrides: Mapping | list[str] | None = None) -> TrainConfig:
    """A shipped recipe (by name, e.g. "search_r1_grpo") or a YAML file, with its variant and overrides
    applied and every setting checked (`ragrl train RECIPE --explain` documents each one)."""
    cfg = load_train_config(str(recipe), _override_items(overrides), variant)
    check_combinations(cfg)
    return cfg


def register_reward(name: str, fn: RewardFn | None = None):
    """Make `fn(completion, sample, **options) -> float` available to recipes as `name`. Usable as a
    decorator (`@register_reward("brevity")`). Re-registering a name this function added replaces
    it (a notebook cell run twice); a built-in or a method's reward is never replaced."""
    def add(f: RewardFn) -> RewardFn:
        if not callable(f):
            raise ConfigError(f"reward {name!r}: expected a function, got {type(f).__name__}")
        load_plugins()   # so a method's reward of the same name is seen (and refused) now
        if name in REWARDS and name not in _USER_REWARDS:
            raise ConfigError(f"reward {name!r} is a built-in or a method's reward; choose another name")
        REWARDS.register(name, f, replace=True)
        _USER_REWARDS.add(name)
        return f
    return add if fn is None else add(fn)


def train(cfg: TrainConfig, *, resume: bool = False, time_budget_s: float | None = None) -> Path:
    """Train as `ragrl train` does (the SFT warm start if the recipe has one, then `cfg.steps` RL steps
    into `cfg.out_dir`) and return the run folder. `time_budget_s` is only a safety bound."""
    return run_recipe(cfg, resume=resume, time_budget_s=time_budget_s)


def compare(runs: list[str | Path], *, data: str | list[str], n: int | None = None, out: str | Path | None = None,
            **options) -> dict:
    """`ragrl compare`: each run evaluated as it was trained, its start, `direct` and `naive_rag` on the
    same questions and corpus. Returns the table: `table["rows"][system]["f1"]["mean"]`, and the paired
    differences `table["vs_baseline"]` (against naive_rag) and `table["vs_start"]`. Writes compare.md
    and the rest into `out` (default: runs/compare). Options: those of run_comparison (index, corpus,
    reader, topk, seed, ...)."""
    data = [data] if isinstance(data, (str, Path)) else list(data)
    return run_comparison([Path(r) for r in runs], data=[str(d) for d in data], n=n,
                          out=Path(out) if out is not None else Path("runs/compare"), **options)
