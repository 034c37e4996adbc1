"""Every judged candidate of issue #53 on the two search conditions at once: its own search gain (do
its searches find what the question's own top N does not?) against its search gain over its start
(did RL move them?), from the committed `ragrl compare` results.

Each point is one trained run judged on one question set (a run judged twice, on held-apart
`train/` questions and once on `eval/`, is two points). The conditions hold together in the
quadrant own ≥ 0 with the Δ's paired 95% CI above 0; a filled marker is a Δ whose CI is above 0.
Writes OUT.json, OUT.md (a row per point) and OUT.png. Reads only committed files; decides nothing.

    .venv/bin/python -m experiments.search_agents.candidates_map
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import yaml
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from ragrl.eval.cells import ci_cell, diff_cell, markdown_table, write_results  # noqa: E402

RESULTS = Path("experiments/search_agents/results")
METHODS = {"search_r1_grpo": "Search-R1", "r1_searcher_stage1": "R1-Searcher", "r1_searcher_stage2": "R1-Searcher",
           "rag_r1_ppo": "RAG-R1", "smartrag_ppo": "SmartRAG"}
COLORS = {"Search-R1": "tab:blue", "R1-Searcher": "tab:orange", "RAG-R1": "tab:green", "SmartRAG": "tab:purple"}


def question_set(meta_questions: str) -> str:
    """The judged set's short name from a comparison's `meta.questions`.

    >>> question_set("803: kit:eval/hotpotqa_dev.jsonl.gz, kit:eval/musique_dev.jsonl.gz (all)")
    'eval/ (803)'
    >>> question_set("450: pool-dev (first 150), agent-confirm (first 150), x (first 150)")
    'held-apart train/ (450)'
    """
    n, _, files = meta_questions.partition(": ")
    return f"eval/ ({n})" if "eval/" in files else f"held-apart train/ ({n})"


def points(compare: dict, methods: dict[str, str]) -> list[dict]:
    """One point per run the comparison pairs with its start and measures the search gain of:
    {run, method, questions, delta (paired record), own, start (CI records), format_errors (%)}.
    `methods`: run name -> method; a run it lacks is left out (a diagnostic, not a candidate)."""
    out = []
    for run, paired in (compare.get("vs_start") or {}).items():
        delta, own = paired.get("search_gain"), compare["rows"][run].get("search_gain")
        if run not in methods or delta is None or own is None:
            continue
        fmt = compare["rows"][run].get("format_error_rate")
        out.append({"run": run, "method": methods[run], "questions": question_set(compare["meta"]["questions"]),
                    "delta": delta, "own": own, "start": compare["rows"].get(f"{run} (start)", {}).get("search_gain"),
                    "format_errors": None if fmt is None else 100 * fmt})
    return out


def both_hold(p: dict) -> bool:
    """Both search conditions: the Δ's CI above 0 and the own search gain at least 0."""
    return p["delta"]["ci_lo"] > 0 and p["own"]["mean"] >= 0


def run_methods(results: Path) -> dict[str, str]:
    """run name -> method, from each run's committed config (`<run>_config.yaml`'s recipe name)."""
    out = {}
    for cfg in results.glob("*_config.yaml"):
        name = (yaml.safe_load(cfg.read_text()) or {}).get("name")
        if name in METHODS:
            out[cfg.name.removesuffix("_config.yaml")] = METHODS[name]
    return out


def plot(pts: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8.5, 6))
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.axvspan(0, 12, ymin=0, ymax=1, color="tab:green", alpha=0.06, label="own search gain ≥ 0")
    for p in pts:
        d, own = p["delta"], p["own"]
        on_eval = p["questions"].startswith("eval/")
        color = COLORS[p["method"]]
        ax.errorbar(own["mean"], d["diff"], yerr=[[d["diff"] - d["ci_lo"]], [d["ci_hi"] - d["diff"]]], fmt="none",
                    ecolor=color, alpha=0.35, lw=1)
        ax.scatter(own["mean"], d["diff"], marker="*" if on_eval else "o", s=120 if on_eval else 36,
                   facecolors=color if d["ci_lo"] > 0 else "white", edgecolors=color, zorder=3)
        ax.annotate(p["run"].removeprefix("learn_") + (" (eval/)" if on_eval else ""), (own["mean"], d["diff"]),
                    fontsize=6.5, xytext=(3, 3), textcoords="offset points")
    for method, color in COLORS.items():
        ax.scatter([], [], color=color, label=method)
    ax.scatter([], [], marker="*", s=120, color="black", label="judged on eval/")
    ax.scatter([], [], marker="o", facecolors="white", edgecolors="black", label="Δ's CI reaches 0")
    ax.set(xlabel="own search gain at equal passages (points; trained run)",
           ylabel="search gain − its start's (points; paired, 95% CI)",
           title="Issue #53's candidates: both conditions hold only in the shaded band with a filled marker")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="the committed comparisons and configs")
    ap.add_argument("--out", type=Path, default=Path("docs/results/search_agents_candidates_map"),
                    help="where to write <out>.json, <out>.md and <out>.png")
    args = ap.parse_args()
    methods = run_methods(args.results)
    pts = [p for f in sorted(args.results.glob("*_compare.json")) for p in points(json.loads(f.read_text()), methods)]
    result = {"points": pts, "both_hold": [f"{p['run']} on {p['questions']}" for p in pts if both_hold(p)]}
    md = ["# Issue #53's candidates on both search conditions", "",
          "From `experiments/search_agents/candidates_map.py`; BM25 over the full 51,185-passage corpus, greedy.", ""]
    md += markdown_table(["run", "method", "questions", "Δsearch gain vs start", "own search gain", "start's", "format errors %"],
                         [[p["run"], p["method"], p["questions"], diff_cell(p["delta"]), ci_cell(p["own"], signed=True),
                           ci_cell(p["start"], signed=True), "" if p["format_errors"] is None else f"{p['format_errors']:.1f}"]
                          for p in pts])
    md += ["", "Both conditions hold: " + (", ".join(result["both_hold"]) or "none")]
    write_results(args.out, result, md)
    plot(pts, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
