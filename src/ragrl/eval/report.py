"""Eval reports: report.json + report.md + one trajectories_<system>.jsonl per system.

The JSONL files are the source of truth: every number in report.json can be recomputed
from them with `recompute_summary`, which is what keeps a report honest.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

import ragrl
from ragrl.errors import RagrlError
from ragrl.eval.cells import ci_cell, diff_cell, format_p, markdown_table
from ragrl.eval.stats import (
    METRIC_TITLES,
    QA_METRICS,
    paired_diffs,
    per_question_scores,
    summarize,
    summary_of,
)
from ragrl.rollout.trajectory import Trajectory

TABLE_HEADER = ["system", "EM [95% CI]", "F1 [95% CI]", "cover-EM [95% CI]", "search gain [95% CI]", "answer@shown",
                "searches/q", "turns/q", "tokens/q", "format errors", "wall s"]
META_KEYS = ("model", "agent", "index", "data_file", "n", "seed", "decoding", "ragrl_version", "date")


# ---------------------------------------------------------------- trajectories on disk

def file_stem(system: str) -> str:
    """A file-name-safe version of a system name ("search_r1/grpo" -> "search_r1_grpo")."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", system).strip("._")
    if not stem:
        raise RagrlError(f"system name {system!r} has no usable characters for a file name")
    return stem


def write_trajectories(path: str | Path, trajs: Sequence[Trajectory]) -> Path:
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for t in trajs:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False, allow_nan=False) + "\n")
    return path


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a trajectories JSONL file; a bad line is reported by file and line number."""
    path = Path(path)
    if not path.is_file():
        raise RagrlError(f"trajectory file not found: {path}")
    trajs = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                trajs.append(Trajectory.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise RagrlError(f"{path}:{lineno}: not a trajectory record ({e})") from None
    return trajs


def recompute_summary(jsonl_path: str | Path, *, wall_time_s: float = 0.0, n_boot: int = 2000,
                      alpha: float = 0.05, seed: int = 0) -> dict:
    """The summary of a trajectories JSONL file, exactly as write_report would store it."""
    return summarize(load_trajectories(jsonl_path), wall_time_s, n_boot=n_boot, alpha=alpha, seed=seed)


# ---------------------------------------------------------------- formatting

def _search_gain_cells(s: dict) -> list[str]:
    """The search gain at equal passages and answer@shown (eval/search_gain.py), where the system's
    episodes recorded what their searches showed; n/a elsewhere."""
    if "search_gain" not in s:
        return ["n/a", "n/a"]
    gain = s["search_gain"]
    return [ci_cell(gain, signed=True), f"{s['answer_shown']['mean']:.1f}"]


def _row_cells(label: str, s: dict) -> list[str]:
    return [label, *(ci_cell(s.get(k)) for k in QA_METRICS), *_search_gain_cells(s),
            f"{s['searches_per_q']:.2f}", f"{s['turns_per_q']:.2f}", f"{s['tokens_per_q']:.1f}",
            f"{100 * s['format_error_rate']:.1f}%", f"{s['wall_time_s']:.1f}"]


def format_table(results: dict[str, dict]) -> str:
    """A terminal table (rich) of each system's summary (results as for write_report, or summaries)."""

    table = Table(title="ragrl eval")
    for i, name in enumerate(TABLE_HEADER):
        table.add_column(name, justify="left" if i == 0 else "right")
    for system, entry in results.items():
        table.add_row(*_row_cells(system, summary_of(entry)))
    buf = io.StringIO()
    Console(file=buf, width=160, color_system=None, force_terminal=False).print(table)
    return buf.getvalue()


def _paired_section(paired: dict[str, dict | None], baseline: str) -> str:
    header = ["system", "n paired"]
    for k in QA_METRICS:
        header += [f"Δ{METRIC_TITLES[k]} [95% CI]", "p (one-sided)"]
    rows = []
    for system, d in paired.items():
        if d is None:
            rows.append([system, "0"] + ["n/a"] * (2 * len(QA_METRICS)))
            continue
        cells = [system, str(d["n_paired"]) if "n_paired" in d else "unpaired"]
        for k in QA_METRICS:
            cells += [diff_cell(d[k]), format_p(d[k].get("p_value"))]
        rows.append(cells)
    return (f"## Differences vs `{baseline}` (system − baseline, percentage points)\n\n"
            "Paired bootstrap over the questions both systems answered; p is the one-sided "
            "p-value that the system is not better than the baseline.\n\n"
            + "\n".join(markdown_table(header, rows)) + "\n")


def _json_default(obj):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, (Path, _dt.date)):
        return str(obj)
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to report.json")


def _write_json(path: Path, data: dict) -> None:
    try:
        text = json.dumps(data, indent=2, default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise RagrlError(f"cannot write {path}: {e}") from None
    path.write_text(text + "\n", encoding="utf-8")


def _public(summary: dict) -> dict:
    """The summary without per-question data (that lives in the JSONL files)."""
    return {k: v for k, v in summary.items() if k != "per_question"}


# ---------------------------------------------------------------- reports

def write_report(out_dir: str | Path, results: dict[str, dict], meta: dict, *,
                 baseline: str | None = None, n_boot: int = 2000, seed: int = 0) -> dict:
    """Write report.json, report.md and trajectories_<system>.jsonl into out_dir.

    results: {system: {"summary": summarize(...), "trajectories": [Trajectory, ...]}};
    a missing summary is computed (wall time from entry["wall_s"] or ["wall_time_s"]), so
    evaluate()'s output can be passed as is.
    meta: model, agent, index, data_file, n, seed, decoding, ...; ragrl_version and date
    are filled in when absent. baseline: a system name to compute paired differences against.
    Returns the report dict that was written to report.json.
    """
    if not results:
        raise RagrlError("write_report: no systems to report")
    if baseline is not None and baseline not in results:
        raise RagrlError(f"baseline system {baseline!r} is not among the results: {sorted(results)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    stems = {system: file_stem(system) for system in results}
    if len(set(stems.values())) != len(stems):
        raise RagrlError(f"system names collide as file names: {stems}")

    systems, files, scores = {}, {}, {}
    for system, entry in results.items():
        trajs = list(entry.get("trajectories", []))
        if not trajs:
            raise RagrlError(f"system {system!r} has no trajectories to report")
        systems[system] = _public(summary_of(entry, n_boot=n_boot, seed=seed))
        files[system] = write_trajectories(out / f"trajectories_{stems[system]}.jsonl", trajs).name
        scores[system] = per_question_scores(trajs)

    paired = {}
    if baseline is not None:
        paired = {s: paired_diffs(scores[baseline], scores[s], n_boot=n_boot, seed=seed)
                  for s in results if s != baseline}

    full_meta = {k: meta.get(k) for k in META_KEYS} | dict(meta)
    full_meta["ragrl_version"] = meta.get("ragrl_version") or ragrl.__version__
    full_meta["date"] = meta.get("date") or _dt.datetime.now().isoformat(timespec="seconds")
    if full_meta["n"] is None:
        full_meta["n"] = max(s["n"] for s in systems.values())
    report = {"meta": full_meta, "baseline": baseline, "systems": systems, "paired": paired, "files": files}
    _write_json(out / "report.json", report)

    md = ["# ragrl eval report", ""]
    md += [f"- **{k}**: {v}" for k, v in full_meta.items() if v is not None and k != "decoding"]
    if full_meta.get("decoding") is not None:
        md.append(f"- **decoding**: `{json.dumps(full_meta['decoding'], default=_json_default)}`")
    md += ["", "\n".join(markdown_table(TABLE_HEADER, [_row_cells(s, systems[s]) for s in systems])), "",
           "EM / F1 / cover-EM in percent with 95% percentile-bootstrap CIs; format errors = share "
           "of questions with at least one malformed action.", ""]
    if paired:
        md.append(_paired_section(paired, baseline))
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    return report


def compare_report(out_path: str | Path, rows: Sequence[tuple[str, dict]], baseline_label: str | None,
                   *, pairs: Sequence[tuple[str, str]] = (), n_boot: int = 2000, seed: int = 0,
                   extra: dict | None = None, warning: str | None = None) -> dict:
    """A before/after table (e.g. untrained agent, naive_rag, SFT-only, trained agent).

    rows: (label, summary) in display order. A summary made with summarize(..., per_question=True)
    gets a paired-bootstrap difference vs the baseline; without per-question data the
    difference of means is shown without a CI. `pairs` adds (system, reference) comparisons,
    e.g. ("agent (SFT + RL)", "agent (SFT)") for the gain from RL alone. `extra`: more top-level
    fields of the JSON; `warning`: a line put in bold above the Markdown table.
    Writes <out_path>.md and <out_path>.json.
    """
    labels = [label for label, _ in rows]
    if len(set(labels)) != len(labels):
        raise RagrlError(f"compare_report: duplicate row labels in {labels}")
    if baseline_label is not None and baseline_label not in labels:
        raise RagrlError(f"baseline {baseline_label!r} is not among the rows: {labels}")
    summaries = dict(rows)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)

    paired: dict[str, dict | None] = {}
    if baseline_label is not None:
        base = summaries[baseline_label]
        for label, s in rows:
            if label == baseline_label:
                continue
            if "per_question" in base and "per_question" in s:
                paired[label] = paired_diffs(base["per_question"], s["per_question"], n_boot=n_boot, seed=seed)
            else:  # no per-question values: the plain difference of the two means
                paired[label] = {k: {"diff": s[k]["mean"] - base[k]["mean"]} for k in QA_METRICS}

    pair_diffs: dict[str, dict[str, dict | None]] = {}
    for system, reference in pairs:
        for label in (system, reference):
            if label not in summaries:
                raise RagrlError(f"compare_report: pair ({system!r}, {reference!r}) names an unknown row {label!r}")
        a, b = summaries[reference], summaries[system]
        pair_diffs.setdefault(reference, {})[system] = (
            paired_diffs(a["per_question"], b["per_question"], n_boot=n_boot, seed=seed)
            if "per_question" in a and "per_question" in b
            else {k: {"diff": b[k]["mean"] - a[k]["mean"]} for k in QA_METRICS})
    data = {"baseline": baseline_label, "rows": [{"label": lb, **_public(s)} for lb, s in rows], "paired": paired,
            "pairs": pair_diffs, **(extra or {})}
    _write_json(out.with_suffix(".json"), data)
    md = ["# ragrl before/after", "", *([f"**{warning}**", ""] if warning else []),
          "\n".join(markdown_table(TABLE_HEADER, [_row_cells(lb, s) for lb, s in rows])), ""]
    if paired:
        md.append(_paired_section(paired, baseline_label))
    for reference, diffs in pair_diffs.items():
        md.append(_paired_section(diffs, reference))
    out.with_suffix(".md").write_text("\n".join(md), encoding="utf-8")
    return data
