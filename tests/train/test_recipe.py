"""The shipped recipes: found as package data, resolved to their committed snapshot (changed only on purpose), and
every recipe and variant trains one step on the tiny model (chained stages included)."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
import yaml

from ragrl.errors import ConfigError
from ragrl.methods import METHODS
from ragrl.train.recipe import (
    bundled_recipes,
    load_train_config,
    recipe_listing,
    recipe_variants,
    resolve_recipe,
    run_recipe,
    sft_policy,
)

SNAPSHOT = Path(__file__).with_name("snapshots") / "resolved_recipes.json"
CASES = [(name, variant) for name, path in sorted(bundled_recipes().items())
         for variant in [None, *recipe_variants(path)]]


def test_recipes_are_package_data_found_by_name_and_typos_are_named():
    recipes = bundled_recipes()
    assert {"search_r1_grpo", "search_r1_ppo", "r1_searcher_stage1", "r1_searcher_stage2", "rag_r1_ppo",
            "smartrag_ppo", "mmoa_mappo", "harr_grpo", "harr_ppo"} <= set(recipes)
    assert resolve_recipe("search_r1_grpo") == recipes["search_r1_grpo"]
    assert "site-packages" in str(recipes["search_r1_grpo"]) or "src/ragrl/recipes" in str(recipes["search_r1_grpo"])
    with pytest.raises(ConfigError, match="recipe not found: 'search_r1_gpro'.*search_r1_grpo"):
        resolve_recipe("search_r1_gpro")


def test_every_method_declares_recipes_that_ship_and_every_recipe_belongs_to_a_method():
    shipped = set(bundled_recipes())
    declared = {r for m in METHODS.values() for r in m.recipes}
    assert declared == shipped
    rows = recipe_listing()
    assert {r["recipe"] for r in rows} == shipped
    grpo = next(r for r in rows if r["recipe"] == "search_r1_grpo")
    assert grpo["method"] == "search_r1" and "tiny" in grpo["variants"]


@pytest.mark.parametrize("name,variant", CASES, ids=[f"{n}:{v or ''}" for n, v in CASES])
def test_each_recipe_resolves_to_its_committed_snapshot(name, variant):
    """The resolved config of every recipe and variant equals the committed one: a recipe (or a
    config default) changes only on purpose, with the snapshot in the same commit."""
    want = json.loads(SNAPSHOT.read_text())[f"{name}:{variant or ''}"]
    assert asdict(load_train_config(name, [], variant)) == want


def test_the_snapshot_covers_every_recipe_and_variant():
    assert set(json.loads(SNAPSHOT.read_text())) == {f"{n}:{v or ''}" for n, v in CASES}


def one_step_overrides(cfg, out: Path, tiny_model_dir, demo_bm25_dir, small_dense_dir) -> list[str]:
    """Settings that shrink any recipe to one step on the tiny model and the demo data, keeping
    its method, estimator, reward and stages."""
    sets = [f"out_dir={out}", "steps=1", "questions_per_step=2", "save_every=1", "eval_every=0", "keep_best=null",
            "eval_start=false", "data.train=demo-train", "data.eval=demo-eval", "data.eval_n=2",
            "algo.minibatch_size=4", "algo.micro_batch_size=2", "critic_warmup=0",
            "rollout.n=2"]
    if cfg.policy == "lm":
        # the fewest turns the recipe's episode shape allows: a forced second search needs a third turn
        turns = 3 if cfg.rollout.second_action == "search" else 2
        sets += [f"model.name={tiny_model_dir}", "model.dtype=float32", "model.lora_layers=null",
                 f"data.index={demo_bm25_dir}", "data.corpus=null", "data.vectors=null",
                 f"rollout.max_turns={turns}", "rollout.max_turn_tokens=16", "rollout.max_response_tokens=48"]
        if cfg.sft.steps > 0:
            sets += ["sft.steps=1", "sft.batch_size=2", "sft.max_questions=4"]
    else:
        sets += [f"data.index={small_dense_dir}", "data.corpus=null", "data.vectors=null",
                 "retriever.filter_questions=false", "retriever.pool=8"]
        if cfg.retriever.generator:   # the frozen reader: the tiny model stands in for SmolLM2
            sets += [f"retriever.generator={tiny_model_dir}", "model.dtype=float32", "rollout.max_turns=2",
                     "rollout.max_turn_tokens=16", "rollout.max_response_tokens=48"]
    return sets


@pytest.mark.parametrize("name,variant", CASES, ids=[f"{n}:{v or ''}" for n, v in CASES])
def test_every_recipe_and_variant_trains_one_step(name, variant, tmp_path, tiny_model_dir, demo_bm25_dir,
                                                  small_dense_dir):
    """One real step of each shipped recipe (its SFT stage first where it has one); R1-Searcher's
    stage 2 starts from the adapter stage 1 wrote, as its recipe chains them."""
    cfg = load_train_config(name, [], variant)
    stage_one = None
    if cfg.model.init_adapter and not Path(cfg.model.init_adapter).exists():   # a chained stage
        first = name.replace("stage2", "stage1")
        assert first != name and first in bundled_recipes(), f"{name}: where does {cfg.model.init_adapter} come from?"
        base = load_train_config(first, [], variant)
        stage_one = tmp_path / "stage1"
        run_recipe(load_train_config(first, one_step_overrides(base, stage_one, tiny_model_dir, demo_bm25_dir,
                                                               small_dense_dir), variant))
    sets = one_step_overrides(cfg, tmp_path / "run", tiny_model_dir, demo_bm25_dir, small_dense_dir)
    if stage_one is not None:
        sets.append(f"model.init_adapter={stage_one / 'final_adapter'}")
    cfg = load_train_config(name, sets, variant)
    run_dir = run_recipe(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 0
    assert rows[0]["time/update_s"] > 0
    artifact = "final_encoder" if cfg.policy != "lm" else "final_adapter"
    assert (run_dir / artifact).is_dir()
    stages = [s["stage"] for s in json.loads((run_dir / "training.json").read_text())["stages"]]
    if cfg.sft.steps > 0 and stage_one is None:
        assert (run_dir / "sft" / "adapter" / "adapter_config.json").is_file()
        assert stages == ["sft", "rl"]
    else:
        assert stages == ["rl"]


def test_an_enumerated_title_group_trains_one_step(tmp_path, tiny_model_dir, demo_bm25_dir, small_dense_dir):
    """The Search-R1 learn variant with each candidate title once in a group (rollout.title_group:
    every) and the enumerated estimator: a real step whose groups hold at most n episodes, one per
    title, and whose row says how many titles a question had."""
    base = load_train_config("search_r1_grpo", [], "learn")
    sets = one_step_overrides(base, tmp_path / "run", tiny_model_dir, demo_bm25_dir, small_dense_dir)
    # W's shape (the question's search, then a second whose title is chosen), which AG's variant is not
    sets += ["rollout.first_action=question", "rollout.second_action=search", "rollout.max_turns=3",
             "rollout.end_after_searches=2",
             "rollout.second_query=question_title", "rollout.title_group=every", "rollout.n=4",
             "algo.estimator=enumerated", "questions_per_step=4", "rollout.max_turn_tokens=40",
             "rollout.max_response_tokens=400"]   # room for the first search's passages and the second query
    cfg = load_train_config("search_r1_grpo", sets, "learn")
    run_dir = run_recipe(cfg)
    [row] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/title_candidates"] >= 1
    assert 0 <= row["rollout/title_candidates_cut"] <= 1
    assert (run_dir / "final_adapter").is_dir()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["title_group"] == "every"


def test_the_sft_policy_is_seeded_whatever_the_process_drew_before(tiny_model_dir):
    """The SFT stage's LoRA init comes from `seed`, not from the process's RNG state: two runs of one
    recipe gave different adapters (and starts) before, as the Search-R1 learn candidates showed."""
    cfg = load_train_config("search_r1_grpo", [f"model.name={tiny_model_dir}", "model.dtype=float32"], "tiny")
    torch.manual_seed(1)
    first = sft_policy(cfg)[0].state_dict()
    torch.rand(1000)   # whatever the process draws in between
    second = sft_policy(cfg)[0].state_dict()
    lora = [k for k in first if "lora_A" in k]
    assert lora and all(torch.equal(first[k], second[k]) for k in lora)
    other = sft_policy(replace(cfg, seed=cfg.seed + 1))[0].state_dict()
    assert any(not torch.equal(first[k], other[k]) for k in lora)   # the seed decides it

