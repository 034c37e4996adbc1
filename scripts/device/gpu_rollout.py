"""Rollout throughput on one GPU, every decode path side by side, in one call (issue: static engine).

    python scripts/device/gpu_rollout.py --tokenizer DIR --out benchmarks/results/gpu_rollout.json
    python scripts/device/gpu_rollout.py --dry-run          # CPU, tiny shapes, under a minute

Random weights of each model shape with SmolLM2's vocabulary (no weight file travels; only the
tokenizer), bf16, prompts of 256 random tokens, sampled tokens at temperature 1 with no early end:

  decode      per shape (SmolLM2-135M, Qwen2.5-0.5B layout, Qwen2.5-1.5B layout) and batch (256, 32):
              transformers `generate` eager; ragrl `HFEngine`; `generate` with a static cache and
              torch.compile (transformers compiles it itself on CUDA); ragrl `StaticEngine` with its
              step captured as CUDA graphs, and with torch.compile (mode="reduce-overhead").
  weights     the compiled static step samples from new weights: one weight changed in place moves
              the logits (as tests/engines/test_static.py does on the CPU).
  episode     a two-turn search_r1-shaped episode through `prefix_caching` (turn 1, the observation
              appended, turn 2): generated tokens per second against the raw decode rate. Random
              weights never write </search>, so each turn ends at its budget and the observation
              is the BM25 top 3 of the demo corpus for the row's question.
  grpo        one tiny search_r1_grpo step (after one warm-up step) with model.engine static and hf,
              split into rollout and update (random SmolLM2-shaped weights: each turn runs to its budget).

Everything is measured in priority order under one time budget (--budget-s); what would not fit
is written as skipped. The JSON is rewritten after every measurement, so a killed run keeps what it
measured. Eager baselines decode --baseline-tokens (default 128) tokens, the compiled paths 256:
an eager step costs the same at any length here (launch-bound), and the budget is 8 minutes.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from ragrl.engines.base import SamplingParams
from ragrl.engines.hf import HFEngine
from ragrl.engines.static import StaticEngine

SHAPES = {   # hidden, layers, heads, kv heads, intermediate, model type (SmolLM2's vocabulary for all)
    "smollm2-135m": (576, 30, 9, 3, 1536, "llama"),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, "qwen2"),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, "qwen2"),
}
TINY_SHAPE = {"tiny": (64, 2, 4, 2, 128, "llama")}
SECTIONS = ("weights", "decode", "episode", "grpo", "compiled", "generate_compiled")
NEVER = frozenset({-1})     # eos ids for the throughput runs: every row decodes its full budget


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def random_model(shape, vocab: int, dtype, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    hidden, layers, heads, kv, inter, kind = shape
    config = AutoConfig.for_model(kind, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                                  tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = 0
    return model.eval()


class Bench:
    def __init__(self, args):
        self.args, self.t0 = args, time.perf_counter()
        self.gpu = torch.cuda.is_available() and not args.dry_run
        self.device = "cuda" if self.gpu else "cpu"
        self.dtype = torch.bfloat16 if self.gpu else torch.float32
        self.out = {"device": torch.cuda.get_device_name(0) if self.gpu else platform.processor() or "cpu",
                    "torch": torch.__version__, "python": platform.python_version(), "dry_run": args.dry_run,
                    "dtype": str(self.dtype), "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                    "baseline_tokens": args.baseline_tokens, "decode": [], "skipped": [], "errors": []}
        import transformers
        self.out["transformers"] = transformers.__version__

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def sync(self):
        if self.gpu:
            torch.cuda.synchronize()

    def save(self):
        self.out["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        Path(self.args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(self.args.out).write_text(json.dumps(self.out, indent=1))

    def guarded(self, name: str, need_s: float, fn):
        """Run fn() if `need_s` fits in the budget; record it as skipped or as an error otherwise."""
        if self.left() < need_s:
            self.out["skipped"].append(name)
            log(f"skip {name}: {self.left():.0f} s left, needs ~{need_s:.0f}")
            return None
        try:
            return fn()
        except Exception as exc:    # one failed path must not cost the others' numbers
            self.out["errors"].append({"what": name, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            log(f"ERROR {name}: {type(exc).__name__}: {exc}")
            return None
        finally:
            self.save()


def decode_run(bench: Bench, system: str, model, tok, batch: int, new_tokens: int) -> dict:
    """Tokens per second of one system at one batch, after a warm-up of the same shape."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(200, model.config.vocab_size - 200, (batch, bench.args.prompt_tokens), generator=g)
    prompts = ids.tolist()
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)

    if system.startswith("generate"):
        extra = {"cache_implementation": "static"} if system == "generate_static_compiled" else {}
        if system == "generate_static_compiled" and not bench.gpu:
            extra["disable_compile"] = True
        x = ids.to(bench.device)

        def go(n):
            return model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=True, max_new_tokens=n,
                                  min_new_tokens=n, pad_token_id=0, **extra)
    else:
        if system == "hf_engine":
            engine = HFEngine(model, tok, max_batch_size=batch, eos_token_ids=NEVER)
        else:
            mode = {"static_graphs": "graphs" if bench.gpu else "off", "static_compiled": "inductor"}[system]
            engine = StaticEngine(model, tok, max_batch_size=batch, eos_token_ids=NEVER, compile_mode=mode)

        def go(n):
            return engine.generate(prompts, SamplingParams(max_new_tokens=n, temperature=1.0, seed=0))
    warm = new_tokens if system.startswith("static") or system == "generate_static_compiled" else 8
    bench.sync()
    t = time.perf_counter()
    go(warm)     # compiled paths: the same shape, so the timed call reuses what this compiled
    bench.sync()
    warm_s = time.perf_counter() - t
    t = time.perf_counter()
    result = go(new_tokens)
    bench.sync()
    dt = time.perf_counter() - t
    if system.startswith("generate"):
        produced = (result.shape[1] - ids.shape[1]) * batch
    else:
        produced = sum(len(gens[0].token_ids) for gens in result)
    assert produced == batch * new_tokens, f"{system} produced {produced} tokens, not {batch * new_tokens}"
    del params
    return {"system": system, "batch": batch, "new_tokens": new_tokens, "seconds": round(dt, 3),
            "warmup_s": round(warm_s, 1), "tokens_per_s": round(produced / dt, 1)}


def weights_live(bench: Bench, tok) -> dict:
    """Greedy logits of the compiled static step before and after an in-place weight change."""
    model = random_model(TINY_SHAPE["tiny"], len(tok), torch.float32, bench.device)   # compiles in seconds
    out = {}
    for mode in (["graphs", "inductor"] if bench.gpu else ["inductor"]):
        engine = StaticEngine(model, tok, max_batch_size=4, eos_token_ids=NEVER, compile_mode=mode)
        prompt = [list(range(300, 340))] * 2
        greedy = SamplingParams(max_new_tokens=12, temperature=0)
        before = engine.generate(prompt, greedy)[0][0]
        layer = model.model.layers[-1].mlp.down_proj
        saved = layer.weight.detach().clone()
        with torch.no_grad():
            layer.weight.mul_(3.0)
        after = engine.generate(prompt, greedy)[0][0]
        reference = HFEngine(model, tok, eos_token_ids=NEVER).generate(prompt, greedy)[0][0]
        with torch.no_grad():
            layer.weight.copy_(saved)
        moved = max(abs(a - b) for a, b in zip(before.logprobs[1:], after.logprobs[1:]))
        out[mode] = {"logprob_change": moved, "tokens_equal_hf_after_change": after.token_ids == reference.token_ids}
        assert moved > 1e-3, f"{mode}: the compiled step did not see the new weights"
    return out


def episode(bench: Bench, tok, model, batch: int, system: str, raw_rate: float | None) -> dict:
    """Two turns through prefix caching; generated tokens/s against the raw decode rate."""
    from ragrl.datasets import load_questions
    from ragrl.retrieval.resolve import retriever_for
    from ragrl.rollout.multi_turn import chat_ids
    from ragrl.rollout.protocol import get_protocol

    protocol = get_protocol("search_r1")
    questions = load_questions("demo-train")
    retriever = retriever_for(None, None)
    qs = [questions[i % len(questions)] for i in range(batch)]
    prompts = [chat_ids(tok, protocol.messages(q["question"])) for q in qs]
    turn = bench.args.turn_tokens
    engine = (StaticEngine(model, tok, max_batch_size=batch, eos_token_ids=NEVER,
                           compile_mode="graphs" if bench.gpu else "off") if system == "static"
              else HFEngine(model, tok, max_batch_size=batch, eos_token_ids=NEVER))

    def run():
        with engine.prefix_caching():
            t = time.perf_counter()
            first = engine.generate(prompts, SamplingParams(max_new_tokens=turn, temperature=1.0, seed=0))
            t_ret = time.perf_counter()
            hits = retriever.search([q["question"] for q in qs], 3)
            obs = [protocol.format_observation([q["question"]], [h]) for q, h in zip(qs, hits)]
            second_prompts = [p + g[0].token_ids + tok(o, add_special_tokens=False)["input_ids"]
                              for p, g, o in zip(prompts, first, obs)]
            t_ret = time.perf_counter() - t_ret
            second = engine.generate(second_prompts, SamplingParams(max_new_tokens=turn, temperature=1.0, seed=1))
            bench.sync()
            return time.perf_counter() - t, t_ret, first, second, second_prompts
    run()    # warm-up: the same shapes
    dt, t_ret, first, second, second_prompts = run()
    produced = sum(len(g[0].token_ids) for g in first + second)
    rate = produced / dt
    return {"system": system, "batch": batch, "turn_tokens": turn, "seconds": round(dt, 3),
            "retrieval_s": round(t_ret, 3), "obs_tokens_mean": round(sum(map(len, second_prompts)) / batch
                                                                     - sum(len(g[0].token_ids) for g in first) / batch
                                                                     - sum(map(len, prompts)) / batch, 1),
            "tokens_per_s": round(rate, 1), "raw_decode_tokens_per_s": raw_rate,
            "ratio_to_raw": round(rate / raw_rate, 3) if raw_rate else None}


def grpo_step(bench: Bench, tok, engine_kind: str, compile_mode: str, tmp: Path) -> dict:
    """One timed tiny search_r1_grpo step (the second; the first warms up) on a random SmolLM2."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    model_dir = tmp / "random-smollm2"
    if not model_dir.exists():
        shape = TINY_SHAPE["tiny"] if bench.args.dry_run else SHAPES["smollm2-135m"]
        random_model(shape, len(tok), torch.float32, "cpu").save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    overrides = [f"out_dir={tmp / f'grpo-{engine_kind}-{compile_mode}'}", f"steps={bench.args.grpo_steps}", "save_every=1000", "eval_every=0",
                 f"model.name={model_dir}", f"model.engine={engine_kind}", f"model.device={bench.device}",
                 f"model.compile={compile_mode}",
                 f"model.dtype={'bfloat16' if bench.gpu else 'float32'}"]
    if bench.args.dry_run:
        overrides += ["questions_per_step=2", "rollout.n=2", "model.lora_layers=null"]
    cfg = load_train_config("search_r1_grpo", overrides, "tiny")
    rows = Trainer(cfg).train(resume=False, progress=False)
    timed = rows[1:] or rows

    def mean(key):
        return sum(r[key] for r in timed) / len(timed)
    return {"engine": engine_kind, "compile": compile_mode, "steps_timed": len(timed), "step_s": mean("time/step_s"),
            "rollout_s": mean("time/rollout_s"), "update_s": mean("time/update_s"),
            "tokens_per_s": mean("tokens_per_s"), "first_step_s": rows[0]["time/step_s"],
            "per_step": [{k: r[k] for k in ("time/step_s", "time/rollout_s", "time/update_s")} for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: checks this script in ~a minute")
    ap.add_argument("--tokenizer", default=None, help="SmolLM2 tokenizer dir (default: the converted policy's)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu_rollout.json"))
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting measurements after this")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--baseline-tokens", type=int, default=128, help="tokens for the eager baselines")
    ap.add_argument("--turn-tokens", type=int, default=128)
    ap.add_argument("--grpo-steps", type=int, default=3, help="GRPO steps per engine (the first warms up)")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run, in priority order: {', '.join(SECTIONS)}")
    args = ap.parse_args()
    if args.dry_run:
        args.prompt_tokens, args.new_tokens, args.baseline_tokens, args.turn_tokens, args.grpo_steps = 16, 8, 8, 8, 2
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_rollout: no CUDA GPU visible; use --dry-run to check the script on a CPU")
    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from ragrl.models.lm_weights import resolve_policy
        args.tokenizer = str(resolve_policy("smollm2-135m-instruct"))
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    bench = Bench(args)
    tmp = Path(tempfile.mkdtemp(prefix="ragrl-gpu-rollout-"))
    log(f"{bench.out['device']}, torch {torch.__version__}, budget {args.budget_s:.0f} s")

    only = set(args.only.split(","))
    if unknown := only - set(SECTIONS):
        raise SystemExit(f"--only: unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if "weights" in only:
        bench.out["weights_live"] = bench.guarded("weights_live", 30, lambda: weights_live(bench, tok))
    shapes = TINY_SHAPE if args.dry_run else SHAPES
    batches = [4, 2] if args.dry_run else [256, 32]
    models = {}

    def decode(system, name, batch, tokens, need):
        def fn():
            if name not in models:
                models.clear()
                torch.cuda.empty_cache() if bench.gpu else None
                models[name] = random_model(shapes[name], len(tok), bench.dtype, bench.device)
            row = {"shape": name, **decode_run(bench, system, models[name], tok, batch, tokens)}
            bench.out["decode"].append(row)
            log(f"{name} b{batch} {system}: {row['tokens_per_s']:.0f} tok/s (warm-up {row['warmup_s']} s)")
            return row
        return bench.guarded(f"{system}/{name}/b{batch}", need, fn)

    fast = {"static_graphs"}     # eager on a CPU (no CUDA graphs there): tests/engines/test_static.py compiles
    plan = []   # (system, shape, batch, tokens, seconds it may need): priority order
    for name in shapes:
        for b in batches:
            plan.append((next(iter(fast)), name, b, args.new_tokens, 20))
            plan.append(("hf_engine", name, b, args.baseline_tokens, 40))
    for name in shapes:
        for b in batches:
            plan.append(("generate_eager", name, b, args.baseline_tokens, 30))
    later = []
    if bench.gpu:
        later = [("static_compiled", "smollm2-135m", 256, args.new_tokens, 90),
                 ("static_compiled", "smollm2-135m", 32, args.new_tokens, 90)]
        later += [("generate_static_compiled", n, b, args.new_tokens, 100) for b in batches for n in shapes]
    else:
        later = [("generate_static_compiled", "tiny", 4, args.new_tokens, 10)]

    # Group by shape so each model is built once for its main rows.
    for system, name, b, tokens, need in sorted(plan, key=lambda p: list(shapes).index(p[1])):
        if "decode" in only:
            decode(system, name, b, tokens, need)

    first = next(iter(shapes))
    if "episode" in only and not any(r["shape"] == first and r["batch"] == batches[0] and r["system"] in fast
                                     for r in bench.out["decode"]):
        decode(next(iter(fast)), first, batches[0], args.new_tokens, 20)   # the raw rate episodes compare to
    raw = {("static" if r["system"] in fast else "hf"): r["tokens_per_s"] for r in bench.out["decode"]
           if r["shape"] == first and r["batch"] == batches[0] and (r["system"] in fast or r["system"] == "hf_engine")}
    bench.out["episode"], bench.out["grpo"] = [], []

    def ep(system):
        def fn():
            if first not in models:
                models.clear()
                models[first] = random_model(shapes[first], len(tok), bench.dtype, bench.device)
            row = episode(bench, tok, models[first], batches[0], system, raw.get(system))
            bench.out["episode"].append(row)
            log(f"episode {system} b{batches[0]}: {row['tokens_per_s']:.0f} tok/s")
        bench.guarded(f"episode/{system}", 40, fn)

    def grpo(kind, mode):
        def fn():
            bench.out["grpo"].append(grpo_step(bench, tok, kind, mode, tmp))
            log(f"grpo {kind}/{mode}: {bench.out['grpo'][-1]}")
        bench.guarded(f"grpo/{kind}/{mode}", 60, fn)

    if "episode" in only:
        ep("static")
    if "grpo" in only:
        grpo("static", "graphs" if bench.gpu else "off")
        if not args.dry_run:      # the hf trainer path is the test suite's everyday one
            grpo("hf", "off")
    for system, name, b, tokens, need in later[:2]:
        if "compiled" in only:
            decode(system, name, b, tokens, need)
    if "episode" in only:
        ep("hf")
    if bench.gpu and "grpo" in only:
        grpo("static", "inductor")
    for system, name, b, tokens, need in later[2:]:
        if "generate_compiled" in only:
            decode(system, name, b, tokens, need)
    bench.save()
    log(f"wrote {args.out} ({len(bench.out['decode'])} decode rows, skipped {len(bench.out['skipped'])}, "
        f"errors {len(bench.out['errors'])})")


if __name__ == "__main__":
    main()
