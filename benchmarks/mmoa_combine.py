"""Pool `mmoa_eval.py` results over disjoint question ranges into one paired test per system.

    .venv/bin/python benchmarks/mmoa_combine.py --part benchmarks/results/mmoa_eval_s5 \\
        --part benchmarks/results/mmoa_confirm_s5 --sft runs/mmoa_s10/sft/adapter \\
        --system "E: selector only=runs/s12/e_selector_only/best_adapter" --out benchmarks/results/mmoa_all_s5

Each --part is an --out of `mmoa_eval.py`: its cache holds every system's per-question metrics for
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
import json
from pathlib import Path

from eval_cache import adapter_digest   # benchmarks/ is on sys.path when run as a script
from mmoa_eval import _paired_row


# Levels per system, each with a 95% CI (the table); paired tests are on answer F1 and selector F1.
METRICS = ("em", "f1", "selector_precision", "selector_recall", "selector_f1")
PAIRED = ("f1", "selector_f1")


def _entries(part: Path) -> dict[str, dict[str, list[dict]]]:
    """set -> adapter digest -> cache entries (one adapter may be cached under several names), for one
    --part; naive RAG, keyed by no adapter, left out."""
    root = part.with_suffix(".cache")
    if not root.is_dir():
        raise SystemExit(f"--part {part}: no cache folder {root} (run mmoa_eval.py --out {part} first)")
    out: dict[str, dict[str, list[dict]]] = {}
    for set_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(set_dir.glob("*.json")):
            d = json.loads(f.read_text())
            if d["name"] != "naive_rag":
                out.setdefault(set_dir.name, {}).setdefault(d["adapter"], []).append(d)
    return out


def collect(parts: list[Path], digests: dict[str, str]):
    """Every system's per-question metrics, pooled over `parts` in order: (set -> system -> [metric
    dict a question], set -> [(first index, end index, part)], system -> adapter digest). `digests`:
    system label -> adapter digest, the SFT start's labelled "SFT". Refuses a system missing from a
    part, overlapping question ranges, parts decoded with other settings and an adapter cached
    twice with different results."""
    names = list(digests)
    per_set: dict[str, dict[str, list[dict]]] = {}
    spans: dict[str, list[tuple[int, int, str]]] = {}
    adapters: dict[str, str] = {}
    settings = None   # every part's decoding settings (its key without the range) must be the first part's
    for part in parts:
        for set_name, systems in _entries(part).items():
            missing = [n for n in names if digests[n] not in systems]
            if missing:
                raise SystemExit(f"--part {part}, {set_name}: no cached result for {', '.join(missing)}")
            key = systems[digests["SFT"]][0]["key"]
            start, n = key["rollout"].get("skip", 0), key["n"]
            mine = {k: v for k, v in key["rollout"].items() if k != "skip"}
            if settings is not None and mine != settings:
                raise SystemExit(f"--part {part}, {set_name}: evaluated with other settings than the first part "
                                 f"({mine} against {settings}): their scores cannot be pooled")
            settings = mine
            for lo, hi, other in spans.get(set_name, []):
                if start < hi and lo < start + n:
                    raise SystemExit(f"{set_name}: questions {start + 1}-{start + n} of {part} overlap "
                                     f"{lo + 1}-{hi} of {other}")
            spans.setdefault(set_name, []).append((start, start + n, str(part)))
            for name in names:
                same = [e for e in systems[digests[name]] if e["key"] == key]
                if not same:
                    raise SystemExit(f"--part {part}, {set_name}: {name} was evaluated with other settings than SFT")
                if any(e["summary"] != same[0]["summary"] for e in same[1:]):
                    # The same adapter decoded twice (e.g. with another thread count: bf16 rounding can
                    # flip a rare greedy tie); pooling whichever came first would be a silent choice.
                    raise SystemExit(f"--part {part}, {set_name}: {name}'s adapter is cached under several names "
                                     f"({', '.join(repr(e['name']) for e in same)}) with different results; "
                                     "remove all but the one to report")
                e = same[0]
                adapters[name] = e["adapter"]
                if len(e["summary"]) != n:
                    raise SystemExit(f"--part {part}, {set_name}: {name} has {len(e['summary'])} results, not {n}")
                per_set.setdefault(set_name, {}).setdefault(name, []).extend(e["summary"])
    return per_set, spans, adapters


def write_results(out: str, result: dict, md: list[str]) -> None:
    """OUT.json and OUT.md, and the table printed."""
    Path(out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    Path(out).with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", action="append", required=True, help="an mmoa_eval.py --out (repeatable)")
    ap.add_argument("--sft", required=True, help="the SFT start's adapter folder (every system is paired with it)")
    ap.add_argument("--system", action="append", required=True, help="LABEL=ADAPTER_DIR (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", type=int, default=0,
                    help="N tests these questions have served: adds each difference's z and its CI at alpha 0.05/N")
    args = ap.parse_args()
    if args.family < 0 or args.family == 1:
        ap.error(f"--family takes the number of tests (>= 2), or 0 for none; got {args.family}")

    from ragrl.eval.stats import bootstrap_ci, paired_bootstrap_diff, paired_z
    from ragrl.rewards.mmoa import selector_f1

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
        pairs = {name: {k: paired_bootstrap_diff(systems["SFT"][k], systems[name][k]) for k in PAIRED}
                 for name in names[1:]}
        result["groups"][group] = {"n": n, "systems": rows, "paired": pairs}
        where = ", ".join(f"{lo}-{hi}" for lo, hi in result["spans"].get(group, [])) or "all sets"
        md += [f"## {group} ({n} questions: {where})", "",
               "| system | EM | answer F1 | selector P | selector R | selector F1 |", "|---|---|---|---|---|---|"]
        md += [f"| {name} | " + " | ".join(f"{r[k][0]:.1f} [{r[k][1]:.1f}, {r[k][2]:.1f}]" for k in METRICS) + " |"
               for name, r in rows.items()]
        md += ["", "| paired vs SFT | ΔF1 [95% CI], p | Δselector F1 [95% CI], p |", "|---|---|---|"]
        md += [_paired_row(name, p) for name, p in pairs.items()]
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
