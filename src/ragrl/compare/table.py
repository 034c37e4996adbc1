"""The comparison's table: one row per system, paired differences against naive RAG and against each
run's start, and the per-search payoff, as JSON and as Markdown.

Numbers are recomputed from the systems' annotated trajectories (ragrl.compare.systems), so the
table can be rebuilt from the trajectories_<system>.jsonl files a comparison writes.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ragrl.eval.search_payoff import break_even_cost, payoff_summary
from ragrl.eval.cells import ci_cell, diff_cell, format_p, markdown_table
from ragrl.eval.stats import QA_METRICS, ci_record, paired_diffs, paired_record, per_question_scores, summarize
from ragrl.rollout.trajectory import Trajectory


def _ci(values: Sequence[float], scale: float, n_boot: int, seed: int) -> dict | None:
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    return ci_record(values, scale=scale, n_boot=n_boot, seed=seed)


def system_row(trajs: list[Trajectory], wall_s: float, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """One system's numbers: EM, F1, cover-EM and answer@k of what the reader was shown (percent),
    searches and generated tokens per question, each with a 95% bootstrap CI; seconds per question
    (measured per batch, so without a CI); the searches' payoff."""
    s = summarize(trajs, wall_s, n_boot=n_boot, seed=seed)
    m = [t.metrics for t in trajs]
    return {"n": len(trajs), **{k: s[k] for k in QA_METRICS},
            # answer@shown, and the search gain (that minus the question's own top N holding an answer,
            # N the passages shown), in points: summarize's, over the questions that have them
            "answer_shown": s.get("answer_shown"), "search_gain": s.get("search_gain"),
            "gold_shown": _ci([x.get("gold_shown") for x in m], 100.0, n_boot, seed),
            "searches": _ci([x.get("searches", 0) for x in m], 1.0, n_boot, seed),
            "tokens": _ci([x.get("gen_tokens", 0) for x in m], 1.0, n_boot, seed),
            "seconds_per_q": wall_s / len(trajs), "format_error_rate": s["format_error_rate"],
            "stop_reasons": stop_reasons(trajs),
            "payoff": payoff_summary([x.get("payoff") or [] for x in m])}


def stop_reasons(trajs: list[Trajectory]) -> dict[str, int]:
    """How many episodes ended each way (`EpisodeEnd`), most common first: where format errors come
    from (an episode cut at the token budget is not one that wrote a malformed tag).

    >>> from ragrl.rollout.trajectory import Trajectory
    >>> stop_reasons([Trajectory("a", "q", [], [], [], [], 0, stop_reason=r) for r in ("answer", "max_tokens", "answer")])
    {'answer': 2, 'max_tokens': 1}
    """
    return dict(Counter(str(t.stop_reason) or "unknown" for t in trajs).most_common())


def paired_search_gain(a: list[Trajectory], b: list[Trajectory], *, n_boot: int = 2000, seed: int = 0) -> dict | None:
    """System b's search gain minus system a's, paired over the questions where both have one (yes/no
    questions have none), in percentage points: {diff, ci_lo, ci_hi, p_value, n}; None if none."""
    ga = {t.sample_id: t.metrics.get("search_gain") for t in a}
    gb = {t.sample_id: t.metrics.get("search_gain") for t in b}
    ids = [i for i, v in ga.items() if v is not None and gb.get(i) is not None]
    if not ids:
        return None
    return paired_record([ga[i] for i in ids], [gb[i] for i in ids], n_boot=n_boot, seed=seed)


def verdict(diff: dict | None) -> str:
    """What a paired F1 difference against the run's start says, in words the table prints.

    >>> verdict({"f1": {"diff": -3.0, "ci_lo": -5.0, "ci_hi": -1.0}})
    'worse than its start'
    >>> verdict({"f1": {"diff": 1.0, "ci_lo": -1.0, "ci_hi": 3.0}})
    'no clear change'
    """
    if not diff:
        return "n/a"
    f1 = diff["f1"]
    return "worse than its start" if f1["ci_hi"] < 0 else "better than its start" if f1["ci_lo"] > 0 \
        else "no clear change"


def build_table(results: dict[str, dict], systems: Sequence, *, train_times: dict[str, dict], costs: dict[str, float],
                baseline: str = "naive_rag", no_search: str = "direct", n_boot: int = 2000, seed: int = 0) -> dict:
    """results: {name: {"trajectories", "wall_s", "reused"}}; systems: ragrl.compare.systems.System,
    in row order; train_times: {run label: training_time(run)}; costs: {run label: its cost per search}."""
    rows, scores = {}, {}
    for sys in systems:
        r = results[sys.name]
        rows[sys.name] = {**system_row(r["trajectories"], r["wall_s"], n_boot=n_boot, seed=seed),
                          "role": sys.role, "method": sys.run.method.name if sys.run and sys.run.method else "",
                          "run": str(sys.run.path) if sys.run else None, "reused": r.get("reused"),
                          "index": (sys.run.search.index if sys.run and sys.kind == "retriever" else None),
                          # what the method's record adds to its evaluation (MMOA-RAG: selector F1)
                          "method_metrics": (sys.run.method.eval_metrics(r["trajectories"])
                                             if sys.run and sys.run.method and sys.run.method.eval_metrics else {})}
        scores[sys.name] = per_question_scores(r["trajectories"])
    trajs = {name: results[name]["trajectories"] for name in rows}
    vs_baseline = {}
    for name in rows:
        if name != baseline and baseline in scores:
            d = paired_diffs(scores[baseline], scores[name], n_boot=n_boot, seed=seed)
            vs_baseline[name] = d and {**d, "search_gain": paired_search_gain(trajs[baseline], trajs[name],
                                                                             n_boot=n_boot, seed=seed)}
    vs_start = {}
    for sys in systems:
        start = f"{sys.name} (start)"
        if sys.role == "trained" and start in scores:
            d = paired_diffs(scores[start], scores[sys.name], n_boot=n_boot, seed=seed)
            vs_start[sys.name] = {**(d or {}), "verdict": verdict(d),
                                  "search_gain": paired_search_gain(trajs[start], trajs[sys.name], n_boot=n_boot,
                                                                    seed=seed)}
    f1_without = rows[no_search]["f1"]["mean"] if no_search in rows else None
    for name, row in rows.items():
        row["break_even_cost"] = (break_even_cost(row["f1"]["mean"], f1_without, row["searches"]["mean"])
                                  if f1_without is not None else None)
        label = name.removesuffix(" (start)")
        row["cost_per_search"] = costs.get(label) if row["role"] == "trained" else None
        row["trained"] = train_times.get(label) if row["role"] == "trained" else None
    return {"rows": rows, "vs_baseline": vs_baseline, "baseline": baseline, "vs_start": vs_start,
            "no_search": no_search}


def _trained(t: dict | None) -> str:
    if not t or t.get("seconds") is None:
        return ""
    return f"{t['seconds'] / 60:.1f} min" + (f" ({t['machine']})" if t.get("machine") else "")


def markdown(table: dict, meta: dict) -> str:
    """The comparison as Markdown: settings, the systems, the paired differences, the payoff."""
    rows = table["rows"]
    md = ["# ragrl compare", ""]
    md += [f"- **{k}**: {v}" for k, v in meta.items() if v not in (None, "", [])]
    md += ["", "## Systems", ""]
    md += markdown_table(["system", "method", "EM", "F1", "cover-EM", "answer@shown", "search gain", "searches/q",
                          "tokens/q", "s/q", "trained for"],
                         [[name, r["method"] or "baseline", ci_cell(r["em"]), ci_cell(r["f1"]), ci_cell(r["cover_em"]),
                           ci_cell(r["answer_shown"]), ci_cell(r.get("search_gain")), ci_cell(r["searches"], ".2f"),
                           ci_cell(r["tokens"], ".0f"), f"{r['seconds_per_q']:.2f}", _trained(r["trained"])]
                          for name, r in rows.items()])
    md += ["", ("Percent with 95% bootstrap CIs over the questions, greedy decoding. answer@shown: a gold answer is "
                "in a passage the reader was shown. search gain: answer@shown minus the same for the question's own "
                "top N from the comparison's index, N the distinct passages the reader was shown (0 for a system "
                "that shows none; yes/no questions left out): above 0, the system's searches find what the question "
                "alone does not at the same number of passages. searches/q: queries sent to the retriever (every agent); tokens/q: "
                "tokens generated (every agent); s/q: wall seconds per question on this machine, measured per batch.")]
    reused = [f"{name} ({r['reused']})" for name, r in rows.items() if r.get("reused")]
    if reused:
        md += ["", "Not re-run: " + "; ".join(reused) + "."]
    if table["vs_baseline"]:
        md += ["", f"## Against {table['baseline']} (paired, percentage points)", ""]
        md += markdown_table(["system", "n", "ΔEM", "ΔF1", "Δcover-EM", "Δsearch gain", "p (ΔF1 ≤ 0)"],
                             [[name, str(d["n_paired"]), *(diff_cell(d.get(k)) for k in QA_METRICS),
                               diff_cell(d.get("search_gain")), format_p(d["f1"]["p_value"])]
                              for name, d in table["vs_baseline"].items() if d])
    if table["vs_start"]:
        md += ["", "## Against each run's start (paired, percentage points)", ""]
        md += markdown_table(["run", "n", "ΔEM", "ΔF1", "Δcover-EM", "Δsearch gain", "verdict"],
                             [[name, str(d.get("n_paired", 0)), *(diff_cell(d.get(k)) for k in QA_METRICS),
                               diff_cell(d.get("search_gain")), d["verdict"]]
                              for name, d in table["vs_start"].items()])
    ends = sorted({reason for r in rows.values() for reason in r["stop_reasons"]})
    md += ["", "## How episodes ended", ""]
    md += markdown_table(["system", "format errors", *ends],
                         [[name, f"{100 * r['format_error_rate']:.1f}%", *(str(r["stop_reasons"].get(e, 0)) for e in ends)]
                          for name, r in rows.items()])
    md += ["", ("Episodes per stop reason: answer (answered), max_tokens (cut at rollout.max_response_tokens), "
                "max_turns (turns used up without an answer), no_answer (the turn closed without an action), "
                "format_error (a malformed action ended it). Format errors: episodes with at least one turn that parsed "
                "as neither a search nor an answer (a turn cut at a token budget included).")]
    own = {name: r["method_metrics"] for name, r in rows.items() if r.get("method_metrics")}
    if own:
        md += ["", "## Each method's own metrics", ""]
        md += [f"- **{name}**: " + ", ".join(f"{k} {v:.1f}" for k, v in m.items()) for name, m in own.items()]
    md += ["", "## Searches that paid off", ""]
    md += markdown_table(["system", "searches", "paid off %", "first gold %", "first answer %", "break-even cost",
                          "its cost"],
                         [[name, str(p["searches"]),
                           *(f"{p[k]:.1f}" if p[k] is not None else "n/a" for k in ("paid", "gold", "answer")),
                           f"{r['break_even_cost']:+.3f}" if r["break_even_cost"] is not None else "n/a",
                           f"{r['cost_per_search']:.3f}" if r["cost_per_search"] is not None else ""]
                          for name, r in rows.items() for p in [r["payoff"]] if r["searches"]["mean"] > 0])
    md += ["", ("A search paid off when it was the first to bring a gold passage (`first gold`) or a passage holding "
                "the answer (`first answer`; not for yes/no questions) into view. Break-even cost: the cost per search, "
                f"in F1 units (0-1), at which the system's F1 gain over `{table['no_search']}` is used up; a run whose "
                "reward charges more per search than this is paid to search less (`its cost`, where the method charges one).")]
    return "\n".join(md) + "\n"
