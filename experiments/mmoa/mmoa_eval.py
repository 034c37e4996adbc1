"""MMOA-RAG on a CPU: naive RAG, SFT only, MAPPO and its ablations on held-out multi-hop questions.

    .venv/bin/python -m experiments.mmoa.mmoa_eval --sft runs/mmoa/sft/adapter \\
        --run MAPPO=runs/mmoa/final_adapter --run "generator only=runs/mmoa_gen/final_adapter"

BM25 over the full 51k-passage corpus, greedy decoding, --n questions of HotpotQA dev and MuSiQue
dev (the first --n, or the --n after the first --skip: a fresh sample for a confirmatory test).
Per system: answer EM / F1 (95% CIs), selector precision / recall against the gold passages,
sub-questions per question; paired differences of every trained system against its SFT start
(answer F1 and selector F1). Writes experiments/mmoa/results/mmoa_eval.{json,md}.

Each system's per-question metrics are kept in OUT.cache/ (`ragrl.eval.cache`) keyed by the adapter's
bytes, --n and --skip (an --out holds one question range: another range needs another --out): a
killed evaluation resumes, and a new run is compared against an SFT start evaluated earlier (or
beside its training) without decoding it again.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

from experiments.mmoa.common import DEFAULT_SETS, PAIRED, SETS
from ragrl.eval.cache import Cache, adapter_digest
from ragrl.eval.cells import ci_cell, paired_row, write_results

RESULTS = Path(__file__).resolve().parent / "results"


def cache_settings(rollout, dtype, skip: int) -> dict:
    """What a cached result was decoded with. The training-only rollout settings are left out (and the
    pipeline's own, `mmoa.selector_samples` and `mmoa.generator_samples`, are not rollout settings:
    evaluation sets them to 1), so a setting added for training must not invalidate every cached
    evaluation. skip, and the rollout settings added since (`evaluation_key`: first_action, last_action,
    answer_by), join only when set, so entries written before they existed stay valid."""
    from ragrl.rollout.config import evaluation_key

    return {**evaluation_key(rollout), "dtype": str(dtype), **({"skip": skip} if skip else {})}


def selector_f1(t) -> float:
    from ragrl.methods.mmoa.reward import selector_f1 as f1_of_metrics
    return f1_of_metrics(t.metrics)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", required=True)
    ap.add_argument("--run", action="append", default=[], help="NAME=ADAPTER_DIR (repeatable)")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--skip", type=int, default=0, help="leave out each set's first SKIP questions")
    ap.add_argument("--sets", default=",".join(DEFAULT_SETS), help=f"comma-separated, of: {', '.join(SETS)}")
    ap.add_argument("--out", default=str(RESULTS / "mmoa_eval"))
    args = ap.parse_args()
    sets = [x.strip() for x in args.sets.split(",") if x.strip()]
    unknown = [x for x in sets if x not in SETS]
    if unknown or not sets or args.n < 1 or args.skip < 0:
        ap.error(f"--sets must name some of {', '.join(SETS)} (got {args.sets!r}); --n >= 1; --skip >= 0")
    # One --out, one question range: another range would overwrite this one's cache entries and tables.
    prev = Path(args.out).with_suffix(".json")
    if prev.exists():
        old = json.loads(prev.read_text()).get("settings", {})
        theirs = (old.get("n"), old.get("skip", 0), old.get("sets", list(DEFAULT_SETS)))
        if theirs != (args.n, args.skip, sets):
            raise SystemExit(f"{prev} holds results for --n {theirs[0]} --skip {theirs[1]} --sets {','.join(theirs[2])}; "
                             "evaluate another range or set into another --out")

    from peft import PeftModel

    from ragrl.datasets import load_questions, with_heuristic_gold
    from ragrl.eval.harness import EvalConfig, evaluate
    from ragrl.eval.stats import bootstrap_ci, paired_record
    from ragrl.models.agent_adapters import load_agent_adapters, set_agent_adapters
    from ragrl.models.lm_weights import load_policy
    from ragrl.policy.lm_model import torch_dtype
    from ragrl.rollout.config import RolloutConfig
    from ragrl.engines.hf import HFEngine
    from ragrl.train.config import DataConfig, TrainConfig
    from ragrl.train.setup import default_retriever

    retriever = default_retriever(TrainConfig(data=DataConfig(corpus="kit:corpus/wiki_passages.jsonl.gz")))
    # bf16 where this hardware computes it natively, else fp32 (emulated bf16 is 2-3x slower)
    dtype = torch_dtype("auto")
    base, tok = load_policy("smollm2-135m-instruct", dtype=dtype)
    adapters = {"SFT": args.sft, **dict(r.split("=", 1) for r in args.run)}
    digest = {name: adapter_digest(path) for name, path in adapters.items()}
    # peft adapter names may not hold dots or spaces: a slot per system
    slot = {name: f"a{i}" for i, name in enumerate(adapters)}
    model = PeftModel.from_pretrained(base, adapters["SFT"], adapter_name=slot["SFT"])
    per_agent = {}   # system -> {agent: adapter}, for runs with agent_adapters=per_agent
    for name, path in adapters.items():
        if name != "SFT":
            mapping = load_agent_adapters(model, path, prefix=f"{slot[name]}_")
            if mapping:
                per_agent[name] = mapping
            else:
                model.load_adapter(path, adapter_name=slot[name])
    engine = HFEngine(model, tok, max_batch_size=32)
    rollout = RolloutConfig(temperature=0.0, passage_words=30)
    result: dict = {"settings": {"n": args.n, "skip": args.skip, "sets": sets, "dtype": str(dtype), "adapters": adapters,
                                 "adapter_sha1": digest, "index": "bm25 over the full corpus"}, "sets": {}}
    md = ["# MMOA-RAG (held-out, BM25 over the full 51k-passage corpus, greedy)", ""]
    pooled: dict[str, dict[str, list]] = {}   # system -> metric -> per-question values, both sets in order
    for set_name in sets:
        rows = with_heuristic_gold(load_questions(SETS[set_name], limit=args.skip + args.n))
        if len(rows) < args.skip + args.n:   # a short set would silently make the sample smaller than asked
            raise SystemExit(f"{set_name} has {len(rows)} questions: fewer than --skip + --n ({args.skip + args.n})")
        samples = rows[args.skip:]
        per: dict = {}

        def naive():
            set_agent_adapters(model, None)
            with model.disable_adapter():
                res = evaluate(engine, retriever, samples, EvalConfig(systems=["naive_rag"], n=len(samples), topk=3))
            return res["naive_rag"]["trajectories"]

        def pipeline(name):
            set_agent_adapters(model, per_agent.get(name))
            if name not in per_agent:
                model.set_adapter(slot[name])
            res = evaluate(engine, retriever, samples, EvalConfig(agent="mmoa", systems=["agent"], n=len(samples),
                                                                 rollout=rollout))
            return res["mmoa"]["trajectories"]

        cache = Cache(Path(args.out).with_suffix(".cache") / set_name, args.n, cache_settings(rollout, dtype, args.skip))

        def cached(name: str, key: str, run) -> list:
            metrics = cache.get(name, key)
            if metrics is None:
                metrics = [t.metrics for t in run()]
                cache.put(name, key, metrics)
            return [SimpleNamespace(metrics=m) for m in metrics]   # what the tables below read

        per["naive_rag"] = cached("naive_rag", "base model", naive)
        for name in adapters:
            per[name] = cached(name, digest[name], lambda name=name: pipeline(name))
        rows, pairs = {}, {}
        for name, trajs in per.items():
            row = {k: [100 * v for v in bootstrap_ci([t.metrics[k] for t in trajs])] for k in ("em", "f1")}
            if name != "naive_rag":
                for k in ("selector_precision", "selector_recall"):
                    vals = [t.metrics[k] for t in trajs if k in t.metrics]
                    row[k] = [100 * v for v in bootstrap_ci(vals)] if vals else None
                row["selector_f1"] = [100 * v for v in bootstrap_ci([selector_f1(t) for t in trajs])]
                row["subquestions_per_q"] = sum(len(t.metrics["subquestions"]) for t in trajs) / len(trajs)
                row["selected_per_q"] = sum(len(t.metrics["selected"]) for t in trajs) / len(trajs)
            rows[name] = row
        for name in adapters:
            if name == "SFT":
                continue
            pairs[f"{name} - SFT"] = {
                "f1": paired_record([t.metrics["f1"] for t in per["SFT"]], [t.metrics["f1"] for t in per[name]]),
                "selector_f1": paired_record([selector_f1(t) for t in per["SFT"]], [selector_f1(t) for t in per[name]])}
        for name in adapters:
            p = pooled.setdefault(name, {"f1": [], "selector_f1": []})
            p["f1"] += [t.metrics["f1"] for t in per[name]]
            p["selector_f1"] += [selector_f1(t) for t in per[name]]
        result["sets"][set_name] = {"systems": rows, "paired": pairs}
        span = f"first {args.n}" if not args.skip else f"questions {args.skip + 1}-{args.skip + args.n}"
        md += [f"## {set_name} ({span})", "", "| system | EM | F1 | selector P | selector R | selector F1 | sub-q/q |",
               "|---|---|---|---|---|---|---|"]
        fmt = lambda v: ci_cell(v) if v else "–"   # noqa: E731
        for name, r in rows.items():
            md.append(f"| {name} | {fmt(r['em'])} | {fmt(r['f1'])} | {fmt(r.get('selector_precision'))} | "
                      f"{fmt(r.get('selector_recall'))} | {fmt(r.get('selector_f1'))} | {r.get('subquestions_per_q', 1):.2f} |")
        md += ["", "| paired vs SFT | ΔF1 [95% CI], p | Δselector F1 [95% CI], p |", "|---|---|---|"]
        md += [paired_row(name, d, PAIRED) for name, d in pairs.items()]
        md.append("")
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    if len(sets) > 1:   # one set alone: its table above is the pooled one
        # Both sets pooled: one paired test per trained system (questions paired with themselves).
        result["pooled"] = {"n": len(pooled["SFT"]["f1"]), "paired": {
            f"{name} - SFT": {k: paired_record(pooled["SFT"][k], pooled[name][k]) for k in ("f1", "selector_f1")}
            for name in adapters if name != "SFT"}}
        md += [f"## both sets pooled ({result['pooled']['n']} questions)", "",
               "| paired vs SFT | ΔF1 [95% CI], p | Δselector F1 [95% CI], p |", "|---|---|---|"]
        md += [paired_row(name, d, PAIRED) for name, d in result["pooled"]["paired"].items()]
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
