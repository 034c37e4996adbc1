"""Issue #53's learning curves: the held-apart evaluations a run logged while it trained (its start, then
every `eval_every` steps), for one or more runs side by side (the CPU variant and the GPU run, say).

Panels: the search gain at equal passages, answer@shown, F1 (each with its 95% CI), searches per
question and format errors, against the RL steps trained. Reads each run's metrics.jsonl only (offline,
seconds); writes OUT.png and OUT.json (the points plotted).

    .venv/bin/python -m experiments.search_agents.learn_curves \
        --run "CPU, 4 q x 8=runs/learn_a" --run "H100, 32 q x 8=experiments/search_agents/results/gpu_s1" \
        --out docs/results/search_agents_learn_curves
    (add --after "LABEL=16" for a run that continued 16 steps of an earlier stage)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure

from ragrl.errors import RagrlError
from ragrl.train.run_dir import evaluation_points, read_metrics

PANELS = [("search_gain", "search gain at equal passages (points)"), ("answer_shown", "answer@shown (%)"),
          ("f1", "F1 (%)"), ("searches", "searches per question"), ("format_error_rate", "format errors (%)")]


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    fig = Figure(figsize=(4.2 * len(PANELS), 3.4))
    for i, (key, title) in enumerate(PANELS):
        ax = fig.add_subplot(1, len(PANELS), i + 1)
        for label, points in runs.items():
            pts = [p for p in points if key in p]
            xs = [p["trained_steps"] for p in pts]
            scale = 100.0 if key == "format_error_rate" else 1.0
            ys = [scale * p[key] for p in pts]
            line = ax.plot(xs, ys, marker="o", label=label)[0]
            if pts and f"{key}_lo" in pts[0]:
                ax.fill_between(xs, [p[f"{key}_lo"] for p in pts], [p[f"{key}_hi"] for p in pts],
                                color=line.get_color(), alpha=0.15)
        if key == "search_gain":
            ax.axhline(0.0, color="grey", lw=0.8, ls="--")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL steps trained")
    fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR (a folder with metrics.jsonl)")
    ap.add_argument("--out", required=True, help="output path without suffix (writes .png and .json)")
    ap.add_argument("--after", action="append", default=[],
                    help="LABEL=STEPS: that run started after STEPS RL steps of an earlier stage (R1-Searcher's "
                         "stage 2 after stage 1), so its points are drawn from there")
    args = ap.parse_args()
    offsets = {}
    for spec in args.after:
        label, sep, steps = spec.rpartition("=")
        if not sep or not steps.isdigit():
            raise RagrlError(f"--after {spec!r}: expected LABEL=STEPS")
        offsets[label] = int(steps)
    if unknown := sorted(set(offsets) - {spec.partition("=")[0] for spec in args.run}):
        raise RagrlError(f"--after names no --run label: {', '.join(unknown)}")
    runs = {}
    for spec in args.run:
        label, sep, folder = spec.partition("=")
        if not sep or not label or not folder:
            raise RagrlError(f"--run {spec!r}: expected LABEL=RUN_DIR")
        points = evaluation_points(read_metrics(Path(folder)))
        if not points:
            raise RagrlError(f"--run {spec!r}: {folder}/metrics.jsonl holds no evaluation (eval_start / eval_every)")
        runs[label] = [{**p, "trained_steps": p["trained_steps"] + offsets.get(label, 0)} for p in points]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, out.with_suffix(".png"))
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1))
    print(f"wrote {out.with_suffix('.png')} and .json")


if __name__ == "__main__":
    main()
