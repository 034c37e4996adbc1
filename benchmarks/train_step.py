"""Time per GRPO step and generated tokens/s: ragrl's Trainer vs TRL's GRPOTrainer.

    .venv/bin/python benchmarks/train_step.py                    # SmolLM2-135M, both cases (~15 min)
    .venv/bin/python benchmarks/train_step.py --model /tmp/tiny  # any local model dir (e.g. make_tiny_model)

Two cases, each system in its own subprocess (so peak RSS is its own):
  single_turn  ragrl with the Search-R1 protocol and max_turns=1 vs TRL's normal generate path;
  multi_turn   Search-R1 search episodes (BM25 over the demo corpus): ragrl's episode runner vs
               a TRL `rollout_func` running the same loop (same protocol parser, retriever,
               observation format and budgets) with `model.generate` per turn, and `env_mask`
               so observation tokens get no loss (TRL 1.16's documented multi-turn hook).
Matched: model, questions per step (ragrl's data order is written out and TRL reads it
unshuffled), group size, token budgets, F1 reward, LoRA (r, alpha, targets), lr, clip range
(0.2/0.28), token-mean loss (TRL "dapo"), no KL, one optimizer step per rollout, micro batches
of 4, CPU, the same base dtype (--dtype) and torch thread count. TRL's gradient checkpointing is turned off
(its default is on, which would only slow it down here).
Timed per optimizer step, after `--warmup` steps: rollout + reward + update (TRL: from
on_step_begin to on_step_end). tokens/s = policy-generated tokens / step time.
Writes benchmarks/results/train_step.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = {
    # max_turns, max_turn_tokens, max_response_tokens
    "single_turn": {"max_turns": 1, "max_turn_tokens": 48, "max_response_tokens": 48},
    "multi_turn": {"max_turns": 3, "max_turn_tokens": 40, "max_response_tokens": 200, "passage_words": 30},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name or local model dir")
    p.add_argument("--cases", default="single_turn,multi_turn")
    p.add_argument("--systems", default="ragrl,ragrl_static,trl",
                   help="ragrl (model.engine hf), ragrl_static (model.engine static), trl")
    p.add_argument("--questions", type=int, default=2, help="questions per step")
    p.add_argument("--n", type=int, default=4, help="samples per question (GRPO group size)")
    p.add_argument("--steps", type=int, default=2, help="timed steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-layers", type=int, default=0, help="LoRA on the top N layers only (both systems); 0: all")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="base model weights, both systems (LoRA adapters stay float32 in both)")
    p.add_argument("--topk", type=int, default=2)
    # 1 thread: on a shared, oversubscribed CPU OpenMP's spinning barriers make 2+ threads slower
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_step.json"))
    p.add_argument("--worker", choices=["ragrl", "ragrl_static", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------- shared setup (in each worker)

def step_order(args, questions) -> list[list[dict]]:
    """The questions of each step, in ragrl's seeded order (TRL is fed the same order)."""
    from ragrl.train.steps import step_questions

    total = args.warmup + args.steps
    return [[questions[i] for i in step_questions(len(questions), s, args.questions, args.seed)]
            for s in range(total)]


def load_inputs(args):
    from ragrl.datasets import load_questions

    questions = load_questions("demo-train")[: args.questions * (args.warmup + args.steps)]
    return questions, step_order(args, questions)


def rollout_config(args, case):
    from ragrl.rollout.config import RolloutConfig

    return RolloutConfig(n=args.n, temperature=1.0, topk=args.topk, seed=args.seed, **CASES[case])


def summarize(step_s: list[float], tokens: list[int], rewards: list[float], args) -> dict:
    timed_s, timed_tok = step_s[args.warmup:], tokens[args.warmup:]
    return {
        "step_s": [round(x, 3) for x in step_s], "policy_tokens": tokens, "reward_mean": rewards,
        "mean_step_s": sum(timed_s) / len(timed_s),
        "tokens_per_s": sum(timed_tok) / sum(timed_s),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# ---------------------------------------------------------------- ragrl worker

def run_ragrl(args, case, engine: str = "hf") -> dict:
    from ragrl.train.config import AlgoConfig, DataConfig, ModelConfig, TrainConfig
    from ragrl.train.trainer import Trainer

    questions, order = load_inputs(args)
    with tempfile.TemporaryDirectory() as tmp:
        qfile = Path(tmp) / "questions.jsonl"
        qfile.write_text("".join(json.dumps(q) + "\n" for q in questions))
        cfg = TrainConfig(
            name=f"bench-{case}", agent="search_r1", out_dir=str(Path(tmp) / "run"), seed=args.seed,
            steps=args.warmup + args.steps, questions_per_step=args.questions, lr=args.lr, save_every=10**6,
            eval_every=0, reward={"f1": 1.0},
            model=ModelConfig(name=args.model, lora=True, lora_r=args.lora_r, lora_alpha=2 * args.lora_r,
                              lora_targets=list(LORA_TARGETS), lora_layers=args.lora_layers or None,
                              dtype=args.dtype, engine=engine),
            data=DataConfig(train=str(qfile)),
            algo=AlgoConfig(estimator="grpo", clip_low=0.2, clip_high=0.28, loss_agg="token_mean", kl_coef=0.0,
                            minibatch_size=args.questions * args.n, micro_batch_size=args.micro_batch),
            rollout=rollout_config(args, case))
        rows = Trainer(cfg).train(progress=False)
    step_s = [r["time/step_s"] for r in rows]
    tokens = [round(r["tokens_per_s"] * r["time/rollout_s"]) for r in rows]
    out = summarize(step_s, tokens, [r["reward_mean"] for r in rows], args)
    out["split_s"] = {k: sum(r[f"time/{k}_s"] for r in rows[args.warmup:]) / args.steps
                      for k in ("rollout", "generate", "retrieval", "update")}
    out["questions"] = [[q["id"] for q in qs] for qs in order]
    return out


# ---------------------------------------------------------------- TRL worker

def trl_rollout_func(tok, protocol, retriever, rcfg, counter: list[int]):
    """TRL `rollout_func`: the Search-R1 loop with `model.generate` per turn.

    Gets the step's prompts (each already repeated num_generations times by TRL's sampler) and
    returns one episode per prompt: prompt_ids, completion_ids (actions + observations), env_mask
    (1 on model tokens, 0 on observations) and logprobs (zeros: TRL only reads sampling logprobs
    for vLLM importance sampling, which is off here).
    """
    import torch

    from ragrl.rollout.multi_turn import build_observation

    eos = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}

    def chat_ids(messages) -> list[int]:  # what ragrl's prompt_ids does with protocol.messages(q)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)

    def rollout(prompts, trainer) -> dict:
        model = trainer.model
        prompts_ids = [chat_ids(p) for p in prompts]
        comp, mask = [[] for _ in prompts], [[] for _ in prompts]
        done = [False] * len(prompts)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for turn in range(rcfg.max_turns):
                active = [i for i in range(len(prompts)) if not done[i]]
                if not active:
                    break
                budget = {i: max(1, min(rcfg.max_turn_tokens, rcfg.max_response_tokens - len(comp[i])))
                          for i in active}
                seqs = [prompts_ids[i] + comp[i] for i in active]
                width = max(map(len, seqs))
                ids = torch.tensor([[tok.pad_token_id] * (width - len(s)) + s for s in seqs])
                attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
                out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True,
                                     temperature=rcfg.temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=max(budget.values()), stop_strings=protocol.stop_strings,
                                     tokenizer=tok, eos_token_id=sorted(eos), pad_token_id=tok.pad_token_id,
                                     use_cache=True)
                searching = []
                for row, i in enumerate(active):
                    new = out[row, width:].tolist()
                    cut = next((k + 1 for k, t in enumerate(new) if t in eos), None)
                    if cut is None:  # finished by a stop string or the budget: drop the padding
                        cut = len(new)
                        while cut and new[cut - 1] == tok.pad_token_id:
                            cut -= 1
                    new = new[:min(cut, budget[i])]
                    comp[i] += new
                    mask[i] += [1] * len(new)
                    counter[0] += len(new)
                    ended_eos = bool(new) and new[-1] in eos
                    action = protocol.parse(tok.decode([t for t in new if t not in eos]))
                    if action.kind == "answer" or turn == rcfg.max_turns - 1:
                        done[i] = True
                    elif action.kind == "search":
                        searching.append((i, action.queries[: rcfg.max_queries_per_call]))
                    elif ended_eos:
                        done[i] = True
                    else:
                        feedback = protocol.format_feedback(action.error or "no action")
                        obs = tok.encode(feedback, add_special_tokens=False)
                        comp[i] += obs
                        mask[i] += [0] * len(obs)
                if searching:  # one retriever call for every query of every searching episode
                    flat = [q for _, qs in searching for q in qs]
                    hits, pos = retriever.search(flat, rcfg.topk), 0
                    for i, qs in searching:
                        _, obs = build_observation(tok, protocol, qs, hits[pos: pos + len(qs)], rcfg)
                        pos += len(qs)
                        comp[i] += obs
                        mask[i] += [0] * len(obs)
                for i in active:
                    if len(comp[i]) >= rcfg.max_response_tokens:
                        done[i] = True
        model.train(was_training)
        return {"prompt_ids": prompts_ids, "completion_ids": comp, "env_mask": mask,
                "logprobs": [[0.0] * len(c) for c in comp]}

    return rollout


def run_trl(args, case) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ragrl.rollout.protocol import get_protocol
    from ragrl.models.lm_weights import load_tokenizer, resolve_policy
    from ragrl.rewards.qa import f1_reward

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    questions, order = load_inputs(args)
    protocol, rcfg = get_protocol("search_r1"), rollout_config(args, case)
    path = resolve_policy(args.model)
    tok = load_tokenizer(str(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype))
    rows = [{"prompt": protocol.messages(q["question"]), "answers": q["answers"], "qid": q["id"]}
            for qs in order for q in qs]
    counter, seen, rewards, step_s, tokens, generate_s = [0], [], [], [], [], []

    def f1(completions, answers, qid, completion_ids, **_):
        if case == "single_turn":  # the rollout_func counts its own (policy tokens only)
            counter[0] += sum(len(c) for c in completion_ids)
        seen.append(list(dict.fromkeys(qid)))
        scores = [f1_reward(c[0]["content"] if isinstance(c, list) else c, {"answers": a})
                  for c, a in zip(completions, answers)]
        rewards.append(sum(scores) / len(scores))
        return scores

    class TimedGRPO(GRPOTrainer):
        """GRPOTrainer, timing its rollout phase (`_generate`: generate or rollout_func)."""

        def _generate(self, prompts):
            t0 = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                generate_s.append(time.perf_counter() - t0)

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0, counter[0] = time.perf_counter(), 0

        def on_step_end(self, *a, **k):
            step_s.append(time.perf_counter() - self.t0)
            tokens.append(counter[0])

    batch = args.questions * args.n
    tmp = tempfile.mkdtemp(prefix="trl-bench-")
    config = GRPOConfig(
        output_dir=tmp, use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=batch // args.micro_batch,
        num_generations=args.n, max_completion_length=rcfg.max_response_tokens, temperature=1.0, top_k=0,
        top_p=1.0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, max_steps=args.warmup + args.steps, beta=0.0, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", num_iterations=1, shuffle_dataset=False, gradient_checkpointing=False,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=args.seed,
        dataloader_num_workers=0)
    rollout = None
    if case == "multi_turn":
        from ragrl.retrieval.resolve import cached_bm25_index
        from ragrl.retrieval.resolve import make_retriever

        rollout = trl_rollout_func(tok, protocol, make_retriever(str(cached_bm25_index(None))), rcfg, counter)
    n_layers = model.config.num_hidden_layers
    top = list(range(max(0, n_layers - args.lora_layers), n_layers)) if args.lora_layers else None
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, target_modules=LORA_TARGETS,
                      layers_to_transform=top, task_type="CAUSAL_LM")
    trainer = TimedGRPO(model=model, reward_funcs=f1, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, peft_config=lora, rollout_func=rollout, callbacks=[Timer()])
    trainer.train()
    shutil.rmtree(tmp, ignore_errors=True)
    out = summarize(step_s, tokens, rewards, args)
    gen = sum(generate_s[args.warmup:]) / args.steps
    out["split_s"] = {"rollout": gen, "update": out["mean_step_s"] - gen}  # update: all but the rollout
    out["questions"] = seen
    return out


# ---------------------------------------------------------------- driver

def run_worker(args) -> None:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if args.worker == "trl":
        res = run_trl(args, args.case)
    else:
        res = run_ragrl(args, args.case, engine="static" if args.worker == "ragrl_static" else "hf")
    res["wall_s"] = time.perf_counter() - t0
    Path(args.result).write_text(json.dumps(res))


def spawn(args, system: str, case: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--worker", system, "--case", case, "--result", str(result),
               "--model", args.model, "--questions", str(args.questions), "--n", str(args.n),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--lr", str(args.lr),
               "--lora-r", str(args.lora_r), "--lora-layers", str(args.lora_layers), "--micro-batch", str(args.micro_batch), "--dtype", args.dtype, "--topk", str(args.topk),
               "--threads", str(args.threads), "--seed", str(args.seed)]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not result.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            return {"error": f"exit {proc.returncode}", "log_tail": tail, "wall_s": time.perf_counter() - t0}
        return json.loads(result.read_text())


def compare(case_res: dict) -> None:
    t = case_res.get("trl", {})
    for system, suffix in (("ragrl", ""), ("ragrl_static", "_static")):
        r = case_res.get(system, {})
        if "mean_step_s" in r and "mean_step_s" in t:
            case_res["speedup_step_time" + suffix] = t["mean_step_s"] / r["mean_step_s"]
            case_res["speedup_tokens_per_s" + suffix] = r["tokens_per_s"] / t["tokens_per_s"]
            case_res["same_questions_per_step" + suffix] = [sorted(x) for x in r["questions"]] == \
                [sorted(x) for x in t["questions"]]


def print_table(results: dict) -> None:
    print(f"\n{'case':<12} {'system':<12} {'step s':>8} {'rollout':>8} {'update':>8} {'tok/step':>9} {'tok/s':>7} "
          f"{'RSS MiB':>8}  speedup")
    for case, res in results["cases"].items():
        for system in ("ragrl", "ragrl_static", "trl"):
            s = res.get(system)
            if s is None:
                continue
            if "error" in s:
                print(f"{case:<12} {system:<12} error: {s['error']}")
                continue
            tok = sum(s["policy_tokens"][results["config"]["warmup"]:]) / results["config"]["steps"]
            extra = ""
            suffix = "_static" if system == "ragrl_static" else ""
            if system != "trl" and "speedup_step_time" + suffix in res:
                extra = (f"  {res['speedup_step_time' + suffix]:.2f}x step, "
                         f"{res['speedup_tokens_per_s' + suffix]:.2f}x tok/s")
            split = s.get("split_s", {})
            print(f"{case:<12} {system:<12} {s['mean_step_s']:>8.2f} {split.get('rollout', 0):>8.2f} "
                  f"{split.get('update', 0):>8.2f} {tok:>9.0f} {s['tokens_per_s']:>7.1f} {s['peak_rss_mib']:>8.0f}{extra}")


def main() -> None:
    args = parse_args()
    if args.worker:
        return run_worker(args)
    import peft
    import torch
    import transformers
    import trl

    out = Path(args.out)
    results = {
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "case", "result", "out")},
        "cases_settings": CASES,
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                    "peft": peft.__version__},
        "notes": [
            "CPU, base weights in config.dtype for both (LoRA adapters float32 in both); torch threads = "
            "config.threads for both; the machine is shared, so compare ratios.",
            "single_turn: ragrl stops a turn at a protocol stop string (</search>, </answer>) or EOS; TRL's "
            "normal path has no stop strings (its generate call gets no tokenizer) and runs to EOS or the budget.",
            "multi_turn TRL: rollout_func re-prefills the whole episode each turn with model.generate; ragrl's "
            "engine keeps each row's KV from the previous turn and prefills only the new observation tokens. "
            "TRL computes the LM head on every completion token (observations included) in the update, ragrl "
            "only on action tokens.",
            "TRL gradient_checkpointing=False (its default True would recompute activations).",
        ],
        "cases": {},
    }
    t0 = time.perf_counter()
    for case in args.cases.split(","):
        results["cases"][case] = {}
        for system in args.systems.split(","):
            print(f"running {system} / {case} ...", flush=True)
            results["cases"][case][system] = spawn(args, system, case)
            compare(results["cases"][case])
            results["total_wall_s"] = time.perf_counter() - t0
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2) + "\n")  # partial results survive a long run
    print_table(results)
    print(f"\nwrote {out} ({results['total_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
