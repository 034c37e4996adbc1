"""How far evaluation runs from this CPU's limit (issue #55): the machine's matmul rate against the
FLOP/s each system of a finished comparison achieved, both in the precision the comparison's weights
had (compare.json's `weights`: float32, or bfloat16 from `ragrl compare --dtype bfloat16`).

    .venv/bin/python benchmarks/eval_flops.py runs/learn_c_compare

1. The matmul rate: the best of `--repeats` timed `torch.matmul`s of square matrices of each `--sizes`
   side, in the comparison's precision, on this process's torch threads (the count `ragrl compare`
   decodes with), as GFLOP/s (2 n^3 a product). The largest is the ceiling a dense decoder's linear
   layers can reach. A CPU with AMX runs bfloat16 products several times faster than float32 ones,
   so each precision is measured against its own ceiling.
2. Each system's achieved rate, from the comparison's own files (nothing is decoded again): the tokens
   its reader processed (every token of every answering trajectory: prompt, observations and generated
   tokens each pass through the model once, as the engines keep each row's KV cache across turns)
   times 2 x the parameters of the transformer body (the embedding table is a lookup), plus 2 x the
   vocabulary projection for each generated token, over its wall seconds (`seconds_per_q` x questions
   in compare.json). Attention's own score and mixing FLOPs (a few percent at these lengths) are left
   out, so the figure is a lower bound of the work done.

Writes results/eval_flops.json and prints the table. A system reused from an earlier comparison carries
the wall time of the machine and load it ran under then (compare.json's `reused`).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from ragrl.errors import ConfigError
from ragrl.eval.cells import markdown_table
from ragrl.eval.report import file_stem
from ragrl.models.lm_weights import load_policy
from ragrl.policy.lm_model import eval_dtype
from ragrl.train.run_dir import describe_machine

RESULTS = Path(__file__).resolve().parent / "results"


def matmul_gflops(n: int, repeats: int, dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of `repeats` n x n products in `dtype` (after one warm-up)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def system_tokens(path: Path) -> tuple[int, int, int]:
    """(questions, tokens processed, tokens generated) of a comparison's trajectories_<system>.jsonl."""
    n = processed = generated = 0
    with path.open() as f:
        for line in f:
            t = json.loads(line)
            n += 1
            processed += len(t["token_ids"])
            generated += sum(t["action_mask"])
    return n, processed, generated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("compare_dir", type=Path, help="a `ragrl compare --out` folder (compare.json, trajectories_*.jsonl)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the reader's model (its parameter count)")
    ap.add_argument("--sizes", default="512,1024,2048,4096", help="matmul sides to time, comma-separated")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=RESULTS / "eval_flops.json")
    args = ap.parse_args()
    table = json.loads((args.compare_dir / "compare.json").read_text())
    files = {name: args.compare_dir / f"trajectories_{file_stem(name)}.jsonl" for name in table["rows"]}
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:   # before any timing: a folder that is not a finished comparison
        raise SystemExit(f"{args.compare_dir}: no trajectories_<system>.jsonl for {', '.join(missing)}")
    weights = table.get("weights", "float32")   # comparisons before --dtype existed ran in float32
    try:
        dtype = eval_dtype(weights, "compare.json's weights")
    except ConfigError as e:
        raise SystemExit(f"{args.compare_dir}: {e}") from None
    sizes = [int(s) for s in args.sizes.split(",")]
    rates = {n: matmul_gflops(n, args.repeats, dtype) for n in sizes}
    peak = max(rates.values())
    model, _ = load_policy(args.model)
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    body = params - embed.numel() - (0 if head is embed else head.numel())   # a tied head is the embedding
    systems = {}
    for name, row in table["rows"].items():
        n, processed, generated = system_tokens(files[name])
        wall = row["seconds_per_q"] * n
        achieved = (2 * body * processed + 2 * head.numel() * generated) / wall / 1e9
        systems[name] = {"questions": n, "tokens_processed": processed, "tokens_generated": generated,
                         "wall_s": wall, "achieved_gflops": achieved, "share_of_matmul_rate": achieved / peak,
                         "reused": row.get("reused")}
    result = {"compare_dir": str(args.compare_dir), "model": args.model, "parameters": params,
              "body_parameters": body, "vocabulary_projection_parameters": head.numel(),
              "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "machine": describe_machine(), "weights": weights, "matmul_gflops": {str(n): r for n, r in rates.items()},
              "matmul_peak_gflops": peak, "systems": systems,
              "note": "achieved = (2 x body parameters x tokens processed + 2 x vocabulary projection x tokens "
                      "generated) / wall; attention's score and mixing FLOPs are left out (a lower bound)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{weights} matmul on {torch.get_num_threads()} threads: "
          + ", ".join(f"{n}: {r:.1f} GFLOP/s" for n, r in rates.items()))
    print("\n".join(markdown_table(
        ["system", "tokens processed / q", "generated / q", "wall s", "GFLOP/s", "share of matmul rate"],
        [[name, f"{s['tokens_processed'] / s['questions']:.0f}", f"{s['tokens_generated'] / s['questions']:.0f}",
          f"{s['wall_s']:.0f}", f"{s['achieved_gflops']:.2f}", f"{100 * s['share_of_matmul_rate']:.1f}%"]
         for name, s in systems.items()])))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
