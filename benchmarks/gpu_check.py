"""The GPU paths, checked on a CUDA machine: device placement, bf16, rollout and RL steps.

    python benchmarks/gpu_check.py                      # ~3 min on one H100
    python benchmarks/gpu_check.py --steps 20 --out results/gpu_check.json

CI has no GPU, so these paths are exercised here, on a lent GPU, and the JSON is committed:
  1. `model.device=auto` puts the policy (and a PPO value head) on the GPU; `model.dtype=auto`
     picks bfloat16 there;
  2. rollout throughput of `run_episodes` (search_r1, real BM25) and of raw batched decoding;
  3. the tiny search_r1_grpo recipe (SFT warm start, then GRPO steps) on the GPU, with the
     step time split into rollout and update, and a check that the LoRA weights moved;
  4. a PPO step (GAE with the value head) on the GPU;
  5. checkpoint + `--resume` on the GPU: the resumed step's metrics against an uninterrupted
     run's (bf16 kernels on a GPU are not bit-reproducible, so the difference is reported);
  6. MMOA-RAG's MAPPO (three agents, one adapter each, selector branching, a value head) on the
     GPU: its update orders micro batches by prompt length, an index path the others never take
     (it failed on the H200 of 2026-11-26 until fixed: a CPU permutation indexed GPU lengths).

    python benchmarks/gpu_check.py --only mmoa          # just step 6 (~1 min)
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="GRPO steps to time")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu_check.json"))
    ap.add_argument("--device", default="auto", help="model.device (cpu: a smoke test of this script itself)")
    ap.add_argument("--model", default=None, help="policy name or path (default: the recipe's)")
    ap.add_argument("--only", choices=["mmoa"], default=None, help="run only this check")
    args = ap.parse_args()

    import torch

    from ragrl.datasets import load_questions
    from ragrl.engines.base import SamplingParams
    from ragrl.rollout.multi_turn import chat_ids, run_episodes
    from ragrl.rollout.protocol import get_protocol
    from ragrl.policy.lm_model import build_policy
    from ragrl.train.recipe import load_train_config, sft_warm_start
    from ragrl.train.trainer import Trainer
    from ragrl.policy.model_config import engine_for
    from ragrl.train.setup import default_retriever

    gpu = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA GPU; this script checks the GPU paths")
    out: dict = {"gpu": torch.cuda.get_device_name(0) if gpu else None, "torch": torch.__version__,
                 "python": platform.python_version()}
    tmp = Path(tempfile.mkdtemp(prefix="ragrl-gpu-"))
    common = [f"model.device={args.device}"] + ([f"model.name={args.model}"] if args.model else [])
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if args.only == "mmoa":
        out["mmoa"] = check_mmoa(tmp, common)
        return write(out, args.out)
    cfg = load_train_config("search_r1_grpo", [f"out_dir={tmp / 'rl'}", f"steps={args.steps}", "save_every=1000",
                                               *common], "tiny")
    model, tok, _ = build_policy(cfg.model)
    p = next(model.parameters())
    out["policy_device"], out["policy_dtype"] = str(p.device), str(p.dtype)
    log(f"policy on {p.device} in {p.dtype}")
    assert p.device.type == ("cuda" if gpu else "cpu"), f"model.device={args.device} put the policy on {p.device}"
    engine = engine_for(cfg.model, model, tok)
    retriever = default_retriever(cfg)
    questions = load_questions(cfg.data.train)[:32]

    # 2. raw batched decoding and multi-turn rollouts, 32 rows
    prompts = [chat_ids(tok, [{"role": "user", "content": q["question"]}]) for q in questions]
    for _ in range(2):   # the first call warms up kernels and the allocator
        sync()
        t0 = time.perf_counter()
        gens = engine.generate(prompts, SamplingParams(max_new_tokens=128, temperature=1.0, seed=0))
        sync()
        dt = time.perf_counter() - t0
    n_tok = sum(len(g[0].token_ids) for g in gens)
    out["generate_batch32"] = {"tokens": n_tok, "seconds": dt, "tokens_per_s": n_tok / dt}
    log(f"generate, batch 32: {n_tok / dt:.0f} tokens/s")
    t0 = time.perf_counter()
    trajs, stats = run_episodes(engine, get_protocol(cfg.agent), retriever, questions,
                                replace(cfg.rollout, n=1, seed=0))
    dt = time.perf_counter() - t0
    n_tok = sum(t.num_action_tokens for t in trajs)
    out["rollout_batch32"] = {"tokens": n_tok, "seconds": dt, "tokens_per_s": n_tok / dt,
                              "retrieval_s": stats["retrieval_s"]}
    log(f"search_r1 rollouts, 32 episodes: {n_tok / dt:.0f} tokens/s")

    # 3. SFT warm start and GRPO steps on the GPU
    t0 = time.perf_counter()
    sft = sft_warm_start(cfg, model, tok, retriever, tmp / "sft")
    out["sft"] = {"steps": cfg.sft.steps, "seconds": time.perf_counter() - t0,
                  "loss_first": sft.losses[0], "loss_last": sft.losses[-1]}
    log(f"SFT {cfg.sft.steps} steps: loss {sft.losses[0]:.3f} -> {sft.losses[-1]:.3f}")
    rows, moved = trained(model, "GRPO", lambda: Trainer(cfg, retriever=retriever, model_bundle=(model, tok, None))
                          .train(resume=False, progress=False))
    keep = ("reward_mean", "flat_group_frac", "f1", "searches", "grad_norm", "time/step_s", "time/rollout_s", "time/update_s",
            "tokens_per_s")
    out["grpo"] = {"steps": len(rows), "max_abs_lora_change": moved,
                   "rows": [{k: r.get(k) for k in keep} for r in rows],
                   "mean_step_s": sum(r["time/step_s"] for r in rows) / len(rows),
                   "mean_update_s": sum(r["time/update_s"] for r in rows) / len(rows),
                   "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if gpu else None}
    log(f"GRPO {len(rows)} steps, {out['grpo']['mean_step_s']:.1f} s/step, LoRA moved {moved:.2e}")

    # 4. PPO (GAE + value head) on the GPU
    ppo_cfg = load_train_config("search_r1_ppo", [f"out_dir={tmp / 'ppo'}", "steps=2", "save_every=1000", *common],
                                "tiny")
    ppo = Trainer(ppo_cfg, retriever=retriever)
    assert next(ppo.policy.value_head.parameters()).device == p.device, "value head not on the policy's device"
    prow = ppo.train(resume=False, progress=False)
    out["ppo"] = {"steps": len(prow), "value_loss": [r.get("value_loss") for r in prow],
                  "step_s": [r["time/step_s"] for r in prow]}
    log(f"PPO {len(prow)} steps, value loss {[round(v, 4) for v in out['ppo']['value_loss']]}")

    # 5. checkpoint and resume on the device: 3 steps straight vs 2 steps, a new Trainer, resume, 1 step
    def fresh(run: str, steps: int) -> Trainer:
        c = load_train_config("search_r1_grpo", [f"out_dir={tmp / run}", f"steps={steps}", "save_every=1",
                                                 "rollout.n=4", "questions_per_step=2", *common], "tiny")
        return Trainer(c, retriever=retriever)
    straight = fresh("straight", 3).train(resume=False, progress=False)
    fresh("resumed", 2).train(resume=False, progress=False)
    resumed = fresh("resumed", 3).train(resume=True, progress=False)
    keys = ("reward_mean", "f1", "loss", "grad_norm")
    diffs = {k: abs(straight[2][k] - resumed[0][k]) for k in keys if k in straight[2]}
    out["resume"] = {"straight_step3": {k: straight[2][k] for k in diffs}, "resumed_step3": {k: resumed[0][k] for k in diffs},
                     "abs_diff": diffs, "resumed_steps_run": len(resumed)}
    log(f"resume: step 3 metric differences {diffs}")
    assert len(resumed) == 1, "resume did not continue at step 3"

    out["mmoa"] = check_mmoa(tmp, common)
    write(out, args.out)


def check_mmoa(tmp: Path, common: list[str]) -> dict:
    """6. Two MAPPO steps of the MMOA pipeline where the policy is (bundled demo corpus, BM25)."""
    from ragrl.train.trainer import Trainer
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("mmoa_mappo", [f"out_dir={tmp / 'mmoa'}", "steps=2", "save_every=1000", "eval_every=0",
                                           "keep_best=null", "data.corpus=null", "agent_adapters=per_agent",
                                           "rollout.n=2", "mmoa.selector_samples=2", "questions_per_step=2",
                                           "algo.micro_batch_size=3", *common], "tiny_grouped")
    trainer = Trainer(cfg)
    rows, moved = trained(trainer.model, "MMOA MAPPO", lambda: trainer.train(resume=False, progress=False))
    assert len(rows) == 2, f"MMOA MAPPO ran {len(rows)} steps, not 2"
    return {"steps": len(rows), "max_abs_lora_change": moved, "step_s": [r["time/step_s"] for r in rows],
            "flat_group_frac": [r.get("flat_group_frac") for r in rows],
            "value_loss": [r.get("value_loss") for r in rows]}


def trained(model, what: str, train) -> tuple[list[dict], float]:
    """`train()`'s rows and the largest change of any trainable weight of `model`, checked: the
    weights moved (unless every group was flat: all samples scored alike give no gradient) and no
    gradient norm is NaN."""
    before = {n: q.detach().float().clone() for n, q in model.named_parameters() if q.requires_grad}
    rows = train()
    moved = max(float((q.detach().float() - before[n]).abs().max())
                for n, q in model.named_parameters() if q.requires_grad)
    log(f"{what}: {len(rows)} steps, LoRA moved {moved:.2e}")
    learnable = any(r["flat_group_frac"] < 1.0 for r in rows)
    assert (moved > 0 or not learnable) and all(r["grad_norm"] == r["grad_norm"] for r in rows), f"{what} did not update"
    return rows, moved


def write(out: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
