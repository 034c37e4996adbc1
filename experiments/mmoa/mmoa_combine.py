"""Pool `mmoa_eval` results over disjoint question ranges into one paired test per system.

    .venv/bin/python -m experiments.mmoa.mmoa_combine --part experiments/mmoa/results/mmoa_eval_s5 \\
        --part experiments/mmoa/results/mmoa_confirm_s5 --sft runs/mmoa_s10/sft/adapter \\
        --system "E: selector only=runs/s12/e_selector_only/best_adapter" --out experiments/mmoa/results/mmoa_all_s5

Each --part is an --out of `mmoa_eval`: its cache holds every system's per-question metrics for
one question range of each set (`--n`, `--skip`). The ranges are read from the cache keys and must
not overlap within a set (a question counted twice would shrink the CI it has no right to shrink).
A system is found in each part by its adapter's bytes (its name may differ between parts), and
every named system, and the SFT start it is paired with, must be in every part. Writes OUT.json
and OUT.md: per set and pooled, each system's EM, answer F1 and selector precision, recall and F1 with
95% CIs, and paired differences of answer F1 and selector F1 against SFT. `--family N` (the number
of tests these questions have served) adds to each paired difference its z and its Bonferroni
family-wise CI (alpha 0.05 / N, 20,000 resamples), so a pre-registered correction for reused
held-out questions is read off the table, not computed aside.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.mmoa.common import PAIRED, collect
from ragrl.eval.cache import adapter_digest
from ragrl.eval.cells import ci_cell, paired_row, write_results

# Levels per system, each with a 95% CI (the table); paired tests are on answer F1 and selector F1 (PAIRED).
METRICS = ("em", "f1", "selector_precision", "selector_recall", "selector_f1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", action="append", required=True, help="an mmoa_eval --out (repeatable)")
    ap.add_argument("--sft", required=True, help="the SFT start's adapter folder (every system is paired with it)")
    ap.add_argument("--system", action="append", required=True, help="LABEL=ADAPTER_DIR (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", type=int, default=0,
                    help="N tests these questions have served: adds each difference's z and its CI at alpha 0.05/N")
    args = ap.parse_args()
    if args.family < 0 or args.family == 1:
        ap.error(f"--family takes the number of tests (>= 2), or 0 for none; got {args.family}")

    from ragrl.eval.stats import bootstrap_ci, paired_bootstrap_diff, paired_record, paired_z
    from ragrl.methods.mmoa.reward import selector_f1

    labels = [x.split("=", 1)[0] for x in args.system]
    if any("=" not in x for x in args.system) or "SFT" in labels or len(set(labels)) < len(labels):
        ap.error("--system takes LABEL=ADAPTER_DIR, each LABEL once and none of them 'SFT' (the --sft start's label)")
    digests = {"SFT": adapter_digest(args.sft), **{k: adapter_digest(v) for k, v in (x.split("=", 1) for x in args.system)}}
    names = list(digests)
    summaries, spans, adapters = collect([Path(p) for p in args.part], digests)
    # selector F1 is derived from each question's precision and recall; the other metrics are cached as they are
    per_set = {s: {n: {k: [selector_f1(m) if k == "selector_f1" else m[k] for m in ms] for k in METRICS}
                   for n, ms in systems.items()} for s, systems in summaries.items()}
    groups = dict(per_set)
    if len(per_set) > 1:   # one set alone: its table is already the pooled one
        groups["pooled"] = {n: {k: sum((per_set[s][n][k] for s in per_set), []) for k in METRICS} for n in names}
    result: dict = {"parts": args.part, "spans": {s: [(lo + 1, hi) for lo, hi, _ in v] for s, v in spans.items()},
                    "adapter_sha1": adapters, "groups": {}}
    md = ["# MMOA-RAG, results pooled over question ranges (held-out, BM25 over the full corpus, greedy)", ""]
    for group, systems in groups.items():
        n = len(systems["SFT"]["f1"])
        rows = {name: {k: [100 * x for x in bootstrap_ci(v)] for k, v in m.items()} for name, m in systems.items()}
        pairs = {name: {k: paired_record(systems["SFT"][k], systems[name][k]) for k in PAIRED}
                 for name in names[1:]}
        result["groups"][group] = {"n": n, "systems": rows, "paired": pairs}
        where = ", ".join(f"{lo}-{hi}" for lo, hi in result["spans"].get(group, [])) or "all sets"
        md += [f"## {group} ({n} questions: {where})", "",
               "| system | EM | answer F1 | selector P | selector R | selector F1 |", "|---|---|---|---|---|---|"]
        md += [f"| {name} | " + " | ".join(ci_cell(r[k]) for k in METRICS) + " |"
               for name, r in rows.items()]
        md += ["", "| paired vs SFT | ΔF1 [95% CI], p | Δselector F1 [95% CI], p |", "|---|---|---|"]
        md += [paired_row(name, p, PAIRED) for name, p in pairs.items()]
        md.append("")
        if args.family:
            alpha = 0.05 / args.family
            fam = {name: {k: [*paired_bootstrap_diff(systems["SFT"][k], systems[name][k], n_boot=20_000,
                                                     alpha=alpha)[1:3], paired_z(systems["SFT"][k], systems[name][k])]
                          for k in PAIRED} for name in names[1:]}
            result["groups"][group]["family"] = {"tests": args.family, "alpha": alpha, "paired": fam}
            md += [f"| family of {args.family} tests (alpha {alpha:.5f}) | ΔF1 CI, z | Δselector F1 CI, z |",
                   "|---|---|---|"]
            cell = lambda c: f"[{100 * c[0]:+.1f}, {100 * c[1]:+.1f}], z {c[2]:+.2f}"   # noqa: E731
            md += [f"| {name} | " + " | ".join(cell(f[k]) for k in PAIRED) + " |" for name, f in fam.items()]
            md.append("")
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
