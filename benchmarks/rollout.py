"""Rollout throughput: multi-turn Search-R1 episodes vs raw batched `model.generate`.

    .venv/bin/python benchmarks/rollout.py                          # 32 questions x 4 samples (~10 min)
    .venv/bin/python benchmarks/rollout.py --questions 4 --n 2      # quick check
    .venv/bin/python benchmarks/rollout.py --adapter runs/sft/final_adapter   # + the SFT policy

What is compared, in one process on the same model and the same initial prompts:
  rollout   `run_episodes` with the search_r1 protocol, a real BM25 index over the demo corpus,
            temperature 1: generate a turn, parse, retrieve, append the observation, repeat.
  generate  transformers' `model.generate` on the same prompts (n copies each), same batch size,
            temperature 1 (no top-k), with min = max new tokens chosen so that it generates as
            many tokens in total as the rollout did.
Both report generated tokens per second of wall time; their ratio says what the multi-turn
machinery (re-prefilling the growing context each turn, stop strings, per-row sampling,
retrieval, observation tokenisation) costs over plain decoding. Target: ratio >= 0.7.

Writes benchmarks/results/rollout.json and prints a table. Timings move with machine load
(this box is shared), so the JSON records the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "rollout.json"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class TimedRetriever:
    """A real retriever plus the wall time spent inside its `search` calls."""

    def __init__(self, retriever):
        self.retriever, self.seconds, self.calls, self.queries = retriever, 0.0, 0, 0

    def search(self, queries, k):
        t0 = time.perf_counter()
        try:
            return self.retriever.search(queries, k)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            self.queries += len(queries)


def run_rollout(engine, protocol, retriever, questions, cfg) -> dict:
    """One `run_episodes` call over all questions; throughput and what the episodes did."""
    from ragrl.rollout.multi_turn import run_episodes

    timed = TimedRetriever(retriever)
    t0 = time.perf_counter()
    trajs, stats = run_episodes(engine, protocol, timed, questions, cfg)
    wall = time.perf_counter() - t0
    rows = len(trajs)
    gen_tokens = stats["gen_tokens"]
    return {
        "trajectories": rows,
        "gen_tokens": gen_tokens,
        "wall_s": wall,
        "tokens_per_s": gen_tokens / wall,
        "generate_s": stats["generate_s"],
        "retriever_s": timed.seconds,                        # inside index.search only
        "retrieval_and_observation_s": stats["retrieval_s"],  # + formatting/tokenising observations
        "retrieval_share": timed.seconds / wall,
        "retrieval_and_observation_share": stats["retrieval_s"] / wall,
        "other_share": 1 - (stats["generate_s"] + stats["retrieval_s"]) / wall,  # parse, bookkeeping
        "retriever_calls": timed.calls,
        "queries": timed.queries,
        "searches_per_traj": sum(t.num_searches for t in trajs) / rows,
        "turns_per_traj": sum(t.num_turns for t in trajs) / rows,
        "response_tokens_per_traj": sum(len(t.response_ids) for t in trajs) / rows,
        "format_error_rate": sum(t.format_errors > 0 for t in trajs) / rows,
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
        "example_turns": [turn.action_text[:160] for turn in trajs[0].turns],
    }


def run_generate(model, tok, prompts: list[list[int]], new_tokens: int, batch_size: int, seed: int) -> dict:
    """Raw batched `model.generate`, exactly `new_tokens` sampled tokens per row."""
    import torch

    torch.manual_seed(seed)
    pad = tok.pad_token_id
    generated = 0
    t0 = time.perf_counter()
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])          # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=pad)
        generated += (out.shape[1] - width) * len(batch)
    wall = time.perf_counter() - t0
    return {"rows": len(prompts), "new_tokens_per_row": new_tokens, "gen_tokens": generated,
            "wall_s": wall, "tokens_per_s": generated / wall}


def measure(label, model, tok, protocol, retriever, questions, cfg, batch_size, engine_kind="hf") -> dict:
    """Rollout, then raw generate matched to the rollout's generated-token count. engine_kind: a
    model.engine value; `static:loop` is the static engine turn by turn (rollout.turns_in_slot false),
    `static:full_width` attending over its whole reserved KV length every step."""
    from ragrl.engines.base import SamplingParams
    from ragrl.engines.registry import make_engine
    from ragrl.rollout.multi_turn import prompt_ids

    engine_kind, _, mode = engine_kind.partition(":")
    if mode not in ("", "loop", "full_width") or (mode and engine_kind != "static"):
        raise SystemExit(f"--engines: {engine_kind}:{mode}: the static engine's modes are :loop and :full_width")
    cfg = replace(cfg, turns_in_slot=mode != "loop")
    extra = {"width_buckets": False} if mode == "full_width" else {}
    engine = make_engine(engine_kind, model, tok, max_batch_size=batch_size, **extra)
    warm_up = [prompt_ids(tok, protocol, questions[0]["question"])]  # first-call allocations, lazy imports
    engine.generate(warm_up, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    if hasattr(engine, "decode_steps"):
        engine.decode_steps = engine.busy_row_steps = engine.slot_steps = 0   # the rollout's alone
    log(f"[{label}] rollout: {len(questions)} questions x {cfg.n} samples")
    rollout = run_rollout(engine, protocol, retriever, questions, cfg)
    rollout["peak_rss_mib"] = peak_rss_mib()
    if hasattr(engine, "decode_steps"):   # the static engine: steps are a GPU's cost, occupancy how full they ran
        rollout["decode_steps"] = engine.decode_steps
        rollout["slot_occupancy"] = engine.busy_row_steps / max(engine.slot_steps, 1)
        rollout["turns_in_slot"] = cfg.turns_in_slot
    log(f"[{label}] rollout: {rollout['gen_tokens']} tokens in {rollout['wall_s']:.1f} s")
    prompts = [prompt_ids(tok, protocol, q["question"]) for q in questions for _ in range(cfg.n)]
    new_tokens = max(1, round(rollout["gen_tokens"] / len(prompts)))
    log(f"[{label}] generate: {len(prompts)} rows x {new_tokens} new tokens")
    generate = run_generate(model, tok, prompts, new_tokens, batch_size, cfg.seed)
    generate["peak_rss_mib"] = peak_rss_mib()
    log(f"[{label}] generate: {generate['gen_tokens']} tokens in {generate['wall_s']:.1f} s")
    return {"rollout": rollout, "generate": generate,
            "ratio": rollout["tokens_per_s"] / generate["tokens_per_s"]}


def machine_info(threads: int) -> dict:
    import torch
    import transformers

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "torch_threads": threads,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "loadavg_start": os.getloadavg()}


def print_table(result: dict) -> None:
    header = f"{'variant':<16} {'rollout tok/s':>13} {'generate tok/s':>14} {'ratio':>6} " \
             f"{'tokens':>7} {'retrieval %':>11} {'+obs %':>7} {'searches/traj':>13} {'turns/traj':>10}"
    print(header)
    print("-" * len(header))
    for label, v in result["variants"].items():
        r, g = v["rollout"], v["generate"]
        print(f"{label:<16} {r['tokens_per_s']:>13.1f} {g['tokens_per_s']:>14.1f} {v['ratio']:>6.2f} "
              f"{r['gen_tokens']:>7} {100 * r['retrieval_share']:>11.2f} "
              f"{100 * r['retrieval_and_observation_share']:>7.2f} {r['searches_per_traj']:>13.2f} "
              f"{r['turns_per_traj']:>10.2f}")
        if "decode_steps" in r:
            print(f"  {label}: {r['decode_steps']} decode steps, slots {100 * r['slot_occupancy']:.0f}% busy")
    print(f"peak RSS {result['peak_rss_mib']:.0f} MiB, torch threads {result['machine']['torch_threads']}, "
          f"load {result['machine']['loadavg_start']} -> {result['machine']['loadavg_end']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=32, help="questions from the bundled eval set")
    ap.add_argument("--n", type=int, default=4, help="samples per question")
    ap.add_argument("--batch-size", type=int, default=64, help="rows per forward pass, both sides")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-turn-tokens", type=int, default=48)
    ap.add_argument("--max-response-tokens", type=int, default=320)
    ap.add_argument("--max-obs-tokens", type=int, default=192)
    ap.add_argument("--topk", type=int, default=3)
    # 1 by default: on a shared, oversubscribed box, 2 OpenMP threads ran 7x slower than 1 (measured).
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adapter", type=Path, default=None, help="also measure this LoRA (SFT) adapter")
    ap.add_argument("--engines", default="hf,static,static:loop,static:full_width",
                    help="model.engine values to measure, side by side (static:loop: static, turn by turn; "
                         "static:full_width: static attending over its whole reserved length)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from ragrl.rollout.protocol import get_protocol
    from ragrl.datasets import load_questions
    from ragrl.models.lm_weights import load_policy
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.index import build_index
    from ragrl.retrieval.resolve import make_retriever
    from ragrl.rollout.config import RolloutConfig

    torch.set_num_threads(args.threads)
    info = machine_info(torch.get_num_threads())
    t0 = time.perf_counter()
    model, tok = load_policy("smollm2-135m-instruct", dtype=getattr(torch, args.dtype))
    load_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        retriever = make_retriever(build_index(DEMO_CORPUS, Path(tmp) / "bm25", kind="bm25", progress=False))
        index_s = time.perf_counter() - t0
    questions = load_questions("demo-eval", limit=args.questions)
    protocol = get_protocol("search_r1")
    cfg = RolloutConfig(max_turns=args.max_turns, max_turn_tokens=args.max_turn_tokens,
                        max_response_tokens=args.max_response_tokens, max_obs_tokens=args.max_obs_tokens,
                        topk=args.topk, temperature=1.0, n=args.n, seed=args.seed)

    variants = {f"smollm2/{kind}": measure(f"smollm2/{kind}", model, tok, protocol, retriever, questions, cfg,
                                           args.batch_size, kind) for kind in args.engines.split(",")}
    if args.adapter is not None:
        from peft import PeftModel

        sft = PeftModel.from_pretrained(model, str(args.adapter)).eval()
        variants["sft_adapter"] = measure("sft_adapter", sft, tok, protocol, retriever, questions, cfg,
                                          args.batch_size)
    info["loadavg_end"] = os.getloadavg()
    result = {
        "benchmark": "rollout", "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": info,
        "config": {"questions": len(questions), "n": args.n, "batch_size": args.batch_size, "protocol": "search_r1",
                   "engines": args.engines, "dtype": args.dtype,
                   "retriever": "bm25 (demo corpus)", "adapter": str(args.adapter) if args.adapter else None,
                   "rollout": asdict(cfg)},
        "setup_s": {"load_model": load_s, "build_index": index_s},
        "variants": variants, "peak_rss_mib": peak_rss_mib(), "target_ratio": 0.7,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
