"""Observation building for one retrieval round: per search (`build_observation`, one tokenizer call
per rendering) against batched (`build_observations`, one call per round), same results.

    .venv/bin/python benchmarks/observations.py            # 256 searches, BM25 top 3 of the demo corpus

The shape is the GPU script's episode (scripts/device/gpu_rollout.py): 256 rows, 3 passages of up to
120 words each, 512-token budget (about one in six first renderings is over it and shrinks). Writes
benchmarks/results/observations.json (best of --repeats for each, and whether the outputs are equal).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "observations.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--budget", type=int, default=512, help="max_obs_tokens")
    ap.add_argument("--words", type=int, default=120, help="passage_words")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from ragrl.datasets import load_questions
    from ragrl.models.lm_weights import resolve_policy
    from ragrl.retrieval.resolve import retriever_for
    from ragrl.rollout.config import RolloutConfig
    from ragrl.rollout.multi_turn import build_observation, build_observations
    from ragrl.rollout.protocol import get_protocol

    tok = AutoTokenizer.from_pretrained(str(resolve_policy("smollm2-135m-instruct")))
    questions = load_questions("demo-train")
    queries = [questions[i % len(questions)]["question"] for i in range(args.rows)]
    hits = retriever_for(None, None).search(queries, 3)
    searches = [([q], [h]) for q, h in zip(queries, hits)]
    protocol = get_protocol("search_r1")
    cfg = RolloutConfig(max_obs_tokens=args.budget, passage_words=args.words, topk=3)
    times = {"per_search": [], "batched": []}
    for _ in range(args.repeats):
        t = time.perf_counter()
        one = [build_observation(tok, protocol, qs, hs, cfg) for qs, hs in searches]
        times["per_search"].append(time.perf_counter() - t)
        t = time.perf_counter()
        batched = build_observations(tok, protocol, searches, cfg)
        times["batched"].append(time.perf_counter() - t)
    result = {
        "benchmark": "observations", "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default")},
        "config": vars(args) | {"out": str(args.out)},
        "per_search_s": round(min(times["per_search"]), 4), "batched_s": round(min(times["batched"]), 4),
        "speedup": round(min(times["per_search"]) / min(times["batched"]), 2),
        "equal_outputs": one == batched, "all_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.rows} searches: per search {result['per_search_s']} s, batched {result['batched_s']} s "
          f"({result['speedup']}x), equal: {result['equal_outputs']}; wrote {args.out}")


if __name__ == "__main__":
    main()
