"""Training memory per rank on 2 gloo ranks: replicated (DDP), ZeRO-1 (optimizer state
sharded) and FSDP2 (parameters, gradients and optimizer state sharded; ragrl.policy.fsdp).

    .venv/bin/python benchmarks/zero_memory.py            # full fine-tuning of SmolLM2-135M

Each rank loads the policy (full fine-tuning by default: LoRA's state is too small to matter),
takes one AdamW step on a small batch of its own, and reports the bytes of weights, gradients
and optimizer state it holds after the step, and its peak RSS (which includes loading the whole
model before sharding it). Writes benchmarks/results/zero_memory.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MODES = ("replicated", "zero1", "fsdp")


def _rank(rank: int, world: int, port: int, model: str, mode: str, out: str) -> None:
    from ragrl.train.config import ModelConfig
    from ragrl.train.distributed import init_distributed, make_optimizer, optimizer_state_bytes
    from ragrl.policy.fsdp import is_dtensor, local_nbytes, shard_params
    from ragrl.policy.lm_model import build_policy

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    init_distributed()
    policy, tok, _ = build_policy(ModelConfig(name=model, lora=False, dtype="float32"))
    if mode == "fsdp":
        shard_params(policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = make_optimizer([{"params": params}], lr=1e-5, weight_decay=0.0, shard=mode == "zero1")
    ids = torch.randint(0, len(tok), (2, 64), generator=torch.Generator().manual_seed(rank))
    loss = policy(input_ids=ids, labels=ids).loss
    loss.backward()
    for p in params:                       # DDP-style gradient sum (FSDP's backward reduced its own)
        if not is_dtensor(p):
            dist.all_reduce(p.grad)
    opt.step()
    row = {"rank": rank, "mode": mode, "trainable_params": sum(p.numel() for p in params),
           "weights_mib": sum(local_nbytes(p) for p in policy.parameters()) / 2**20,
           "grads_mib": sum(local_nbytes(p.grad) for p in params if p.grad is not None) / 2**20,
           "optimizer_state_mib": optimizer_state_bytes(opt) / 2**20,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    row["total_mib"] = row["weights_mib"] + row["grads_mib"] + row["optimizer_state_mib"]
    Path(out, f"{mode}.{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "zero_memory.json"))
    args = ap.parse_args()
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            mp.spawn(_rank, args=(2, _free_port(), args.model, mode, tmp), nprocs=2, join=True)
            rows += [json.loads(Path(tmp, f"{mode}.{r}.json").read_text()) for r in range(2)]
    rep = {r["mode"]: r for r in rows if r["rank"] == 0}
    base = rep["replicated"]
    result = {"model": args.model, "world": 2, "per_rank": rows,
              "optimizer_state_ratio_zero1_vs_replicated": rep["zero1"]["optimizer_state_mib"] / base["optimizer_state_mib"],
              "state_ratio_vs_replicated": {m: rep[m]["total_mib"] / base["total_mib"] for m in MODES},
              "peak_rss_saved_mib_rank0": {m: base["peak_rss_mib"] - rep[m]["peak_rss_mib"] for m in MODES}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
