"""R1-Searcher's claim as an ablation (issue #58): two RL stages (first a reward for searching in format,
then one for the answer) beat RL on the answer reward alone, at equal total steps.

One SFT start (`r1_searcher_stage1 --variant learn`'s gold-search warm start), then two arms from it,
identical but for what their first 20 steps reward (the rule in experiments/README.md, "Ablations"):
- two stages: stage 1 for 20 steps, then stage 2 for 20 from stage 1's final adapter;
- stage 2 alone: stage 2 for 40 steps.
Both use the paper's rewards (stage 1: 0.5 for a search + 0.5 for format; stage 2: F1, minus 2 when
malformed) and a free first action, on the `learn` variants' sizes. Then `ragrl compare` of both arms
and their common start on the leaderboard's 803 multi-hop `eval/` questions (BM25 over the full corpus,
greedy), and the ablation's table from the comparison's per-question episodes, per set and pooled:
F1, search gain, searches per question and format errors per system; paired ΔF1 and Δsearch gain of
each arm against the start and of two stages against stage 2 alone (the claim's figure); the verdict
the rule fixed before the runs; a plot of the claim's paired differences. A finished run is reused and
a killed one resumed, so the command can be run again.

    .venv/bin/python -m experiments.ablations.r1_searcher_stages
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from experiments.ablations.common import (F1, FORMAT_ERRORS, MULTIHOP_EVAL, SEARCH_GAIN, SEARCHES,  # noqa: E402
                                          ablation_args, claim_label, compare, either_axis_verdict, held_apart,
                                          keep_run_files, pair_markdown, pair_table, train_start_and_arms)
from ragrl.compare.read import POOLED  # noqa: E402
from ragrl.eval.cells import write_results  # noqa: E402

VARIANT, STAGE_STEPS = "learn", 20
STAGE1, TWO, ALONE = "two_stages_stage1", "two_stages", "stage2_alone"
CLAIM = claim_label(TWO, ALONE)
# The paper's rewards in place of `learn`'s (which adds search_gain to both stages), a free first action
# in place of `learn`'s forced search: why, in the rule. The evaluations add held-apart figures only.
STAGE1_REWARD, STAGE2_REWARD = "reward={r1_searcher_stage1: 1.0}", "reward={r1_searcher_stage2: 1.0}"
COMMON = ("rollout.first_action=free", "eval_every=20", "eval_start=false", "sft.steps=0")
SAFETY_MINUTES = 90.0   # a bound on each run's RL, a safety only: a run it cuts is reported as cut
AXES = {"f1": F1, "search_gain": SEARCH_GAIN, "searches": SEARCHES, "format_errors": FORMAT_ERRORS}
CLAIM_AXES = ("f1", "search_gain")   # the paper's axes, which the verdict reads


def arms(root: Path) -> dict[str, tuple[str, list[str]]]:
    """The three RL runs, in training order: {name: (recipe, overrides)}."""
    sft = root / "sft" / "adapter"
    return {STAGE1: ("r1_searcher_stage1", [f"model.init_adapter={sft}", STAGE1_REWARD, *COMMON]),
            TWO: ("r1_searcher_stage2", [f"model.init_adapter={root / STAGE1 / 'final_adapter'}", STAGE2_REWARD,
                                         f"steps={STAGE_STEPS}", *COMMON]),
            ALONE: ("r1_searcher_stage2", [f"model.init_adapter={sft}", STAGE2_REWARD, f"steps={2 * STAGE_STEPS}",
                                           *COMMON])}


def train(root: Path) -> list[Path]:
    """The SFT start, then the three runs; a finished one is skipped, a killed one resumed."""
    return train_start_and_arms(root, "r1_searcher_stage1", VARIANT, [STAGE1_REWARD, COMMON[0]], arms(root),
                                minutes=SAFETY_MINUTES)


def ablation(folder: Path) -> dict:
    """The ablation's figures, per question set and pooled, from the `ragrl compare` folder, and the verdict."""
    result = pair_table(folder, TWO, ALONE, AXES)
    result["verdict"] = either_axis_verdict({k: result["sets"][POOLED]["paired"][CLAIM][k] for k in CLAIM_AXES})
    return result


def claim_plot(result: dict, path: Path) -> None:
    """Two stages − stage 2 alone, ΔF1 and Δsearch gain per set and pooled, with 95% CIs."""
    sets = list(result["sets"])
    fig, ax = plt.subplots(figsize=(1.6 * len(sets) + 2.5, 3.4))
    for k, metric in enumerate(CLAIM_AXES):
        ds = [result["sets"][s]["paired"][CLAIM][metric] for s in sets]
        xs = [j + (k - 0.5) * 0.3 for j, d in enumerate(ds) if d is not None]
        ds = [d for d in ds if d is not None]
        ax.errorbar(xs, [d["diff"] for d in ds], yerr=[[d["diff"] - d["ci_lo"] for d in ds], [d["ci_hi"] - d["diff"] for d in ds]],
                    fmt="o", capsize=3, label=f"Δ{AXES[metric].label}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(sets)), [f"{s}\n({result['sets'][s]['n']} q)" for s in sets], fontsize=8)
    ax.set(ylabel=f"{CLAIM} (points)", title=f"R1-Searcher's stages: {result['verdict']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = ablation_args(__doc__, "runs/abl/r1_searcher_stages", "experiments/ablations/results/r1_searcher_stages")
    stage1, two, alone = train(args.root)
    folder = compare(args.root / "compare", [two, alone], MULTIHOP_EVAL, args.n)
    result = ablation(folder)
    result["held_apart"] = {TWO: {**held_apart(stage1), **{STAGE_STEPS + s: v for s, v in held_apart(two).items()}},
                            ALONE: held_apart(alone)}
    write_results(args.out, result, pair_markdown("R1-Searcher's two stages, ablated", CLAIM, result, AXES,
                                                  "`pool-dev`, first 100; the step counts both stages"))
    claim_plot(result, args.out.with_suffix(".png"))
    keep_run_files(args.out, folder, {run.name: run for run in (stage1, two, alone)})


if __name__ == "__main__":
    main()
