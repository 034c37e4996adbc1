"""MMOA-RAG probe: what the selector samples at the rollout temperature, against what it picks greedily.

    .venv/bin/python -m experiments.mmoa.mmoa_selector_sampling --adapter runs/mmoa_sg/sft/adapter

Every RL run so far made the greedy selector keep fewer documents (recall down, precision up).
This measures, for one adapter on the first --n `pool-train` questions (training questions only),
at each temperature: documents kept a sample, selector precision / recall / F1 against the gold
passages, and how often the document at each position of the kept list is gold. If the documents
sampled after the first are mostly not gold at the rollout temperature, a gold-F1 (or answer-F1)
reward teaches the policy to stop after one document, whatever greedy decoding would have kept.
BM25 over the full corpus. Writes experiments/mmoa/results/mmoa_selector_sampling.json (--out).

With --selector-samples K > 1 the pipelines branch at the selector as in training (the K
selections of one pipeline share its candidates and form one advantage group), and
`centred_by_kept` says which way each part of the selector's reward pushes how many documents
it keeps: per kept count, the mean over samples of their group-centred selector F1 (the gold part,
weighted by reward.mmoa.selector_gold in training) and group-centred answer F1 (the shared part).
A positive mean at a count is advantage the update moves toward that count.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def summarize(trajs, gold: dict[str, set]) -> dict:
    """Selector statistics of `trajs` (one selector trajectory a pipeline); `gold`: sample id ->
    its gold passage ids."""
    from ragrl.methods.mmoa.reward import selector_f1

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
            "kept_at_position": {str(pos + 1): len(v) for pos, v in sorted(by_pos.items()) if pos < 4},
            **({"centred_by_kept": centred_by_kept(trajs)} if len({t.group for t in trajs}) < n else {})}


def centred_by_kept(trajs) -> dict:
    """{kept count ("1", "2", "3+"): {samples, selector_f1, answer_f1}}: the mean group-centred
    scores (x100) of the selector samples that kept that many documents (groups: `t.group`).

    >>> from types import SimpleNamespace as NS
    >>> m = lambda sel, p, r: {"selected": sel, "selector_precision": p, "selector_recall": r}
    >>> a = NS(group=-1, metrics=m(["x"], 1.0, 0.5), answer="Paris", golds=["Paris"])
    >>> b = NS(group=-1, metrics=m(["x", "y"], 0.5, 0.5), answer="Rome", golds=["Paris"])
    >>> centred_by_kept([a, b])["1"]     # F1 0.667 vs 0.5; answer 1 vs 0: centred +8.3 and +50
    {'samples': 1, 'selector_f1': 8.33, 'answer_f1': 50.0}
    """
    from ragrl.methods.mmoa.reward import selector_f1
    from ragrl.rewards.qa import f1_score

    scores = [(t.group, len(t.metrics["selected"]), selector_f1(t.metrics), f1_score(t.answer or "", t.golds))
              for t in trajs]
    groups: dict[int, list] = {}
    for g, _, sf, af in scores:
        groups.setdefault(g, []).append((sf, af))
    mean = {g: (sum(v[0] for v in vs) / len(vs), sum(v[1] for v in vs) / len(vs)) for g, vs in groups.items()}
    out: dict[str, list] = {}
    for g, k, sf, af in scores:
        out.setdefault("3+" if k >= 3 else str(k), []).append((sf - mean[g][0], af - mean[g][1]))
    return {k: {"samples": len(v), "selector_f1": round(100 * sum(x[0] for x in v) / len(v), 2),
                "answer_f1": round(100 * sum(x[1] for x in v) / len(v), 2)} for k, v in sorted(out.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--n", type=int, default=20, help="pool-train questions (first n with gold passages)")
    ap.add_argument("--samples", type=int, default=4, help="pipelines a question at each temperature > 0")
    ap.add_argument("--temperatures", default="1.0,0.6,0")
    ap.add_argument("--selector-samples", type=int, default=1,
                    help="selections a pipeline, as mmoa.selector_samples (K > 1: centred_by_kept)")
    ap.add_argument("--out", default=str(RESULTS / "mmoa_selector_sampling.json"))
    args = ap.parse_args()

    from ragrl.methods.mmoa.protocol import MMOAProtocol
    from ragrl.models.agent_adapters import load_adapters
    from ragrl.datasets import load_questions
    from ragrl.models.lm_weights import load_policy
    from ragrl.policy.lm_model import torch_dtype
    from ragrl.rollout.config import RolloutConfig
    from ragrl.engines.hf import HFEngine
    from ragrl.methods.mmoa.pipeline import run_mmoa_episodes
    from ragrl.methods.mmoa.settings import MMOASettings
    from ragrl.train.config import DataConfig, TrainConfig
    from ragrl.train.setup import default_retriever

    samples = [q for q in load_questions("pool-train") if q.get("gold_passage_ids")][: args.n]
    # keyed as the pipeline names a trajectory's sample (its id, else its index)
    gold = {str(s.get("id", i)): set(s["gold_passage_ids"]) for i, s in enumerate(samples)}
    retriever = default_retriever(TrainConfig(data=DataConfig(corpus="kit:corpus/wiki_passages.jsonl.gz")))
    # bf16 where this hardware computes it natively, else fp32 (emulated bf16 is 2-3x slower)
    dtype = torch_dtype("auto")
    base, tok = load_policy("smollm2-135m-instruct", dtype=dtype)
    # one shared adapter, or a per-agent folder (agent_adapters=per_agent) switched by agent as in training
    engine = HFEngine(load_adapters(base, args.adapter), tok, max_batch_size=32)
    result = {"settings": {"dtype": str(dtype), "adapter": args.adapter, "n": len(samples), "samples": args.samples,
                           "selector_samples": args.selector_samples,
                           "questions": "pool-train (first n with gold passages)",
                           "index": "bm25 over the full corpus"}, "by_temperature": {}}
    for temp in (float(t) for t in args.temperatures.split(",")):
        cfg = RolloutConfig(n=args.samples if temp > 0 else 1, temperature=temp, passage_words=30, seed=0)
        own = MMOASettings(selector_samples=args.selector_samples if temp > 0 else 1)
        trajs, _ = run_mmoa_episodes(engine, MMOAProtocol(passage_words=30), retriever, samples, cfg, settings=own)
        sel = [t for t in trajs if t.agent == "selector"]
        result["by_temperature"][str(temp)] = row = summarize(sel, gold)
        print(f"T={temp}: {json.dumps(row)}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
