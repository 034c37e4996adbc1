"""Run a recipe end to end: optional SFT warm start, then RL (what `ragrl train` does).

Recipes ship inside the package (`ragrl/recipes/*.yaml`, found with importlib.resources, so they
survive `pip install`); a path to any YAML file works too. RAG-R1, SmartRAG and MMOA-RAG chain SFT
and RL; R1-Searcher chains two RL stages through `model.init_adapter`. The SFT adapter is written
to <run_dir>/sft/adapter once and reused on --resume, so a resumed run never repeats or changes its
warm start.
"""
from __future__ import annotations

import logging
import os
import time
from importlib import resources
from pathlib import Path

import yaml

from ragrl.errors import ConfigError, RankLost
from ragrl.methods.base import METHODS, SFT_BUILDERS
from ragrl.policy.lm_model import build_policy, freeze_reference
from ragrl.train.check import check_combinations
from ragrl.train.config import TrainConfig, load_train_file
from ragrl.train.distributed import close_distributed, dist_info
from ragrl.train.progress import sft_progress
from ragrl.train.rng import seed_everything
from ragrl.train.run_dir import prepare_run_dir, record_stage, setup_file_logging
from ragrl.train.trackers import check_tracker_stores
from ragrl.train.setup import default_retriever
from ragrl.train.sft import run_sft
from ragrl.train.trainer import Trainer

log = logging.getLogger("ragrl.train")


def bundled_recipes() -> dict[str, Path]:
    """The recipes shipped in the package, by name."""
    folder = resources.files("ragrl") / "recipes"
    return {p.name.removesuffix(".yaml"): Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def resolve_recipe(recipe: str) -> Path:
    """A recipe file path, or a bundled recipe name such as `search_r1_grpo`."""
    p = Path(recipe)
    if p.exists():
        return p
    known = bundled_recipes()
    name = recipe.removesuffix(".yaml")
    if name in known:
        return known[name]
    raise ConfigError(f"recipe not found: {recipe!r} (known: {', '.join(sorted(known)) or 'none'})")


def recipe_variants(path: Path) -> list[str]:
    """The names of a recipe's `variants:` (what `--variant` accepts)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return list((data.get("variants") or {}).keys())


def recipe_listing() -> list[dict]:
    """One row per shipped recipe: its name, the method whose record declares it, its variants, and
    the method's paper (what `ragrl train --list` prints)."""
    owner = {r: m for m in METHODS.values() for r in m.recipes}
    rows = []
    for name, path in sorted(bundled_recipes().items()):
        method = owner.get(name)
        rows.append({"recipe": name, "method": method.name if method else "", "variants": recipe_variants(path),
                     "paper": method.paper if method else "", "trains": method.trains if method else ""})
    return rows


def load_train_config(recipe: str | None, overrides: list[str], variant: str | None = None) -> TrainConfig:
    path = resolve_recipe(recipe) if recipe else None
    cfg = load_train_file(path, overrides, variant)
    # A schedule replaces `reward` from its first step: an override of `reward` would be accepted and
    # never used, so it is refused (the recipe's own `reward` under a schedule is only its base's).
    touched = [o for o in overrides if o.split("=", 1)[0].strip().split(".")[0] == "reward"]
    if touched and cfg.reward_schedule:
        raise ConfigError(f"{touched[0]!r}: this recipe's reward_schedule replaces `reward` from step "
                          f"{cfg.reward_schedule[0][0]}, so the override would never be used; set "
                          "reward_schedule instead, e.g. --set \"reward_schedule=[[0, {f1: 1.0}]]\"")
    return cfg


def sft_policy(cfg: TrainConfig):
    """(model, tokenizer, value head) the SFT warm start trains: built right after seeding with
    `cfg.seed`, so its LoRA initialisation (random A matrices) is the same on every run of a recipe,
    whatever the process drew before (it used to depend on that: two runs of one recipe gave different
    adapters and different starts)."""
    seed_everything(cfg.seed)
    return build_policy(cfg.model)


def sft_warm_start(cfg: TrainConfig, model, tok, retriever, out_dir: Path, progress=None):
    """Build the warm-start episodes with the recipe's builder and fit the adapter on them."""
    trajs = SFT_BUILDERS[cfg.sft.builder](cfg, model, tok, retriever)
    fit = [t for t in trajs if len(t.token_ids) <= cfg.sft.max_len]
    if len(fit) < len(trajs):
        log.info("SFT: %d of %d episodes are longer than sft.max_len=%d tokens and are left out",
                 len(trajs) - len(fit), len(trajs), cfg.sft.max_len)
    if not fit:
        raise ConfigError(f"sft.max_len={cfg.sft.max_len}: every SFT episode is longer; raise it")
    trajs = fit
    result = run_sft(model, tok, trajs, steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
                     seed=cfg.seed, out_dir=out_dir, progress=progress)
    log.info("SFT: %d steps, loss %.3f -> %.3f in %.0f s", cfg.sft.steps, result.losses[0], result.losses[-1],
             result.seconds)
    freeze_reference(model)   # RL that follows measures its KL against this warm-started policy
    return result


def launch_rank() -> int:
    """This process's rank: the process group's once joined (the Trainer joins it), before that the
    launcher's RANK (torchrun, accelerate launch), so that only rank 0 reports the SFT warm start."""
    rank, world = dist_info()
    return rank if world > 1 else int(os.environ.get("RANK", "0") or 0)


def run_recipe(cfg: TrainConfig, *, resume: bool = False, time_budget_s: float | None = None) -> Path:
    """SFT warm start (if cfg.sft.steps and no init adapter), then RL; returns the run dir.

    time_budget_s bounds the RL steps alone (Trainer.train): a lent GPU's fixed call length,
    say, without guessing a step count; the SFT stage before them is not counted."""
    check_combinations(cfg)   # a bad setting fails now, not after the SFT warm start
    run_dir = Path(cfg.out_dir)
    rank = launch_rank()
    # The run dir and its train.log from the start, not from the RL stage's (Trainer.train does both
    # again, idempotently): a dir that already has checkpoints is refused before the SFT, and the
    # SFT's log lines land in train.log as it works.
    prepare_run_dir(run_dir, resume=resume)
    setup_file_logging(run_dir, rank=rank)
    if rank == 0:   # a tracker that cannot write is refused before the SFT stage, not after it
        check_tracker_stores(cfg.report_to, run_dir)
    retriever = None   # the setup builds what its policy needs (a retriever policy samples its own)
    sft_adapter = run_dir / "sft" / "adapter"
    if cfg.sft.steps > 0 and not cfg.model.init_adapter:
        if not (resume and (sft_adapter / "adapter_config.json").exists()):
            started = time.perf_counter()
            retriever = default_retriever(cfg)
            model, tok, _ = sft_policy(cfg)
            with sft_progress(cfg.sft.steps, enabled=rank == 0) as progress:
                sft_warm_start(cfg, model, tok, retriever, run_dir / "sft", progress=progress)
            del model
            if rank == 0:
                record_stage(run_dir, "sft", time.perf_counter() - started)
        cfg.model.init_adapter = str(sft_adapter)
    started = time.perf_counter()
    trainer = Trainer(cfg, retriever=retriever)
    ok = rank_lost = False
    try:
        trainer.train(resume=resume, time_budget_s=time_budget_s)
        ok = True
    except RankLost:
        rank_lost = True
        raise
    finally:
        if dist_info()[0] == 0:   # what a report says this run cost: a killed stage's time counts too
            record_stage(run_dir, "rl", time.perf_counter() - started)
        close_distributed(ok=ok, rank_lost=rank_lost)
    return run_dir
