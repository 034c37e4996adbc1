"""Curves of the GPU MAPPO runs (G: lr 1e-4, H and I: lr 3e-4), from their tracked metrics.

    python -m experiments.mmoa.mmoa_gpu_curves     # -> results/mmoa_gpu_curves.png, mmoa_gpu_train_curves.png, .json

pool-dev (mmoa_gpu_curves.png): G and H evaluated all 200 `pool-dev` questions (held apart from
training) before their first step and every 5 steps; `keep_best` kept the step with the highest
selector F1. I evaluated nothing on the device (35 steps, final adapter kept): its one point is the
CPU decode of its final adapter (`results/mmoa_pooldev_cpu.json`), drawn as a star.
Training (mmoa_gpu_train_curves.png): what each step's own sampled pipelines scored (temperature
0.7; 16 questions a step, so a 5-step moving average). No held-out question is read here.
"""
from __future__ import annotations

import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = {"G: lr 1e-4": "mmoa_g_h200", "H: lr 3e-4": "mmoa_h_h200"}
TRAIN_RUNS = {**RUNS, "I: lr 3e-4, no device eval": "mmoa_i_h200"}
METRICS = {"selector_f1": "selector F1", "f1": "answer F1", "selector_kept": "documents kept (greedy)"}
# Per step, over the sampled pipelines: (metrics.jsonl key, title, scale to the pool-dev units)
TRAIN = {"rollout/selector_f1": ("selector F1", 100.0), "f1": ("answer F1", 100.0),
         "rollout/selector_kept": ("documents kept", 1.0)}
I_POOLDEV = ("I: H without device evaluation, 35 steps (final)", 35)   # system name in mmoa_pooldev_cpu.json, steps


def curve(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(steps done, value), ...]} from a run's start evaluation and every `eval/` row."""
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in METRICS}
    for k in METRICS:
        out[k].append((0, rows[0][f"start/{k}"]))
        # the row of step s (0-based) is logged after s + 1 steps, so its evaluation is of s + 1
        out[k] += [(r["step"] + 1, r[f"eval/{k}"]) for r in rows if f"eval/{k}" in r]
    return out


def train_curve(rows: list[dict], window: int = 5) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(steps done, trailing `window`-step mean), ...]} of a run's rollout metrics in TRAIN."""
    out = {}
    for k, (_, scale) in TRAIN.items():
        vals = [scale * r[k] for r in rows]
        out[k] = [(r["step"] + 1, round(sum(vals[max(0, i + 1 - window): i + 1]) / min(window, i + 1), 3))
                  for i, r in enumerate(rows)]
    return out


def i_pooldev() -> dict[str, float]:
    """I's final adapter on pool-dev, decoded on the CPU ({"selector_f1", "f1", "selector_kept"})."""
    row = json.loads((RESULTS / "mmoa_pooldev_cpu.json").read_text())["sets"]["pool-dev"]["systems"][I_POOLDEV[0]]
    # mmoa_eval writes [mean, CI low, CI high] per score, and the kept count as selected_per_q
    return {"selector_f1": row["selector_f1"][0], "f1": row["f1"][0], "selector_kept": row["selected_per_q"]}


def plot(curves: dict, metrics: dict, title: str, path: Path, extra: dict | None = None) -> None:
    fig = Figure(figsize=(12, 3.6))
    for i, (k, name_k) in enumerate(metrics.items()):
        ax = fig.add_subplot(1, len(metrics), i + 1)
        for name, c in curves.items():
            xs, ys = zip(*c[k])
            ax.plot(xs, ys, marker="o" if len(xs) < 10 else None, label=name)
        if extra:
            ax.plot([I_POOLDEV[1]], [extra[k]], marker="*", markersize=12, linestyle="", color="C2",
                    label="I (final, CPU decode)")
        ax.set_title(f"{title} {name_k}")
        ax.set_xlabel("MAPPO steps (16 questions each)")
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend()
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)


def main() -> None:
    from ragrl.train.run_dir import read_metrics

    rows = {name: read_metrics(RESULTS / d) for name, d in TRAIN_RUNS.items()}   # each run's file read once
    curves = {name: curve(rows[name]) for name in RUNS}
    train = {name: train_curve(rows[name]) for name in TRAIN_RUNS}
    i_point = i_pooldev()
    plot(curves, METRICS, "pool-dev", RESULTS / "mmoa_gpu_curves.png", extra=i_point)
    plot(train, {k: t for k, (t, _) in TRAIN.items()}, "sampled (5-step mean)", RESULTS / "mmoa_gpu_train_curves.png")
    out = {**curves, "I: final adapter, pool-dev (CPU)": i_point, "train": train}
    (RESULTS / "mmoa_gpu_curves.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out)[:2000])


if __name__ == "__main__":
    main()
