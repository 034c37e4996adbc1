"""Write docs/results/leaderboard.md from a comparison's folder (`ragrl compare --out DIR`):
the settings (experiments/leaderboard/preamble.md), one compact row per system, then the comparison's
full tables (compare.md) and its plot.

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


def _d(d: dict | None) -> str:
    """ΔF1 of a paired-difference section; empty where the system has none."""
    return diff_cell(d["f1"]) if d and "f1" in d else ""


def compact_table(data: dict) -> list[str]:
    """One row per system, ranked by F1 (the baselines and starts in the same ranking)."""
    rows = sorted(data["rows"].items(), key=lambda kv: -kv[1]["f1"]["mean"])
    md = ["| rank | system | method | F1 | EM | answer@shown | searches/q | ΔF1 vs naive RAG | ΔF1 vs its start | trained for (this CPU) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for i, (name, r) in enumerate(rows, 1):
        start = data["vs_start"].get(name)
        vs_start = f"{_d(start)} ({start['verdict']})" if start else ""
        t = r.get("trained") or {}
        trained = f"{t['seconds'] / 60:.0f} min" if t.get("seconds") else ""
        md.append(f"| {i} | {name} | {r['method'] or 'baseline'} | {ci_cell(r['f1'])} | {ci_cell(r['em'])} | {ci_cell(r['answer_shown'])} "
                  f"| {r['searches']['mean']:.2f} | {_d(data['vs_baseline'].get(name))} | {vs_start} | {trained} |")
    return md


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
            "Ranked by F1 (percent, 95% bootstrap CIs over the 300 questions). Δ: paired bootstrap over the same "
            "questions, percentage points.", "", *compact_table(data), "",
            f"![F1 against searches per question]({image.name})", "", (HERE / "findings.md").read_text().rstrip()
            if (HERE / "findings.md").is_file() else "", "", "## Every column", "", "### Systems", full.rstrip(), "",
            "Back to the [README](../../README.md#results)."]
    args.out.write_text("\n".join(text) + "\n")
    print("\n".join(compact_table(data)))


if __name__ == "__main__":
    main()
