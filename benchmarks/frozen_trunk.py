"""Update time with the decoder's frozen bottom layers run once per row (`algo.reuse_frozen_trunk`) vs every forward.

    .venv/bin/python benchmarks/frozen_trunk.py                      # SmolLM2-135M, LoRA on the top 8 layers (~8 min)
    .venv/bin/python benchmarks/frozen_trunk.py --model /tmp/tiny --questions 2 --repeats 1

Batches shaped as issue #53's AG-shape training steps: each `pool-train` question's RAG-R1 prompt (its
system prompt and chat template, real token ids) followed by a query the policy wrote (20 to 56
action tokens, seeded; the episode ends on its search, `end_after_searches: 1`), `--n` samples a
question. Two update shapes, each timed both ways, alternating, in one process (`prepare` +
`ppo_update`, AdamW at lr 0 so every repeat updates the same weights):
  ppo   candidate RRA's (RAG-R1 `learn`): GAE with a critic, KL to the start in the reward, 2 epochs,
        minibatches of 32, micro batches of 4: four forwards a row (reference, old values, 2 epochs);
  grpo  candidate AG's (Search-R1 `learn`): GRPO, KL as a loss term, 1 epoch, minibatches of 8: two
        forwards a row (reference, the epoch).
Also records how far the kept-trunk update is from the whole decoder's (reference log-probs, old
values, the mean loss). Writes benchmarks/results/frozen_trunk.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def episode_batch(tok, questions: list[dict], n: int, seed: int = 0):
    """Trajectories of prompt + 20..56 action tokens each, collated as the trainer collates them."""
    import torch

    from ragrl.methods.rag_r1 import RagR1Protocol
    from ragrl.policy.batch import collate
    from ragrl.rollout.multi_turn import prompt_ids
    from ragrl.rollout.trajectory import Trajectory

    g = torch.Generator().manual_seed(seed)
    protocol, trajs = RagR1Protocol(), []
    for qi, q in enumerate(questions):
        prompt = prompt_ids(tok, protocol, q["question"])
        for _ in range(n):
            k = int(torch.randint(20, 57, (1,), generator=g))
            action = torch.randint(100, len(tok), (k,), generator=g).tolist()
            logprobs = (-torch.rand(k, generator=g)).tolist()
            trajs.append(Trajectory(q["id"], q["question"], [], prompt + action, [0] * len(prompt) + [1] * k,
                                    [0.0] * len(prompt) + logprobs, len(prompt), group=qi,
                                    reward=float(torch.rand(1, generator=g))))
    return collate(trajs, tok.pad_token_id), [len(t.token_ids) for t in trajs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--questions", type=int, default=8, help="pool-train questions (rows = questions x n)")
    ap.add_argument("--n", type=int, default=8, help="samples a question")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--shapes", default="ppo,grpo")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "frozen_trunk.json"))
    args = ap.parse_args()

    import torch

    from ragrl.datasets import load_questions
    from ragrl.policy.lm import LMPolicy
    from ragrl.policy.lm_model import build_policy
    from ragrl.train.config import AlgoConfig, ModelConfig
    from ragrl.train.rng import seed_everything
    from ragrl.train.update import ppo_update, prepare

    shapes = {
        "ppo": (AlgoConfig(estimator="gae", kl_kind="k1", kl_in_reward=True, ppo_epochs=2, minibatch_size=32,
                           micro_batch_size=4), True),
        "grpo": (AlgoConfig(estimator="grpo", minibatch_size=8, micro_batch_size=4), False),
    }
    seed_everything(0)
    questions = load_questions("pool-train")[: args.questions]
    result = {"setting": {"model": args.model, "lora_layers": 8, "questions": args.questions, "n": args.n,
                          "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine()},
              "shapes": {}}
    for shape in args.shapes.split(","):
        cfg, with_critic = shapes[shape]
        seed_everything(0)
        model, tok, head = build_policy(ModelConfig(name=args.model, lora=True, lora_layers=8, dtype="float32"),
                                        with_value_head=with_critic)
        policy = LMPolicy(model, tok, head)
        batch, lengths = episode_batch(tok, questions, args.n)
        times: dict[str, list[float]] = {"whole": [], "kept_trunk": []}
        preps, losses = {}, {}
        for r in range(args.repeats):
            for way in times:
                way_cfg = dataclasses.replace(cfg, reuse_frozen_trunk=way == "kept_trunk")
                opt = torch.optim.AdamW(policy.trainable_parameters(), lr=0.0)
                t0 = time.perf_counter()
                prep = prepare(policy, batch, way_cfg, 0.05, cfg.micro_batch_size)
                stats = ppo_update(policy, opt, prep, way_cfg, 0.05, 1.0, torch.Generator().manual_seed(r))
                times[way].append(time.perf_counter() - t0)
                preps[way], losses[way] = prep, stats["loss"]
                print(f"{shape} repeat {r} {way}: {times[way][-1]:.1f} s", flush=True)
        diff = {name: float((getattr(preps["whole"], name) - getattr(preps["kept_trunk"], name)).abs().max())
                for name in ("ref_logprobs", "old_values") if getattr(preps["whole"], name) is not None}
        best = {k: min(v) for k, v in times.items()}
        result["shapes"][shape] = {
            "algo": {k: v for k, v in dataclasses.asdict(cfg).items()
                     if k in ("estimator", "kl_in_reward", "ppo_epochs", "minibatch_size", "micro_batch_size")},
            "rows": len(lengths), "tokens": sum(lengths), "longest": max(lengths),
            "trunk_layers": preps["kept_trunk"].batch.trunk_depth,
            "seconds": times, "best_s": best, "speedup": best["whole"] / best["kept_trunk"],
            "max_abs_difference": diff, "mean_loss": losses}
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({s: {k: v[k] for k in ("best_s", "speedup", "max_abs_difference")}
                      for s, v in result["shapes"].items()}, indent=1))


if __name__ == "__main__":
    main()
