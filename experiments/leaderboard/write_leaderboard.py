"""Write docs/results/leaderboard.md and leaderboard.json from one comparison (`ragrl compare --out DIR`)
or from several parts of one (issue #53's remake: one comparison per method, each its run, its start,
direct and naive RAG on the same questions, made in its own session and committed as
experiments/leaderboard/results/<recipe>_compare.json): the settings (preamble.md), one compact row per
system, the parts' set-by-set figures where a `<stem>_per_set.json` lies beside a part, the findings,
then every column (ragrl.compare.table's own formatter) and the plot. The JSON holds the compact
table's figures.

    .venv/bin/python -m experiments.leaderboard.write_leaderboard runs/leaderboard/compare
    .venv/bin/python -m experiments.leaderboard.write_leaderboard experiments/leaderboard/results/*_compare.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragrl.compare.table import markdown
from ragrl.eval.cells import ci_cell, diff_cell
from ragrl.eval.plots import f1_vs_searches

from experiments.search_agents import per_set

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


# The settings every part must share to be one table (the corpus by its checksum, not its path).
SHARED = ("questions", "index", "reader", "naive_rag top k", "decoding", "weights", "seed")


def _corpus_checksum(meta: dict) -> str:
    return meta["corpus"].rsplit("(", 1)[-1]


def merge_parts(parts: list[dict]) -> dict:
    """One comparison's record from parts made apart: their settings must agree (questions, corpus,
    index, reader, decoding, weights, seed) and the rows they share (the baselines) must hold the same
    figures, else ValueError naming the difference. A trained run may sit in one part only. Each
    run's paired differences stay those of its own part (against its own start, on the same questions)."""
    first = parts[0]
    merged = {"meta": {**first["meta"]}, "rows": {}, "vs_start": {}, "vs_baseline": {},
              "baseline": first["baseline"], "no_search": first.get("no_search", "direct")}
    for part in parts:
        for key in SHARED:
            if part["meta"].get(key) != first["meta"].get(key):
                raise ValueError(f"the parts differ in {key}: {first['meta'].get(key)!r} against "
                                 f"{part['meta'].get(key)!r}")
        if _corpus_checksum(part["meta"]) != _corpus_checksum(first["meta"]):
            raise ValueError(f"the parts searched different corpora: {first['meta']['corpus']} against "
                             f"{part['meta']['corpus']}")
        for name, row in part["rows"].items():
            if name not in merged["rows"]:
                merged["rows"][name] = row
            elif row["role"] == "baseline" and all(row[m] == merged["rows"][name][m] for m in ("f1", "answer_shown")):
                continue
            else:
                raise ValueError(f"{name} is in two parts with different figures (or is a run twice): one "
                                 "baseline cache for every part, and each run in one part")
        merged["vs_start"].update(part["vs_start"])
        merged["vs_baseline"].update(part["vs_baseline"])
    merged["meta"]["date"] = ", ".join(sorted({p["meta"]["date"][:10] for p in parts}))
    merged["meta"]["corpus"] = first["meta"]["corpus"].split("/")[-1]   # each part's own path differs
    return merged


def read_parts(paths: list[Path]) -> tuple[dict, list[dict]]:
    """The merged comparison from folders or compare.json files, and the per-set records beside them."""
    files = [p / "compare.json" if p.is_dir() else p for p in paths]
    parts = [json.loads(f.read_text()) for f in files]
    beside = [f.with_name(f.name.removesuffix("_compare.json") + "_per_set.json")
              for f in files if f.name.endswith("_compare.json")]
    per_sets = [json.loads(f.read_text()) for f in beside if f.is_file()]
    return (parts[0] if len(parts) == 1 else merge_parts(parts)), per_sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", type=Path, nargs="+", help="comparison folders or their compare.json files")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "leaderboard.md")
    ap.add_argument("--preamble", type=Path, default=HERE / "preamble.md")
    ap.add_argument("--findings", type=Path, default=HERE / "findings.md")
    args = ap.parse_args()
    data, per_sets = read_parts(args.parts)
    full = markdown(data, data["meta"]).split("\n## Systems\n", 1)[1]
    image = f1_vs_searches(data["rows"], args.out.with_name(args.out.stem + "_f1_vs_searches.png"))
    text = [args.preamble.read_text().rstrip(), "", "## The table", "",
            f"Ranked by F1 (percent, 95% bootstrap CIs over the {data['meta']['questions'].split(':')[0]} questions). "
            "Search gain: 1 where the passages a system showed hold an answer, minus 1 where the question's own "
            "BM25 top N does (N: the passages it showed). Δ: paired bootstrap over the same questions, "
            "percentage points.", "", *compact_table(data), "",
            f"![F1 against searches per question]({image.name})", ""]
    if per_sets:
        text += ["### Set by set", "", "Each run against its start on each `eval/` set and pooled (yes/no questions "
                 "have no search gain and are left out of it).", "",
                 *per_set.table(per_sets, metrics=("search_gain", "f1")), ""]
    text += [args.findings.read_text().rstrip() if args.findings.is_file() else "", "", "## Every column", "",
             "### Systems", full.rstrip(), "", "Back to the [README](../../README.md#results)."]
    args.out.write_text("\n".join(text) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(leaderboard_record(data), indent=1) + "\n")
    print("\n".join(compact_table(data)))


if __name__ == "__main__":
    main()
