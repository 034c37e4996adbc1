"""MMOA-RAG's claim as an ablation (issue #58): training the rewriter, selector and generator jointly
beats training the generator alone.

One SFT start (`mmoa_mappo --variant learn`), then two arms from it, identical but for
`frozen_agents` (none, against [rewriter, selector]; with one adapter per agent a frozen agent stays as
it began): the variant's fixed 14 MAPPO steps, seed 0 (the rule in experiments/README.md,
"Ablations"). Then `ragrl compare` of both arms and their common start on the leaderboard's 803
multi-hop `eval/` questions (BM25 over the full corpus, greedy), and the ablation's table from the
comparison's per-question episodes, per set and pooled: answer F1 and selector F1 (its kept documents
against the gold passages) per system; paired, each arm against the start and joint against
generator-only (the claim's figure); the verdict the rule fixed before the runs. A finished run is
reused and a killed one resumed.

    .venv/bin/python -m experiments.ablations.mmoa_joint
"""
from __future__ import annotations

from pathlib import Path

from experiments.ablations.common import (F1, MULTIHOP_EVAL, Axis, ablation_args, claim_label, compare,
                                          either_axis_verdict, held_apart, keep_run_files, pair_markdown, pair_table,
                                          train_start_and_arms)
from ragrl.compare.read import POOLED
from ragrl.eval.cells import write_results
from ragrl.methods.mmoa.protocol import selector_f1

RECIPE, VARIANT = "mmoa_mappo", "learn"
JOINT, GENERATOR = "joint", "generator_only"
CLAIM = claim_label(JOINT, GENERATOR)
SELECTOR_F1 = Axis("selector F1", lambda t: selector_f1(t.metrics) if t.metrics.get("selector_precision") is not None
                   else None)
AXES = {"f1": F1, "selector_f1": SELECTOR_F1}


def arms(root: Path) -> dict[str, tuple[str, list[str]]]:
    """The two MAPPO runs from one start: {name: (recipe, overrides)}."""
    start = [f"model.init_adapter={root / 'sft' / 'adapter'}", "sft.steps=0"]
    return {JOINT: (RECIPE, start), GENERATOR: (RECIPE, [*start, "frozen_agents=[rewriter,selector]"])}


def ablation(folder: Path) -> dict:
    """The ablation's figures, per question set and pooled, from the `ragrl compare` folder, and the verdict."""
    result = pair_table(folder, JOINT, GENERATOR, AXES)
    result["verdict"] = either_axis_verdict(result["sets"][POOLED]["paired"][CLAIM])
    return result


def main() -> None:
    args = ablation_args(__doc__, "runs/abl/mmoa_joint", "experiments/ablations/results/mmoa_joint")
    runs = train_start_and_arms(args.root, RECIPE, VARIANT, [], arms(args.root))
    folder = compare(args.root / "compare", runs, MULTIHOP_EVAL, args.n)
    result = ablation(folder)
    result["held_apart"] = {run.name: held_apart(run, ("f1", "selector_f1")) for run in runs}
    write_results(args.out, result, pair_markdown("MMOA-RAG's joint training, ablated", CLAIM, result, AXES,
                                                  "`pool-dev`, first 50"))
    keep_run_files(args.out, folder, {run.name: run for run in runs})


if __name__ == "__main__":
    main()
