"""`ragrl compare --train`: train each recipe's variant under one time bound, into one folder, so a
comparison can follow. Every recipe is loaded (and a typo refused) before the first one trains; a
run already finished is skipped, one that was killed is resumed; each trains on its own recipe's
`train/` data, and a recipe that starts from another's adapter (R1-Searcher's stage 2 from stage 1)
starts from the run trained here. An ablation trains named arms of one recipe that differ by their
overrides (`plan_arms`) through the same loop (`train_runs`).
"""
from __future__ import annotations

import logging
from pathlib import Path

from ragrl.methods.base import method_for
from ragrl.train.checkpoint import latest_checkpoint
from ragrl.train.config import TrainConfig
from ragrl.train.recipe import load_train_config, run_recipe

log = logging.getLogger("ragrl.compare")


def _artifact_kind(cfg: TrainConfig) -> str:
    method = method_for(cfg.agent, cfg.policy)
    return "encoder" if method is not None and method.evaluation == "retriever" else "adapter"


def plan_runs(recipes: list[str], root: Path, *, variant: str | None = "tiny",
              overrides: list[str] = ()) -> list[tuple[str, TrainConfig]]:
    """(name, resolved config) per recipe, out_dir under `root`/<recipe>; an init_adapter inside an
    earlier recipe's own out_dir is moved to that recipe's run here."""
    plans, moved = [], {}
    for recipe in recipes:
        name = Path(recipe).name.removesuffix(".yaml")
        default = load_train_config(recipe, list(overrides), variant)
        cfg = load_train_config(recipe, [*overrides, f"out_dir={root / name}"], variant)
        spec = cfg.model.init_adapter
        for old, new in moved.items():
            if spec and Path(spec).is_relative_to(old):
                cfg.model.init_adapter = str(new / Path(spec).relative_to(old))
        moved[Path(default.out_dir)] = root / name
        plans.append((name, cfg))
    names = [n for n, _ in plans]
    if len(set(names)) != len(names):
        raise ValueError(f"a recipe is named twice: {names}")
    return plans


def plan_arms(arms: dict[str, tuple[str, list[str]]], root: Path, *,
              variant: str | None = None) -> list[tuple[str, TrainConfig]]:
    """(name, resolved config) per named arm {name: (recipe, overrides)}: the recipe's `variant` with
    the arm's own overrides, out_dir `root`/<name>. Every arm is resolved (a typo refused) before any trains."""
    return [(name, load_train_config(recipe, [*overrides, f"out_dir={root / name}"], variant))
            for name, (recipe, overrides) in arms.items()]


def train_runs(plans: list[tuple[str, TrainConfig]], *, minutes: float = 0) -> list[Path]:
    """Train each planned run to its fixed steps, in order (`minutes`: a safety bound on each run's RL
    alone, 0 none); a finished run is skipped, a killed one resumed. Returns the run folders."""
    dirs = []
    for name, cfg in plans:
        run_dir = Path(cfg.out_dir)
        dirs.append(run_dir)
        if (run_dir / f"final_{_artifact_kind(cfg)}").is_dir():   # written last, when a run ends
            log.info("%s: finished in %s, not trained again", name, run_dir)
            continue
        # a killed run goes on from its checkpoint, or from its SFT adapter if it died before one
        resume = latest_checkpoint(run_dir) is not None or (run_dir / "sft" / "adapter" / "adapter_config.json").is_file()
        log.info("%s: %s into %s (RL safety bound %.1f min)", name, "resuming" if resume else "training", run_dir, minutes)
        run_recipe(cfg, resume=resume, time_budget_s=minutes * 60 or None)
    return dirs


def train_recipes(recipes: list[str], root: Path, *, minutes: float, variant: str | None = "tiny",
                  overrides: list[str] = ()) -> list[Path]:
    """Train each recipe to its fixed steps (`minutes`: a safety bound on RL alone, 0 none); returns the run folders."""
    return train_runs(plan_runs(recipes, root, variant=variant, overrides=overrides), minutes=minutes)
