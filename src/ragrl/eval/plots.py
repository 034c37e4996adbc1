"""PNG plots for reports and training curves (matplotlib, Agg canvas).

We draw on a bare `Figure` + Agg canvas instead of pyplot: no global backend switch,
no figure registry to leak, safe to call from a training loop or a server.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path


from ragrl.errors import RagrlError
from ragrl.eval.stats import METRIC_TITLES, QA_METRICS, summary_of

DPI = 100


def _save(fig, path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # late: matplotlib takes ~0.5 s to import
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def bar_chart(results: dict[str, dict], path: str | Path, *, figsize: tuple[float, float] = (9.0, 4.5),
              title: str = "QA accuracy by system (95% CI)") -> Path:
    """Grouped bars: one group per system, one bar per metric (EM, F1, cover-EM), CI whiskers.

    results: {system: {"summary": ...}}, evaluate()'s {system: {"trajectories", "wall_s"}}, or {system: summary}. The PNG is figsize * 100 px.
    """
    from matplotlib.figure import Figure  # late: matplotlib takes ~0.5 s to import
    if not results:
        raise RagrlError("bar_chart: no systems to plot")
    systems = list(results)
    summaries = [summary_of(r) for r in results.values()]
    fig = Figure(figsize=figsize)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(QA_METRICS)
    for j, key in enumerate(QA_METRICS):
        xs = [i + (j - (len(QA_METRICS) - 1) / 2) * width for i in range(len(systems))]
        means = [s[key]["mean"] for s in summaries]
        err = [[s[key]["mean"] - s[key]["ci_lo"] for s in summaries],
               [s[key]["ci_hi"] - s[key]["mean"] for s in summaries]]
        bars = ax.bar(xs, means, width, yerr=err, capsize=3, label=METRIC_TITLES[key])
        ax.bar_label(bars, labels=[f"{m:.1f}" for m in means], padding=2, fontsize=7)
    ax.set_xticks(range(len(systems)), systems, rotation=15 if len(systems) > 4 else 0)
    top = max(s[k]["ci_hi"] for s in summaries for k in QA_METRICS)
    ax.set_ylim(0, min(100.0, top * 1.15 + 2))
    ax.set_ylabel("score (%)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _series(rows: Sequence[dict], key: str, x: str) -> tuple[list[float], list[float]]:
    """(xs, ys) for one key, skipping rows without a finite number for it."""
    xs, ys = [], []
    for i, row in enumerate(rows):
        y = row.get(key)
        if isinstance(y, bool) or not isinstance(y, (int, float)) or not math.isfinite(y):
            continue
        xs.append(row.get(x, i))
        ys.append(float(y))
    return xs, ys


def _ema(ys: list[float], smooth: float) -> list[float]:
    out, acc = [], ys[0]
    for y in ys:
        acc = smooth * acc + (1 - smooth) * y
        out.append(acc)
    return out


def line_plot(metrics_rows: Sequence[dict], keys: Sequence[str], path: str | Path, x: str = "step", *,
              smooth: float = 0.0, cols: int = 3, panel_size: tuple[float, float] = (4.0, 3.0)) -> list[str]:
    """Training curves: one subplot per key that has data, laid out `cols` per row.

    metrics_rows: e.g. the trainer's logged dicts {"step": 10, "reward": 0.3, ...}; a row
    without `x` uses its index. Keys missing from every row are skipped. smooth in [0, 1)
    adds an exponential moving average over the raw (faint) curve. A key whose rows also hold
    `<key>_lo` and `<key>_hi` (a confidence interval) gets a shaded band between them. The PNG is
    (cols' * panel_w, rows * panel_h) * 100 px where cols' = min(cols, plotted keys).
    Returns the keys that were plotted.
    """
    from matplotlib.figure import Figure  # late: matplotlib takes ~0.5 s to import
    if not 0.0 <= smooth < 1.0:
        raise RagrlError(f"line_plot: smooth must be in [0, 1), got {smooth}")
    series = {k: _series(metrics_rows, k, x) for k in keys}
    plotted = [k for k in keys if series[k][1]]
    if not plotted:
        seen = sorted({k for row in metrics_rows for k in row})
        raise RagrlError(f"line_plot: none of {list(keys)} has numeric values in the rows (keys seen: {seen})")
    ncols = min(cols, len(plotted))
    nrows = math.ceil(len(plotted) / ncols)
    fig = Figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows))
    for i, key in enumerate(plotted):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        xs, ys = series[key]
        if smooth > 0:
            ax.plot(xs, ys, alpha=0.3, color="C0")
            ax.plot(xs, _ema(ys, smooth), color="C0")
        else:
            ax.plot(xs, ys, color="C0", marker="." if len(xs) <= 50 else None)
        lo_x, lo = _series(metrics_rows, f"{key}_lo", x)
        hi_x, hi = _series(metrics_rows, f"{key}_hi", x)
        if lo and lo_x == hi_x == xs:
            ax.fill_between(xs, lo, hi, color="C0", alpha=0.2, linewidth=0)
        ax.set_title(key + (" (95% CI)" if lo and lo_x == hi_x == xs else ""))
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return plotted


def f1_vs_searches(rows: dict[str, dict], path: str | Path, *, title: str = "F1 against searches per question") -> Path:
    """One point per system: searches per question (x) against F1 (y), 95% CI bars on both; a run and
    its start are joined by an arrow from start to trained, so the change RL made reads at a glance.

    rows: {system: {"f1": {"mean", "ci_lo", "ci_hi"}, "searches": {...}, "role": ...}} (ragrl.compare.table)."""
    from matplotlib.figure import Figure  # late: matplotlib takes ~0.5 s to import
    if not rows:
        raise RagrlError("f1_vs_searches: no systems to plot")
    fig = Figure(figsize=(8.0, 5.5))
    ax = fig.add_subplot(1, 1, 1)
    for name, r in rows.items():
        x, y = r["searches"], r["f1"]
        marker = {"baseline": "s", "start": "o", "trained": "D"}.get(r.get("role"), "o")
        ax.errorbar(x["mean"], y["mean"], xerr=[[x["mean"] - x["ci_lo"]], [x["ci_hi"] - x["mean"]]],
                    yerr=[[y["mean"] - y["ci_lo"]], [y["ci_hi"] - y["mean"]]], fmt=marker, capsize=3,
                    mfc="white" if r.get("role") == "start" else None, label=name)
        ax.annotate(name, (x["mean"], y["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        start = rows.get(f"{name} (start)")
        if r.get("role") == "trained" and start is not None:
            ax.annotate("", (x["mean"], y["mean"]), (start["searches"]["mean"], start["f1"]["mean"]),
                        arrowprops={"arrowstyle": "->", "alpha": 0.5})
    ax.set_xlabel("searches per question")
    ax.set_ylabel("F1 (%)")
    ax.set_title(title + " (95% CI; hollow: a run's start, arrow: its RL)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)
