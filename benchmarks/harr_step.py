"""HARR on a CPU: the cost of a two-hop GRPO step against a single-hop one (issue #41's ≤ ~3×).

    .venv/bin/python benchmarks/harr_step.py                 # ~5 min; -> benchmarks/results/harr_step.json

Cases, each the `harr_grpo` tiny recipe on the full 51k-passage dense index, 16 questions x 8
draws a step, the question filter off (it is timed on its own):
  one_hop            1 hop of 3 (the earlier recipe's retrieval, no history)
  two_hop            the recipe's: 2 hops of 3, the second embedding HARR's history (question + each
                     earlier passage's title and first `history_words` words), the first hop drawn
                     twice per group and shared by 4 draws (`retriever.history_branches: 2`)
  two_hop_unshared   the same with every draw its own first hop (history_branches 0): 8 distinct
                     histories per question, each re-encoded with gradients in the update
Per case: mean seconds per step (rollout, update) over --steps after --warmup, distinct query
texts per step and their mean length in tokens, and the question filter's seconds over --filter-n
training questions. Ratios against one_hop are the figure that matters (timings move with load).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "one_hop": ["retriever.hops=1", "retriever.history_branches=0"],
    "two_hop": ["retriever.hops=2", "retriever.history_branches=2"],
    "two_hop_unshared": ["retriever.hops=2", "retriever.history_branches=0"],
}


def run_case(name: str, overrides: list[str], args) -> dict:
    import torch

    from ragrl.datasets import load_questions
    from ragrl.methods.harr.setup import filter_questions
    from ragrl.rewards.registry import make_reward
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix=f"harr_step_{name}_"))
    try:
        cfg = load_train_config("harr_grpo", [f"out_dir={out}", f"steps={args.warmup + args.steps}", "save_every=100000",
                                              "eval_every=0", "keep_best=null", "retriever.filter_questions=false",
                                              *overrides], "tiny")
        trainer = Trainer(cfg)
        texts: list[tuple[int, float]] = []
        tokenizer = trainer.setup.policy.module.st.tokenizer
        collate = trainer.setup.policy.collate

        def counting_collate(trajs):
            batch = collate(trajs)
            distinct = list(dict.fromkeys(batch.query_texts))
            texts.append((len(distinct), sum(len(tokenizer(t)["input_ids"]) for t in distinct) / max(len(distinct), 1)))
            return batch

        trainer.setup.policy.collate = counting_collate
        rows = trainer.train(progress=False)[args.warmup:]
        texts = texts[args.warmup:]
        questions = load_questions(cfg.data.train)[:args.filter_n]
        reward = make_reward(trainer.rewards.at(0))
        t0 = time.perf_counter()
        with torch.no_grad():
            filter_questions(questions, trainer.setup.rollout, reward, cfg, out / "filter", write=False)
        filter_s = time.perf_counter() - t0
        mean = lambda key: sum(r[key] for r in rows) / len(rows)   # noqa: E731
        return {"overrides": overrides, "step_s": mean("time/step_s"), "rollout_s": mean("time/rollout_s"),
                "update_s": mean("time/update_s"), "distinct_texts_per_step": sum(n for n, _ in texts) / len(texts),
                "mean_text_tokens": sum(t for _, t in texts) / len(texts),
                "history_words": cfg.retriever.history_words, "filter_s": filter_s, "filter_questions": len(questions)}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--filter-n", type=int, default=256, help="training questions the filter is timed on")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "harr_step.json"))
    args = ap.parse_args()
    result = {"settings": {"recipe": "harr_grpo (tiny)", "questions_per_step": 16, "draws": 8, "steps": args.steps,
                           "warmup": args.warmup, "machine": platform.processor() or platform.machine(),
                           "cpus": os.cpu_count(), "torch_threads": __import__("torch").get_num_threads(),
                           "load_avg_1min": os.getloadavg()[0]}, "cases": {}}
    for name in args.cases.split(","):
        result["cases"][name] = run_case(name, CASES[name], args)
        base = result["cases"].get("one_hop")
        if base:
            for case in result["cases"].values():
                case["step_ratio_vs_one_hop"] = case["step_s"] / base["step_s"]
                case["filter_ratio_vs_one_hop"] = case["filter_s"] / base["filter_s"]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'case':<18} {'step s':>7} {'rollout':>8} {'update':>7} {'× 1-hop':>8} {'texts':>6} {'tokens':>7} {'filter s':>9}")
    for name, c in result["cases"].items():
        print(f"{name:<18} {c['step_s']:7.2f} {c['rollout_s']:8.2f} {c['update_s']:7.2f} "
              f"{c.get('step_ratio_vs_one_hop', float('nan')):8.2f} {c['distinct_texts_per_step']:6.1f} "
              f"{c['mean_text_tokens']:7.1f} {c['filter_s']:9.1f}")


if __name__ == "__main__":
    main()
