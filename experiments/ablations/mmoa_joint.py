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

import argparse
from pathlib import Path

from experiments.ablations.common import (F1, MULTIHOP_EVAL, Axis, ablation_table, compare, either_axis_verdict,
                                          held_apart, held_apart_markdown, table_markdown, train_start_and_arms)
from ragrl.cli.console import setup_console
from ragrl.compare.read import POOLED
from ragrl.eval.cells import write_results
from ragrl.methods.mmoa.protocol import selector_f1

RECIPE, VARIANT = "mmoa_mappo", "learn"
JOINT, GENERATOR = "joint", "generator_only"
START = f"{JOINT} (start)"
CLAIM = f"{JOINT} − {GENERATOR}"
SELECTOR_F1 = Axis("selector F1", lambda t: selector_f1(t.metrics) if t.metrics.get("selector_precision") is not None
                   else None)
AXES = {"f1": F1, "selector_f1": SELECTOR_F1}


def arms(root: Path) -> dict[str, tuple[str, list[str]]]:
    """The two MAPPO runs from one start: {name: (recipe, overrides)}."""
    start = [f"model.init_adapter={root / 'sft' / 'adapter'}", "sft.steps=0"]
    return {JOINT: (RECIPE, start), GENERATOR: (RECIPE, [*start, "frozen_agents=[rewriter,selector]"])}


def ablation(folder: Path) -> dict:
    """The ablation's figures, per question set and pooled, from the `ragrl compare` folder, and the verdict."""
    systems = {"direct": "direct", "naive RAG": "naive_rag", "SFT start": START, JOINT: JOINT, GENERATOR: GENERATOR}
    pairs = {f"{JOINT} − SFT start": ("SFT start", JOINT), f"{GENERATOR} − SFT start": ("SFT start", GENERATOR),
             CLAIM: (GENERATOR, JOINT)}
    result = ablation_table(folder, systems, AXES, pairs)
    result["verdict"] = either_axis_verdict(result["sets"][POOLED]["paired"][CLAIM])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("runs/abl/mmoa_joint"), help="where the start and arms train")
    ap.add_argument("--n", type=int, help="the first N questions of each held-out file (default: all)")
    ap.add_argument("--out", type=Path, default=Path("experiments/ablations/results/mmoa_joint"),
                    help="where to write <out>.json and <out>.md")
    args = ap.parse_args()
    setup_console()   # the console `ragrl` shows: its own lines and bars, not the libraries'
    runs = train_start_and_arms(args.root, RECIPE, VARIANT, [], arms(args.root))
    result = ablation(compare(args.root / "compare", runs, MULTIHOP_EVAL, args.n))
    result["held_apart"] = {run.name: held_apart(run, ("f1", "selector_f1")) for run in runs}
    md = ["# MMOA-RAG's joint training, ablated (issue #58)", "",
          f"Comparison folder: `{result['compare']}`. Verdict (the rule's, pooled {CLAIM}): **{result['verdict']}**.", "",
          "Held-apart (`pool-dev`, first 50):", "", *held_apart_markdown(result["held_apart"]), ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, result, md + table_markdown(result, AXES))


if __name__ == "__main__":
    main()
