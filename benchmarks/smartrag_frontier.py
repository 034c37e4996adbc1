"""SmartRAG on a CPU: accuracy against retrieval rate for direct, naive RAG, SFT and SFT + PPO.

    .venv/bin/python benchmarks/smartrag_frontier.py --sft runs/smartrag_c0.2/sft/adapter \\
        --ppo 0.2=runs/smartrag_c0.2/final_adapter --ppo 0.5=runs/smartrag_c0.5/final_adapter

Held-out questions (the first --n of each eval file: HotpotQA dev and PopQA test), BM25 over the
full 51k-passage corpus, greedy decoding, SmolLM2-135M. Writes results/smartrag_frontier.{json,md,png}:
EM / F1 / cover-EM with 95% CIs, retrieval rate (share of questions with at least one search)
and searches per question, paired differences of each PPO run against its SFT start and against
naive RAG, and the frontier plot (F1 against retrieval rate, the two baselines marked).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {"hotpotqa_dev": "kit:eval/hotpotqa_dev.jsonl.gz", "popqa_test": "kit:eval/popqa_test.jsonl.gz"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", required=True, help="the SFT adapter both PPO runs started from")
    ap.add_argument("--ppo", action="append", default=[], help="COST=ADAPTER_DIR (repeatable)")
    ap.add_argument("--n", type=int, default=150, help="questions per eval set")
    ap.add_argument("--thresholds", default="", help="comma list: also run the last PPO policy in SmartRAG's "
                                                      "inference mode at these search thresholds")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "smartrag_frontier"))
    args = ap.parse_args()

    import torch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from peft import PeftModel

    from ragrl.datasets import load_questions
    from ragrl.eval.harness import EvalConfig, evaluate
    from ragrl.eval.stats import paired_diffs, summarize
    from ragrl.models.policy import load_policy
    from ragrl.rollout.episode import RolloutConfig
    from ragrl.rollout.hf_engine import HFEngine
    from ragrl.train.config import TrainConfig
    from ragrl.train.trainer import default_retriever

    retriever = default_retriever(TrainConfig(data=_data("kit:corpus/wiki_passages.jsonl.gz")))
    rollout = RolloutConfig(max_turns=3, max_searches=2, max_turn_tokens=40, max_response_tokens=288,
                            max_obs_tokens=160, passage_words=30, topk=3)
    base, tok = load_policy("smollm2-135m-instruct", dtype=torch.bfloat16)
    adapters = {"SFT": args.sft, **{f"SFT + PPO (cost {c})": d for c, d in (p.split("=", 1) for p in args.ppo)}}
    # peft adapter names may not hold dots or spaces: a slot per system
    slot = {name: f"a{i}" for i, name in enumerate(adapters)}
    model = PeftModel.from_pretrained(base, adapters["SFT"], adapter_name=slot["SFT"])
    for name, path in adapters.items():
        if name != "SFT":
            model.load_adapter(path, adapter_name=slot[name])
    engine = HFEngine(model, tok, max_batch_size=32)
    result: dict = {"settings": {"n": args.n, "adapters": adapters, "index": "bm25 over the full corpus",
                                 "rollout": rollout.__dict__}, "sets": {}}
    for set_name, path in SETS.items():
        samples = load_questions(path, limit=args.n)
        systems: dict = {}
        with model.disable_adapter():
            res = evaluate(engine, retriever, samples, EvalConfig(agent="smartrag", systems=["direct", "naive_rag"],
                                                                 n=len(samples), topk=3, rollout=rollout))
        systems.update({k: v for k, v in res.items()})
        for name in adapters:
            model.set_adapter(slot[name])
            res = evaluate(engine, retriever, samples, EvalConfig(agent="smartrag", systems=["agent"], n=len(samples),
                                                                 topk=3, rollout=rollout))
            systems[name] = res["smartrag"]
        for th in [float(x) for x in args.thresholds.split(",") if x.strip()]:
            from ragrl.agents.registry import get_protocol
            from ragrl.rollout.decision_engine import ThresholdDecisionEngine

            last = list(adapters)[-1]
            model.set_adapter(slot[last])
            proto = get_protocol("smartrag")
            decider = ThresholdDecisionEngine(engine, proto.query[0], proto.answer[0], th)
            res = evaluate(decider, retriever, samples, EvalConfig(agent="smartrag", systems=["agent"], n=len(samples),
                                                                  topk=3, rollout=rollout))
            systems[f"{last}, threshold {th}"] = res["smartrag"]
        summaries = {}
        for name, r in systems.items():
            s = summarize(r["trajectories"], r["wall_s"], per_question=True)
            s["retrieval_rate"] = 100 * sum(t.num_searches > 0 for t in r["trajectories"]) / len(r["trajectories"])
            summaries[name] = s
        pairs = {}
        for name in systems:
            if name.startswith("SFT + PPO"):
                pairs[f"{name} - SFT"] = paired_diffs(summaries["SFT"]["per_question"], summaries[name]["per_question"])
                pairs[f"{name} - naive_rag"] = paired_diffs(summaries["naive_rag"]["per_question"],
                                                            summaries[name]["per_question"])
        for s in summaries.values():
            s.pop("per_question")
        result["sets"][set_name] = {"systems": summaries, "paired": pairs}
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = ["# SmartRAG frontier (held-out, BM25 over the full 51k-passage corpus, greedy)", ""]
    fig = Figure(figsize=(10, 4))
    for i, (set_name, r) in enumerate(result["sets"].items()):
        md += [f"## {set_name} (first {args.n})", "", "| system | EM | F1 | retrieval rate % | searches/q | format errors |",
               "|---|---|---|---|---|---|"]
        ax = fig.add_subplot(1, len(result["sets"]), i + 1)
        for name, s in r["systems"].items():
            md.append(f"| {name} | {s['em']['mean']:.1f} [{s['em']['ci_lo']:.1f}, {s['em']['ci_hi']:.1f}] | "
                      f"{s['f1']['mean']:.1f} [{s['f1']['ci_lo']:.1f}, {s['f1']['ci_hi']:.1f}] | {s['retrieval_rate']:.0f} | "
                      f"{s['searches_per_q']:.2f} | {100 * s['format_error_rate']:.0f}% |")
            marker = "s" if name in ("direct", "naive_rag") else "o"
            ax.errorbar([s["retrieval_rate"]], [s["f1"]["mean"]], yerr=[[s["f1"]["mean"] - s["f1"]["ci_lo"]],
                        [s["f1"]["ci_hi"] - s["f1"]["mean"]]], fmt=marker, capsize=3, label=name)
        md += ["", "| paired | ΔEM [95% CI] | ΔF1 [95% CI], p |", "|---|---|---|"]
        for name, d in r["paired"].items():
            md.append(f"| {name} | {d['em']['diff']:+.1f} [{d['em']['ci_lo']:+.1f}, {d['em']['ci_hi']:+.1f}] | "
                      f"{d['f1']['diff']:+.1f} [{d['f1']['ci_lo']:+.1f}, {d['f1']['ci_hi']:+.1f}], p {d['f1']['p_value']:.3f} |")
        md.append("")
        ax.set_xlabel("retrieval rate (% of questions)")
        ax.set_ylabel("F1 (95% CI)")
        ax.set_title(set_name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(Path(args.out).with_suffix(".png"), dpi=100)
    Path(args.out).with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))


def _data(corpus: str):
    from ragrl.train.config import DataConfig
    return DataConfig(corpus=corpus)


if __name__ == "__main__":
    main()
