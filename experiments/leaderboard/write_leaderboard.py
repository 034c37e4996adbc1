"""Write docs/results/leaderboard.md and leaderboard.json from a comparison's folder (`ragrl compare --out
DIR`): the settings (experiments/leaderboard/preamble.md), one compact row per system, then the
comparison's full tables (compare.md) and its plot; the JSON holds the compact table's figures.

    .venv/bin/python -m experiments.leaderboard.write_leaderboard runs/leaderboard/compare
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from ragrl.eval.cells import ci_cell, diff_cell

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _d(d: dict | None, metric: str = "f1") -> str:
    """A paired difference of `metric` from a paired-difference section; empty where there is none."""
    return diff_cell(d[metric]) if d and metric in d else ""


def _trained(r: dict) -> str:
    t = r.get("trained") or {}
    return f"{t['seconds'] / 60:.0f} min" if t.get("seconds") else ""


def _ranked(data: dict) -> list[tuple[str, dict]]:
    """The comparison's rows by F1, best first (the baselines and starts in the same ranking)."""
    return sorted(data["rows"].items(), key=lambda kv: -kv[1]["f1"]["mean"])


def compact_table(data: dict) -> list[str]:
    """One row per system, ranked by F1 (the baselines and starts in the same ranking), the search gain at
    equal passages and answer@shown beside F1 (issue #53), each run's paired differences against its start
    and its training time on the machine its `training.json` names."""
    md = ["| rank | system | method | F1 | answer@shown | search gain | searches/q | format errors "
          "| ΔF1 vs its start | Δsearch gain vs its start | ΔF1 vs naive RAG | trained for |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, (name, r) in enumerate(_ranked(data), 1):
        start = data["vs_start"].get(name)
        vs_start = f"{_d(start)} ({start['verdict']})" if start else ""
        gain = ci_cell(r["search_gain"], signed=True) if r.get("search_gain") else "n/a"
        md.append(f"| {i} | {name} | {r['method'] or 'baseline'} | {ci_cell(r['f1'])} | {ci_cell(r['answer_shown'])} "
                  f"| {gain} | {r['searches']['mean']:.2f} | {100 * r['format_error_rate']:.1f}% | {vs_start} "
                  f"| {_d(start, 'search_gain')} | {_d(data['vs_baseline'].get(name))} | {_trained(r)} |")
    return md


def leaderboard_record(data: dict) -> dict:
    """What `leaderboard.json` keeps of a comparison: its settings and, per system in F1 order, the
    figures of the compact table as records (mean and CI; paired differences with their p-values)."""
    keep = ("f1", "em", "cover_em", "answer_shown", "search_gain", "searches")
    systems = []
    for name, r in _ranked(data):
        start, base = data["vs_start"].get(name), data["vs_baseline"].get(name)
        systems.append({"system": name, "method": r["method"] or "baseline", "role": r.get("role"),
                        "run": r.get("run"), "questions": r["n"], **{k: r.get(k) for k in keep},
                        "format_error_rate": r["format_error_rate"], "seconds_per_q": r.get("seconds_per_q"),
                        "trained": r.get("trained"),
                        "vs_start": {k: start[k] for k in ("f1", "search_gain", "verdict") if k in start}
                        if start else None,
                        "vs_naive_rag": {k: base[k] for k in ("f1", "search_gain") if k in base} if base else None})
    return {"meta": data["meta"], "baseline": data.get("baseline"), "systems": systems}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("compare_dir", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "leaderboard.md")
    args = ap.parse_args()
    data = json.loads((args.compare_dir / "compare.json").read_text())
    full = (args.compare_dir / "compare.md").read_text().split("\n## Systems\n", 1)[1]
    full = full.replace("![F1 against searches](f1_vs_searches.png)", "")
    image = args.out.parent / "leaderboard_f1_vs_searches.png"
    shutil.copyfile(args.compare_dir / "f1_vs_searches.png", image)
    text = [(HERE / "preamble.md").read_text().rstrip(), "", "## The table", "",
            f"Ranked by F1 (percent, 95% bootstrap CIs over the {data['meta']['questions'].split(':')[0]} questions). "
            "Search gain: 1 where the passages a system showed hold an answer, minus 1 where the question's own "
            "BM25 top N does (N: the passages it showed). Δ: paired bootstrap over the same questions, "
            "percentage points.", "", *compact_table(data), "",
            f"![F1 against searches per question]({image.name})", "", (HERE / "findings.md").read_text().rstrip()
            if (HERE / "findings.md").is_file() else "", "", "## Every column", "", "### Systems", full.rstrip(), "",
            "Back to the [README](../../README.md#results)."]
    args.out.write_text("\n".join(text) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(leaderboard_record(data), indent=1) + "\n")
    print("\n".join(compact_table(data)))


if __name__ == "__main__":
    main()
