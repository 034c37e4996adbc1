"""What merging a run's LoRA adapter into the weights saves in evaluation (issue #55): one run's adapter
(its start by default: one shared adapter, which `ragrl compare` and `ragrl eval --run` now merge)
evaluated greedily on the same questions as `ragrl compare` runs it (the run's protocol and rollout
settings at their evaluation values, BM25 over the run's corpus), once with the adapter beside the
base weights (peft computes the LoRA products at every layer and step) and once merged into them.

    .venv/bin/python benchmarks/merged_adapter.py runs/learn_rb2 --data agent-dev --n 64

Writes results/merged_adapter.json: wall seconds of each (alternating order over --repeats), and the
share of questions whose generated tokens are the very same.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from ragrl.compare.runs import read_run
from ragrl.datasets import load_questions
from ragrl.engines.registry import make_engine
from ragrl.eval.batches import in_batches
from ragrl.methods.base import runner_settings
from ragrl.models.agent_adapters import load_adapters
from ragrl.models.lm_weights import load_policy
from ragrl.retrieval.resolve import retriever_for
from ragrl.rollout.config import TRAINING_ONLY
from ragrl.rollout.protocol import get_protocol
from ragrl.rollout.runners import run_agent
from ragrl.train.run_dir import describe_machine

RESULTS = Path(__file__).resolve().parent / "results"


def evaluate(run, adapter: Path, samples: list[dict], retriever, merge: bool, batch_size: int) -> tuple[float, list]:
    cfg = run.cfg
    lm, tok = load_policy(cfg.model.name)
    lm = load_adapters(lm, adapter, merge=merge)
    engine = make_engine("auto", lm, tok, max_batch_size=batch_size)
    protocol = get_protocol(cfg.agent)
    rollout = replace(cfg.rollout, temperature=0.0, n=1, seed=0, answer_by="policy", **TRAINING_ONLY)
    settings = runner_settings(cfg, protocol.runner, evaluation=True)
    t0 = time.perf_counter()
    with torch.inference_mode():
        trajs = in_batches(samples, batch_size,
                           lambda batch: run_agent(engine, protocol, retriever, batch, rollout, settings=settings)[0])
    return time.perf_counter() - t0, [t.token_ids for t in trajs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a training run folder")
    ap.add_argument("--adapter", type=Path, default=None, help="the adapter to evaluate [default: the run's start]")
    ap.add_argument("--data", default="agent-dev")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="each way this many times, alternating")
    ap.add_argument("--out", type=Path, default=RESULTS / "merged_adapter.json")
    args = ap.parse_args()
    run = read_run(args.run)
    adapter = args.adapter or run.start
    if adapter is None:
        raise SystemExit(f"{args.run} started from the base model: name an adapter with --adapter")
    samples = load_questions(args.data)[:args.n]
    retriever = retriever_for(run.cfg.data.index, run.cfg.data.corpus)
    walls: dict[str, list[float]] = {"unmerged": [], "merged": []}
    tokens = {}
    for _ in range(args.repeats):
        for way in ("unmerged", "merged"):
            wall, tokens[way] = evaluate(run, adapter, samples, retriever, way == "merged", args.batch_size)
            walls[way].append(round(wall, 1))
    same = sum(a == b for a, b in zip(tokens["unmerged"], tokens["merged"])) / len(samples)
    best = {way: min(w) for way, w in walls.items()}
    result = {"run": str(args.run), "adapter": str(adapter), "data": args.data, "questions": len(samples),
              "wall_s": walls, "speedup_best": round(best["unmerged"] / best["merged"], 3),
              "identical_tokens": same, "machine": describe_machine(), "load_before": round(os.getloadavg()[0], 2),
              "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
