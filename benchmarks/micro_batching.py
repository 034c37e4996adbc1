"""Update time with micro batches grouped by length vs shuffled, on an MMOA-RAG-shaped batch.

    .venv/bin/python benchmarks/micro_batching.py            # SmolLM2-135M, LoRA on the last 8 layers (~5 min)
    .venv/bin/python benchmarks/micro_batching.py --model /tmp/tiny --repeats 1

A MAPPO batch mixes three agents' samples of very different lengths (SmolLM2 tokens, 30-word
passages): the selector's prompt holds 10 candidate documents (~560 tokens), the generator's the
kept ones (~150), the rewriter's only the question (~70). A shuffled micro batch of 4 pads every
row to its longest, so most of the compute is padding; `ragrl.train.update.by_length` orders each
minibatch's rows by length before it is cut into micro batches (same rows, same loss). This times
`prepare` + `ppo_update` (GAE with a value head, 2 epochs, one minibatch of 24, micro batches of
4) both ways, alternating, in one process, and counts the token positions each way computes.
Writes benchmarks/results/micro_batching.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENT_LENGTHS = {"selector": 560, "generator": 150, "rewriter": 70}


def mmoa_batch(questions: int, vocab: int, seed: int = 0):
    """Rows in pipeline order (rewriter, selector, generator per question), prompts masked,
    the last 8 tokens (±) each row's action; lengths jittered ±10%."""
    import torch

    from ragrl.policy.batch import TrajBatch
    g = torch.Generator().manual_seed(seed)
    lengths = []
    for _ in range(questions):
        for agent in ("rewriter", "selector", "generator"):
            base = AGENT_LENGTHS[agent]
            lengths.append(int(base * (0.9 + 0.2 * torch.rand(1, generator=g).item())))
    B, L = len(lengths), max(lengths)
    ids = torch.randint(0, vocab, (B, L), generator=g)
    attn = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]).long()
    act = torch.zeros(B, L)
    for i, n in enumerate(lengths):
        act[i, n - 8: n] = 1.0
    old = torch.full((B, L), -2.0) * act
    scores = torch.rand(B, generator=g)
    return TrajBatch(ids, attn, act, old, scores, torch.arange(B)), lengths


def padded_positions(lengths: list[int], order: list[int], micro: int) -> int:
    return sum(len(order[s: s + micro]) * max(lengths[i] for i in order[s: s + micro])
               for s in range(0, len(order), micro))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "micro_batching.json"))
    args = ap.parse_args()

    import torch

    import ragrl.train.update as update
    from ragrl.policy.lm import LMPolicy
    from ragrl.train.config import AlgoConfig, ModelConfig
    from ragrl.policy.lm_model import build_policy
    from ragrl.train.rng import seed_everything

    seed_everything(0)
    model, tok, value_head = build_policy(ModelConfig(name=args.model, lora=True, lora_layers=8, dtype="auto"),
                                          with_value_head=True)
    policy = LMPolicy(model, tok, value_head)
    batch, lengths = mmoa_batch(args.questions, len(tok))
    cfg = AlgoConfig(estimator="gae", lam=1.0, ppo_epochs=2, minibatch_size=len(lengths), micro_batch_size=4)
    params = [p for p in model.parameters() if p.requires_grad] + list(value_head.parameters())
    by_length = update.by_length
    ways = {"by_length": by_length, "shuffled": lambda idx, lengths: idx}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(args.repeats):
        for name, fn in ways.items():
            update.by_length = fn      # the one switch: how a minibatch is cut into micro batches
            opt = torch.optim.AdamW(params, lr=0.0)    # lr 0: every repeat times the same weights
            t0 = time.perf_counter()
            prep = update.prepare(policy, batch, cfg, 0.0, cfg.micro_batch_size)
            update.ppo_update(policy, opt, prep, cfg, 0.0, 1.0, torch.Generator().manual_seed(r))
            times[name].append(time.perf_counter() - t0)
            print(f"repeat {r} {name}: {times[name][-1]:.1f} s", flush=True)
    update.by_length = by_length
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist()
    sorted_order = sorted(order, key=lambda i: lengths[i])
    best = {k: min(v) for k, v in times.items()}
    result = {
        "setting": {"model": args.model, "rows": len(lengths), "agent_lengths": AGENT_LENGTHS,
                    "micro_batch_size": 4, "ppo_epochs": 2, "threads": torch.get_num_threads(),
                    "machine": platform.processor() or platform.machine()},
        "seconds": times, "best_s": best, "speedup": best["shuffled"] / best["by_length"],
        "padded_positions_per_pass": {"by_length": padded_positions(lengths, sorted_order, 4),
                                      "shuffled": padded_positions(lengths, order, 4),
                                      "real_tokens": sum(lengths)},
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("best_s", "speedup", "padded_positions_per_pass")}, indent=1))


if __name__ == "__main__":
    main()
