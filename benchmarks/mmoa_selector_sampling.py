"""MMOA-RAG probe: what the selector samples at the rollout temperature, against what it picks greedily.

    .venv/bin/python benchmarks/mmoa_selector_sampling.py --adapter runs/mmoa_sg/sft/adapter

Every RL run so far made the greedy selector keep fewer documents (recall down, precision up).
This measures, for one adapter on the first --n `pool-train` questions (training questions only),
at each temperature: documents kept a sample, selector precision / recall / F1 against the gold
passages, and how often the document at each position of the kept list is gold. If the documents
sampled after the first are mostly not gold at the rollout temperature, a gold-F1 (or answer-F1)
reward teaches the policy to stop after one document, whatever greedy decoding would have kept.
BM25 over the full corpus. Writes results/mmoa_selector_sampling.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def summarize(trajs, gold: dict[str, set]) -> dict:
    """Selector statistics of `trajs` (one selector trajectory a pipeline); `gold`: sample id ->
    its gold passage ids."""
    from ragrl.rewards.mmoa import selector_f1

    n = len(trajs)
    by_pos: dict[int, list[int]] = {}
    for t in trajs:
        for pos, pid in enumerate(t.metrics["selected"]):
            by_pos.setdefault(pos, []).append(int(pid in gold[t.sample_id]))
    return {"samples": n,
            "kept_per_sample": sum(len(t.metrics["selected"]) for t in trajs) / n,
            "more_than_one": sum(len(t.metrics["selected"]) > 1 for t in trajs) / n,
            "precision": 100 * sum(t.metrics["selector_precision"] for t in trajs) / n,
            "recall": 100 * sum(t.metrics["selector_recall"] for t in trajs) / n,
            "selector_f1": 100 * sum(selector_f1(t.metrics) for t in trajs) / n,
            "gold_rate_by_position": {str(pos + 1): round(100 * sum(v) / len(v), 1)
                                      for pos, v in sorted(by_pos.items()) if pos < 4},
            "kept_at_position": {str(pos + 1): len(v) for pos, v in sorted(by_pos.items()) if pos < 4}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--n", type=int, default=20, help="pool-train questions (first n with gold passages)")
    ap.add_argument("--samples", type=int, default=4, help="pipelines a question at each temperature > 0")
    ap.add_argument("--temperatures", default="1.0,0.6,0")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mmoa_selector_sampling.json"))
    args = ap.parse_args()

    from peft import PeftModel

    from ragrl.agents.mmoa import MMOAProtocol
    from ragrl.datasets import load_questions
    from ragrl.models.policy import load_policy
    from ragrl.train.policy import torch_dtype
    from ragrl.rollout.episode import RolloutConfig
    from ragrl.rollout.hf_engine import HFEngine
    from ragrl.rollout.pipeline import run_mmoa_episodes
    from ragrl.train.config import DataConfig, TrainConfig
    from ragrl.train.trainer import default_retriever

    samples = [q for q in load_questions("pool-train") if q.get("gold_passage_ids")][: args.n]
    # keyed as the pipeline names a trajectory's sample (its id, else its index)
    gold = {str(s.get("id", i)): set(s["gold_passage_ids"]) for i, s in enumerate(samples)}
    retriever = default_retriever(TrainConfig(data=DataConfig(corpus="kit:corpus/wiki_passages.jsonl.gz")))
    # bf16 where this hardware computes it natively, else fp32 (emulated bf16 is 2-3x slower)
    dtype = torch_dtype("auto")
    base, tok = load_policy("smollm2-135m-instruct", dtype=dtype)
    engine = HFEngine(PeftModel.from_pretrained(base, args.adapter), tok, max_batch_size=32)
    result = {"settings": {"dtype": str(dtype), "adapter": args.adapter, "n": len(samples), "samples": args.samples,
                           "questions": "pool-train (first n with gold passages)",
                           "index": "bm25 over the full corpus"}, "by_temperature": {}}
    for temp in (float(t) for t in args.temperatures.split(",")):
        cfg = RolloutConfig(n=args.samples if temp > 0 else 1, temperature=temp, passage_words=30, seed=0)
        trajs, _ = run_mmoa_episodes(engine, MMOAProtocol(passage_words=30), retriever, samples, cfg)
        sel = [t for t in trajs if t.agent == "selector"]
        result["by_temperature"][str(temp)] = row = summarize(sel, gold)
        print(f"T={temp}: {json.dumps(row)}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
