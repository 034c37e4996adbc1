"""MMOA-RAG: does the selector choose documents, or keep the retriever's first ones?

    .venv/bin/python -m experiments.mmoa.mmoa_selector_vs_retriever --part experiments/mmoa/results/mmoa_eval_s5 \\
        --part experiments/mmoa/results/mmoa_confirm_s5 --sft runs/mmoa_s10/sft/adapter \\
        --system "G=runs/s14/g/best_adapter" --out experiments/mmoa/results/mmoa_selector_vs_retriever

Reads the per-question results that `mmoa_eval` cached (no decoding) and the questions' gold
passages. Per set and pooled, for each system: how often its kept list is exactly the first
documents of its candidate list in retrieval order, how often its first kept document is gold,
documents kept a question, the F1 of the top-1 of its own candidates (what its rewriter's
sub-questions retrieve first), and selector F1; beside them, what needs no selector at all:
keeping the retriever's first one or two candidates (of the SFT pipeline's own candidates), and
the ceiling (every gold passage among the candidates, and nothing else). Paired differences: each
system's selector F1 against the top-1 of its own candidates (does its selector beat just taking
the retriever's first hit?). With --question-baseline, BM25 over the full corpus is searched with
each question itself (no rewriter) and its top-1 and top-2 join the table: what a pipeline with
no rewriter and a prefix-keeping selector would keep. Writes OUT.json and OUT.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.mmoa.common import SETS, collect
from ragrl.eval.cache import adapter_digest
from ragrl.eval.cells import ci_cell, diff_cell, write_results


def selection_f1(selected: list[str], gold: set[str]) -> float:
    """F1 of a kept list against the gold passages (0 when nothing kept or nothing gold).

    >>> selection_f1(["a", "x"], {"a", "b"}), selection_f1(["a"], {"a", "b"}), selection_f1([], {"a"})
    (0.5, 0.6666666666666666, 0.0)
    """
    hits = len(set(selected) & gold)
    if not hits:
        return 0.0
    p, r = hits / len(set(selected)), hits / len(gold)
    return 2 * p * r / (p + r)


def follows_order(selected: list[str], retrieved: list[str]) -> bool:
    """Whether the kept list is the first len(selected) candidates, in retrieval order (an empty
    list counts as not following: nothing was kept).

    >>> follows_order(["a", "b"], ["a", "b", "c"]), follows_order(["b"], ["a", "b"]), follows_order([], ["a"])
    (True, False, False)
    """
    return bool(selected) and selected == retrieved[: len(selected)]


def describe(ms: list[dict], golds: list[set[str]]) -> dict[str, list[float]]:
    """Per-question values (lists, one entry a question) of the statistics in the module docstring."""
    return {"follows_order": [float(follows_order(m["selected"], m["retrieved"])) for m in ms],
            "first_gold": [float(bool(m["selected"]) and m["selected"][0] in g) for m, g in zip(ms, golds)],
            "kept": [float(len(m["selected"])) for m in ms],
            "selector_f1": [selection_f1(m["selected"], g) for m, g in zip(ms, golds)],
            "own_top1_f1": [selection_f1(m["retrieved"][:1], g) for m, g in zip(ms, golds)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", action="append", required=True, help="an mmoa_eval --out (repeatable)")
    ap.add_argument("--sft", required=True, help="the SFT start's adapter folder")
    ap.add_argument("--system", action="append", default=[], help="LABEL=ADAPTER_DIR (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--question-baseline", action="store_true",
                    help="also keep BM25's top-1 / top-2 for the question itself (loads the full-corpus index)")
    args = ap.parse_args()
    if any("=" not in x for x in args.system):
        ap.error("--system takes LABEL=ADAPTER_DIR")

    from ragrl.datasets import load_questions, with_heuristic_gold
    from ragrl.eval.stats import bootstrap_ci, paired_record

    digests = {"SFT": adapter_digest(args.sft), **{k: adapter_digest(v) for k, v in (x.split("=", 1) for x in args.system)}}
    summaries, spans, _ = collect([Path(p) for p in args.part], digests)
    retriever = None
    if args.question_baseline:
        from ragrl.train.config import DataConfig, TrainConfig
        from ragrl.train.setup import default_retriever

        retriever = default_retriever(TrainConfig(data=DataConfig(corpus="kit:corpus/wiki_passages.jsonl.gz")))
    per_set: dict[str, dict[str, dict[str, list[float]]]] = {}
    for set_name, systems in summaries.items():
        rows = with_heuristic_gold(load_questions(SETS[set_name], limit=max(hi for _, hi, _ in spans[set_name])))
        golds = [set(rows[i]["gold_passage_ids"]) for lo, hi, _ in spans[set_name] for i in range(lo, hi)]
        questions = [rows[i]["question"] for lo, hi, _ in spans[set_name] for i in range(lo, hi)]
        sft = systems["SFT"]
        # The cached precision must be what these gold ids give: otherwise rows and results are misaligned.
        for m, g in zip(sft, golds):
            if m["selected"] and abs(len(set(m["selected"]) & g) / len(set(m["selected"])) - m["selector_precision"]) > 1e-9:
                raise SystemExit(f"{set_name}: the cached selections do not match the questions' gold passages")
        stats = {name: describe(ms, golds) for name, ms in systems.items()}
        stats["retriever top-1 (SFT's candidates)"] = {"selector_f1": stats["SFT"]["own_top1_f1"]}
        stats["retriever top-2 (SFT's candidates)"] = {"selector_f1": [selection_f1(m["retrieved"][:2], g) for m, g in zip(sft, golds)]}
        if retriever is not None:
            own = [[h.id for h in hs] for hs in retriever.search(questions, 2)]
            for k in (1, 2):
                stats[f"BM25 on the question itself, top-{k}"] = {"selector_f1": [selection_f1(ids[:k], g)
                                                                                 for ids, g in zip(own, golds)]}
        stats["ceiling: the gold among SFT's candidates"] = {
            "selector_f1": [selection_f1([p for p in m["retrieved"] if p in g], g) for m, g in zip(sft, golds)]}
        per_set[set_name] = stats
    groups = dict(per_set)
    if len(per_set) > 1:
        first = next(iter(per_set.values()))
        groups["pooled"] = {name: {k: sum((per_set[s][name][k] for s in per_set), []) for k in first[name]}
                            for name in first}
    result: dict = {"parts": args.part, "systems": dict(digests), "groups": {}}
    md = ["# MMOA-RAG: the selector against its retriever's order (cached greedy results, BM25 over the full corpus)", ""]
    pct = lambda v: 100 * sum(v) / len(v)   # noqa: E731
    for group, stats in groups.items():
        n = len(stats["SFT"]["selector_f1"])
        rows_out, pairs = {}, {}
        md += [f"## {group} ({n} questions)", "",
               "| system | kept = retrieval prefix | first kept is gold | kept / q | top-1 of its own candidates, F1 | "
               "selector F1 [95% CI] |", "|---|---|---|---|---|---|"]
        for name, s in stats.items():
            ci = [100 * x for x in bootstrap_ci(s["selector_f1"])]
            rows_out[name] = {"selector_f1": ci, **({k: pct(s[k]) if k != "kept" else sum(s[k]) / n
                                                     for k in ("follows_order", "first_gold", "kept", "own_top1_f1")}
                                                    if "kept" in s else {})}
            r = rows_out[name]
            extra = (f"{r['follows_order']:.1f}% | {r['first_gold']:.1f}% | {r['kept']:.2f} | {r['own_top1_f1']:.1f}"
                     if "kept" in r else "– | – | – | –")
            md.append(f"| {name} | {extra} | {ci_cell(ci)} |")
            if "own_top1_f1" in s:
                pairs[name] = paired_record(s["own_top1_f1"], s["selector_f1"])
        md += ["", "| selector F1 minus the top-1 of its own candidates | Δ [95% CI], p |", "|---|---|"]
        md += [f"| {name} | {diff_cell(d, with_p=True)} |" for name, d in pairs.items()]
        result["groups"][group] = {"n": n, "systems": rows_out, "vs_own_top1": pairs}
        base = stats.get("BM25 on the question itself, top-1")
        if base:   # no rewriter at all: does a system's pipeline beat searching with the question?
            vs_q = {name: paired_record(base["selector_f1"], s["selector_f1"]) for name, s in stats.items()
                    if "kept" in s}
            md += ["", "| selector F1 minus BM25's top-1 for the question itself | Δ [95% CI], p |", "|---|---|"]
            md += [f"| {name} | {diff_cell(d, with_p=True)} |" for name, d in vs_q.items()]
            result["groups"][group]["vs_question_top1"] = vs_q
        md.append("")
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
