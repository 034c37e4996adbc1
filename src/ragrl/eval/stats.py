"""Evaluation statistics: bootstrap confidence intervals, paired differences, summaries.

Eval sets here are small (a few hundred questions), so a single EM number moves by
several points between seeds. Every reported mean therefore carries a percentile
bootstrap CI, and before/after comparisons use a *paired* bootstrap over the same
questions, which is far tighter than comparing two independent CIs.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ragrl.errors import RagrlError
from ragrl.rollout.trajectory import Trajectory

QA_METRICS = ("em", "f1", "cover_em")
SEARCH_METRICS = ("search_gain", "answer_shown")   # per-question metrics a search-gain measurement writes
METRIC_TITLES = {"em": "EM", "f1": "F1", "cover_em": "cover-EM"}
_MAX_DRAWS_PER_CHUNK = 4_000_000  # bounds the [n_boot, n] index matrix to ~32 MB


def _as_vector(values: Iterable[float], name: str) -> np.ndarray:
    x = np.asarray(list(values), dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise RagrlError(f"{name}: need a non-empty list of numbers, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise RagrlError(f"{name}: contains NaN or infinite values")
    return x


def _bootstrap_means(x: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of `n_boot` resamples (with replacement) of x. x: [n] -> [n_boot]."""
    if n_boot < 1:
        raise RagrlError(f"n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    n = x.size
    rows_per_chunk = max(1, _MAX_DRAWS_PER_CHUNK // n)
    out = np.empty(n_boot, dtype=np.float64)
    for start in range(0, n_boot, rows_per_chunk):
        stop = min(n_boot, start + rows_per_chunk)
        idx = rng.integers(0, n, size=(stop - start, n))  # [chunk, n]
        out[start:stop] = x[idx].mean(axis=1)
    return out


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise RagrlError(f"alpha must be in (0, 1), got {alpha}")


def bootstrap_ci(
    values: Sequence[float], *, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, lo, hi): the sample mean and its (1 - alpha) percentile-bootstrap interval."""
    _check_alpha(alpha)
    x = _as_vector(values, "bootstrap_ci")
    means = _bootstrap_means(x, n_boot, seed)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(x.mean()), float(lo), float(hi)


def ci_record(values: Sequence[float], *, scale: float = 100.0, n_boot: int = 2000, alpha: float = 0.05,
              seed: int = 0) -> dict:
    """The one record of a mean with its bootstrap CI (`bootstrap_ci`), in the table's unit (`scale`
    100: fractions become percent): {"mean", "ci_lo", "ci_hi", "n"}. `ragrl.eval.cells.ci_cell` formats it.

    >>> ci_record([0, 1, 1, 1])["mean"], ci_record([2, 2], scale=1.0)
    (75.0, {'mean': 2.0, 'ci_lo': 2.0, 'ci_hi': 2.0, 'n': 2})
    """
    mean, lo, hi = bootstrap_ci(values, n_boot=n_boot, alpha=alpha, seed=seed)
    return {"mean": scale * mean, "ci_lo": scale * lo, "ci_hi": scale * hi, "n": len(values)}


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float, float]:
    """Compare system B with system A on the same questions (a[i], b[i] score question i).

    Returns (mean of b - a, lo, hi, p) where [lo, hi] is the percentile-bootstrap CI of
    the mean difference and p is the one-sided p-value for "B is not better than A":
    the share of resampled mean differences <= 0, with the +1 correction so that it is
    never exactly 0 from a finite number of resamples.
    """
    _check_alpha(alpha)
    xa, xb = _as_vector(a, "paired_bootstrap_diff a"), _as_vector(b, "paired_bootstrap_diff b")
    if xa.size != xb.size:
        raise RagrlError(f"paired_bootstrap_diff: a has {xa.size} values but b has {xb.size}; "
                         "a paired test needs the same questions in the same order")
    diff = xb - xa
    means = _bootstrap_means(diff, n_boot, seed)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    p = (1.0 + float(np.sum(means <= 0.0))) / (1.0 + n_boot)
    return float(diff.mean()), float(lo), float(hi), p


def paired_record(a: Sequence[float], b: Sequence[float], *, scale: float = 100.0, n_boot: int = 2000,
                  alpha: float = 0.05, seed: int = 0) -> dict:
    """The one record of a paired difference b - a (`paired_bootstrap_diff`), in the table's unit
    (`scale` 100: fractions become points): {"diff", "ci_lo", "ci_hi", "p_value", "n"}.
    `ragrl.eval.cells.diff_cell` formats it.

    >>> r = paired_record([0, 0, 1, 1], [1, 0, 1, 1])
    >>> r["diff"], r["n"], r["ci_lo"] >= 0.0, r["ci_hi"] <= 100.0
    (25.0, 4, True, True)
    """
    d, lo, hi, p = paired_bootstrap_diff(a, b, n_boot=n_boot, alpha=alpha, seed=seed)
    return {"diff": scale * d, "ci_lo": scale * lo, "ci_hi": scale * hi, "p_value": p, "n": len(a)}


def paired_z(a: Sequence[float], b: Sequence[float]) -> float:
    """z of the paired mean difference b - a: mean / (sample sd / sqrt(n)), the normal-approximation
    statistic behind a family-wise (Bonferroni) threshold, e.g. |z| >= 3.28 for 38 two-sided tests at 0.05.
    a, b: [n] scores of the same questions in the same order. 0 when every difference is 0; +-inf when
    all differences are equal and non-zero.

    >>> round(paired_z([0, 0, 0, 0], [1, 0, 1, 2]), 3)   # diffs 1, 0, 1, 2: mean 1, sd 0.816, n 4
    2.449
    >>> paired_z([1, 2], [1, 2]), paired_z([0, 0], [1, 1])
    (0.0, inf)
    """
    xa, xb = _as_vector(a, "paired_z a"), _as_vector(b, "paired_z b")
    if xa.size != xb.size or xa.size < 2:
        raise RagrlError(f"paired_z: needs two equal-length score lists of >= 2 questions, got {xa.size} and {xb.size}")
    diff = xb - xa
    mean, sd = float(diff.mean()), float(diff.std(ddof=1))
    if sd == 0.0:
        return 0.0 if mean == 0.0 else float(np.copysign(np.inf, mean))
    return mean / (sd / float(np.sqrt(diff.size)))


def _metric(t: Trajectory, key: str) -> float:
    if key not in t.metrics:
        raise RagrlError(f"trajectory {t.sample_id!r} has no metric {key!r} "
                         f"(has: {sorted(t.metrics)}); score trajectories before summarizing")
    v = float(t.metrics[key])
    if not 0.0 <= v <= 1.0:
        raise RagrlError(f"trajectory {t.sample_id!r}: metric {key!r} = {v} is outside [0, 1]")
    return v


def gen_tokens(t: Trajectory) -> int:
    """Generated tokens of one trajectory: metrics['gen_tokens'], else its action tokens."""
    return int(t.metrics.get("gen_tokens", t.num_action_tokens))


def per_question_scores(trajs: Sequence[Trajectory]) -> dict[str, dict[str, float]]:
    """{sample_id: {metric: score}}; several samples of one question are averaged."""
    sums: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for t in trajs:
        row = sums.setdefault(t.sample_id, dict.fromkeys(QA_METRICS, 0.0))
        for key in QA_METRICS:
            row[key] += _metric(t, key)
        counts[t.sample_id] = counts.get(t.sample_id, 0) + 1
    return {sid: {k: v / counts[sid] for k, v in row.items()} for sid, row in sums.items()}


def summarize(
    trajs: Sequence[Trajectory],
    wall_time_s: float,
    *,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
    per_question: bool = False,
) -> dict:
    """One system's numbers over its trajectories (one per question).

    em / f1 / cover_em: `ci_record`s, {"mean", "ci_lo", "ci_hi", "n"} in percent (0-100).
    format_error_rate, answer_rate and retrieval_rate (a question searched at least once) are
    fractions (0-1); *_per_q are means per trajectory.
    With per_question=True the summary also carries {sample_id: {metric: score in 0-1}}
    so that compare_report can pair systems question by question.
    """
    trajs = list(trajs)
    if not trajs:
        raise RagrlError("summarize: no trajectories (did the eval run on zero questions?)")
    summary: dict = {"n": len(trajs)}
    for key in QA_METRICS:
        summary[key] = ci_record([_metric(t, key) for t in trajs], n_boot=n_boot, alpha=alpha, seed=seed)
    n = len(trajs)
    summary["searches_per_q"] = sum(t.num_searches for t in trajs) / n
    summary["retrieval_rate"] = sum(t.num_searches > 0 for t in trajs) / n
    summary["turns_per_q"] = sum(t.num_turns for t in trajs) / n
    summary["tokens_per_q"] = sum(gen_tokens(t) for t in trajs) / n
    summary["format_error_rate"] = sum(t.format_errors > 0 for t in trajs) / n
    summary["answer_rate"] = sum(bool(t.answer and t.answer.strip()) for t in trajs) / n
    # The search gain at equal passages and answer@shown (eval/search_gain.py, ragrl compare), in
    # percent with CIs, over the questions that have them (not yes/no), where they were measured.
    for key in SEARCH_METRICS:
        values = [t.metrics[key] for t in trajs if t.metrics.get(key) is not None]
        if values:
            summary[key] = ci_record(values, n_boot=n_boot, alpha=alpha, seed=seed)
    summary["wall_time_s"] = float(wall_time_s)
    summary["bootstrap"] = {"n_boot": n_boot, "alpha": alpha, "seed": seed}
    if per_question:
        summary["per_question"] = per_question_scores(trajs)
    return summary


def summary_of(entry: dict, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """A system's summary from any of the shapes results come in.

    {"summary": ...} -> it; {"trajectories": [...], "wall_s" or "wall_time_s": t} (what
    the eval harness returns) -> summarize() of them; otherwise `entry` is the summary.
    """
    if "summary" in entry:
        return entry["summary"]
    if "trajectories" in entry:
        wall = entry.get("wall_time_s", entry.get("wall_s", 0.0))
        return summarize(entry["trajectories"], wall, n_boot=n_boot, seed=seed)
    return entry


def paired_diffs(
    base: dict[str, dict[str, float]],
    other: dict[str, dict[str, float]],
    *,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict | None:
    """Paired "other - base" per metric, in percentage points, over the shared questions.

    Inputs are per_question_scores() maps. Returns None when no question is shared.
    """
    shared = sorted(set(base) & set(other))
    if not shared:
        return None
    out: dict = {"n_paired": len(shared)}
    for key in QA_METRICS:
        out[key] = paired_record([base[s][key] for s in shared], [other[s][key] for s in shared],
                                 n_boot=n_boot, alpha=alpha, seed=seed)
    return out
