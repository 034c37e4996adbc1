"""RAG-R1's claim as an ablation (issue #58): several queries a search, retrieved as one batch, reach the
answer in fewer search calls and turns than one query a search, at equal or better search gain.

One SFT start (`rag_r1_ppo --variant learn`), then two arms from it, identical but for
`rollout.max_queries_per_call` (3 as shipped, against 1; the prompt names the bound): the variant's
fixed 40 PPO steps, seed 0 (the rule in experiments/README.md, "Ablations"). Then `ragrl compare` of
both arms and their common start on the leaderboard's 803 multi-hop `eval/` questions (BM25 over the
full corpus, greedy), and the ablation's table from the comparison's per-question episodes, per set
and pooled: search calls, turns and queries per question, search gain, F1 and format errors per
system; paired, each arm against the start and three queries against one (the claim's figure); the
verdict the rule fixed before the runs. A finished run is reused and a killed one resumed.

    .venv/bin/python -m experiments.ablations.rag_r1_queries
"""
from __future__ import annotations

from pathlib import Path

from experiments.ablations.common import (F1, FORMAT_ERRORS, MULTIHOP_EVAL, SEARCH_GAIN, Axis,
                                          ablation_args, claim_label, compare, held_apart, keep_run_files, pair_markdown,
                                          pair_table, train_start_and_arms)
from ragrl.compare.read import POOLED
from ragrl.eval.cells import write_results

RECIPE, VARIANT = "rag_r1_ppo", "learn"
MULTI, SINGLE = "three_queries", "one_query"
CLAIM = claim_label(MULTI, SINGLE)
COMMON = ("eval_every=20", "eval_start=false", "sft.steps=0")
SEARCH_GAIN_MARGIN = 2.0   # the rule's "equal or better search gain": Δ's CI lower end at or above -2 points
# Calls are the episode's search turns. Not `num_searches`: `ragrl compare` sets that to the queries
# searched (one search event per query, ragrl.eval.search_payoff), which is the claim's other side.
AXES = {"search_calls": Axis("search calls/q", lambda t: float(sum(u.kind == "search" for u in t.turns)),
                             scale=1.0, fmt=".2f"),
        "turns": Axis("turns/q", lambda t: float(t.num_turns), scale=1.0, fmt=".2f"),
        "queries": Axis("queries/q", lambda t: float(sum(len(u.queries) for u in t.turns if u.kind == "search")),
                        scale=1.0, fmt=".2f"),
        "search_gain": SEARCH_GAIN, "f1": F1, "format_errors": FORMAT_ERRORS}


def arms(root: Path) -> dict[str, tuple[str, list[str]]]:
    """The two RL runs from one start: {name: (recipe, overrides)}."""
    sft = root / "sft" / "adapter"
    return {name: (RECIPE, [f"model.init_adapter={sft}", f"rollout.max_queries_per_call={k}", *COMMON])
            for name, k in ((MULTI, 3), (SINGLE, 1))}


def verdict(claim: dict[str, dict | None]) -> str:
    """The rule's verdict from the pooled three queries − one query differences.

    >>> d = lambda lo, hi: {"diff": (lo + hi) / 2, "ci_lo": lo, "ci_hi": hi}
    >>> verdict({"search_calls": d(-0.3, -0.1), "search_gain": d(-1.5, 2.0)})
    'reproduced in direction'
    >>> verdict({"search_calls": d(-0.3, -0.1), "search_gain": d(-2.5, 2.0)})
    'no clear difference'
    >>> verdict({"search_calls": d(0.1, 0.3), "search_gain": d(0.0, 2.0)})
    'not reproduced'
    >>> verdict({"search_calls": d(-0.3, 0.1), "search_gain": d(-5, -3)})
    'not reproduced'
    """
    calls, gain = claim["search_calls"], claim["search_gain"]
    if calls["ci_hi"] < 0 and gain is not None and gain["ci_lo"] >= -SEARCH_GAIN_MARGIN:
        return "reproduced in direction"
    if calls["ci_lo"] > 0 or (gain is not None and gain["ci_hi"] < -SEARCH_GAIN_MARGIN):
        return "not reproduced"
    return "no clear difference"


def ablation(folder: Path) -> dict:
    """The ablation's figures, per question set and pooled, from the `ragrl compare` folder, and the verdict."""
    result = pair_table(folder, MULTI, SINGLE, AXES)
    result["verdict"] = verdict(result["sets"][POOLED]["paired"][CLAIM])
    return result


def main() -> None:
    args = ablation_args(__doc__, "runs/abl/rag_r1_queries", "experiments/ablations/results/rag_r1_queries")
    runs = train_start_and_arms(args.root, RECIPE, VARIANT, [], arms(args.root))
    folder = compare(args.root / "compare", runs, MULTIHOP_EVAL, args.n)
    result = ablation(folder)
    result["held_apart"] = {run.name: held_apart(run) for run in runs}
    write_results(args.out, result, pair_markdown("RAG-R1's several queries a search, ablated", CLAIM, result, AXES,
                                                  "`pool-dev`, first 100"))
    keep_run_files(args.out, folder, {run.name: run for run in runs})


if __name__ == "__main__":
    main()
