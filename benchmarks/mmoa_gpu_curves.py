"""pool-dev curves of the two GPU MAPPO runs (G: lr 1e-4, H: lr 3e-4), from their tracked metrics.

    python benchmarks/mmoa_gpu_curves.py     # -> results/mmoa_gpu_curves.png and .json

Each run evaluated all 200 `pool-dev` questions (held apart from training) before its first step
and every 5 steps; `keep_best` kept the step with the highest selector F1. No held-out question is
read here: these are the curves that chose the kept adapters.
"""
from __future__ import annotations

import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = {"G: lr 1e-4": "mmoa_g_h200", "H: lr 3e-4": "mmoa_h_h200"}
METRICS = {"selector_f1": "selector F1", "f1": "answer F1", "selector_kept": "documents kept (greedy)"}


def curve(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(steps done, value), ...]} from the start evaluation and every `eval/` row."""
    from ragrl.train.run_dir import read_metrics

    rows = read_metrics(run_dir)
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in METRICS}
    for k in METRICS:
        out[k].append((0, rows[0][f"start/{k}"]))
        # the row of step s (0-based) is logged after s + 1 steps, so its evaluation is of s + 1
        out[k] += [(r["step"] + 1, r[f"eval/{k}"]) for r in rows if f"eval/{k}" in r]
    return out


def main() -> None:
    curves = {name: curve(RESULTS / d) for name, d in RUNS.items()}
    fig = Figure(figsize=(12, 3.6))
    for i, (k, title) in enumerate(METRICS.items()):
        ax = fig.add_subplot(1, len(METRICS), i + 1)
        for name, c in curves.items():
            xs, ys = zip(*c[k])
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_title(f"pool-dev {title}")
        ax.set_xlabel("MAPPO steps (16 questions each)")
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend()
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(RESULTS / "mmoa_gpu_curves.png", dpi=100)
    (RESULTS / "mmoa_gpu_curves.json").write_text(json.dumps(curves, indent=1) + "\n")
    print(json.dumps(curves))


if __name__ == "__main__":
    main()
