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
  episode     two-turn search_r1-shaped episodes through the rollout runner: generated tokens per
              second against the raw decode rate, for `static` with each next turn continuing in
              its slot, `static` turn by turn (KV reused through prefix caching) and `hf`. Random
              weights never write </search>, so every turn is read as a search for its own first
              words (AlwaysSearch), ends at its budget, and its observation is the BM25 top 3 of
              the demo corpus (~450 tokens).
  update_ab   one batch's update timed after a static rollout, after the static engine's buffers
              and graphs are freed, and after an hf decode, with allocator counters and profiles.
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
SECTIONS = ("weights", "decode", "episode", "update_ab", "grpo", "compiled", "generate_compiled")
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


class AlwaysSearch:
    """search_r1's episode shape for random weights, which never write a tag: every turn is read as a
    search for its own first words, so each turn ends at its budget and each observation is the real
    BM25 top 3 of the demo corpus (about 400-500 tokens), as a searching policy's would be."""

    def __init__(self):
        from ragrl.rollout.protocol import get_protocol

        self.inner = get_protocol("search_r1")

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def parse(self, text: str):
        from ragrl.rollout.protocol import Action

        return Action("search", queries=[" ".join(text.split()[:12]) or "search"])


def episode(bench: Bench, tok, model, batch: int, system: str, raw_rate: float | None) -> dict:
    """Two-turn episodes through the rollout runner (`run_episodes`), generated tokens/s against the
    raw decode rate. system: static (each next turn continues in its slot), static_loop (turn by
    turn, KV reused through prefix caching), hf (turn by turn)."""
    from ragrl.datasets import load_questions
    from ragrl.retrieval.resolve import retriever_for
    from ragrl.rollout.config import RolloutConfig
    from ragrl.rollout.multi_turn import run_episodes

    questions = load_questions("demo-train")
    samples = [{**questions[i % len(questions)], "id": str(i)} for i in range(batch)]
    turn = bench.args.turn_tokens
    cfg = RolloutConfig(max_turns=2, max_turn_tokens=turn, max_response_tokens=2 * turn + 640, max_obs_tokens=512,
                        passage_words=120, topk=3, temperature=1.0, n=1, seed=0, turns_in_slot=system == "static")
    engine = (StaticEngine(model, tok, max_batch_size=batch, eos_token_ids=NEVER,
                           compile_mode="graphs" if bench.gpu else "off") if system.startswith("static")
              else HFEngine(model, tok, max_batch_size=batch, eos_token_ids=NEVER))
    retriever, protocol = retriever_for(None, None), AlwaysSearch()

    def run():
        bench.sync()
        t = time.perf_counter()
        trajs, stats = run_episodes(engine, protocol, retriever, samples, cfg)
        bench.sync()
        return time.perf_counter() - t, trajs, stats
    run()    # warm-up: the same shapes
    dt, trajs, stats = run()
    rate = stats["gen_tokens"] / dt
    observed = [len(t.token_ids) - t.prompt_len - t.num_action_tokens for t in trajs]
    return {"system": system, "batch": batch, "turn_tokens": turn, "seconds": round(dt, 3),
            "generate_s": round(stats["generate_s"], 3), "retrieval_s": round(stats["retrieval_s"], 3),
            "gen_tokens": stats["gen_tokens"], "obs_tokens_mean": round(sum(observed) / batch, 1),
            "prefill_tokens": getattr(engine, "prefill_tokens", None),
            "decode_steps": getattr(engine, "decode_steps", None),
            "tokens_per_s": round(rate, 1), "raw_decode_tokens_per_s": raw_rate,
            "ratio_to_raw": round(rate / raw_rate, 3) if raw_rate else None}


def random_smollm2_dir(bench: Bench, tok, tmp: Path) -> Path:
    model_dir = tmp / "random-smollm2"
    if not model_dir.exists():
        shape = TINY_SHAPE["tiny"] if bench.args.dry_run else SHAPES["smollm2-135m"]
        random_model(shape, len(tok), torch.float32, "cpu").save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    return model_dir


def grpo_overrides(bench: Bench, model_dir: Path, out: Path, engine_kind: str, compile_mode: str, steps: int):
    sets = [f"out_dir={out}", f"steps={steps}", "save_every=1000", "eval_every=0", f"model.name={model_dir}",
            f"model.engine={engine_kind}", f"model.device={bench.device}", f"model.compile={compile_mode}",
            f"model.dtype={'bfloat16' if bench.gpu else 'float32'}"]
    if bench.args.dry_run:
        sets += ["questions_per_step=2", "rollout.n=2", "model.lora_layers=null"]
    return sets


def grpo_step(bench: Bench, tok, engine_kind: str, compile_mode: str, tmp: Path) -> dict:
    """One timed tiny search_r1_grpo step (the second; the first warms up) on a random SmolLM2."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    model_dir = random_smollm2_dir(bench, tok, tmp)
    overrides = grpo_overrides(bench, model_dir, tmp / f"grpo-{engine_kind}-{compile_mode}", engine_kind, compile_mode,
                               bench.args.grpo_steps)
    cfg = load_train_config("search_r1_grpo", overrides, "tiny")
    rows = Trainer(cfg).train(resume=False, progress=False)
    timed = rows[1:] or rows

    def mean(key):
        return sum(r[key] for r in timed) / len(timed)
    return {"engine": engine_kind, "compile": compile_mode, "steps_timed": len(timed), "step_s": mean("time/step_s"),
            "rollout_s": mean("time/rollout_s"), "update_s": mean("time/update_s"),
            "tokens_per_s": mean("tokens_per_s"), "first_step_s": rows[0]["time/step_s"],
            "per_step": [{k: r[k] for k in ("time/step_s", "time/rollout_s", "time/update_s")} for r in rows]}


def update_ab(bench: Bench, tok, tmp: Path) -> dict:
    """One batch of trajectories, its update timed again and again: right after a static rollout,
    after the static engine's KV buffers and graphs are freed, and after an hf decode, each with the
    allocator's counters and (once after static, once after hf) a profile's top ops. The update
    after a static rollout took 2-3.5x as long as after hf on the H200 of 2026-11-27: this says why."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer
    from ragrl.train.update import ppo_update, prepare

    mode = "graphs" if bench.gpu else "off"
    cfg = load_train_config("search_r1_grpo", grpo_overrides(bench, random_smollm2_dir(bench, tok, tmp),
                                                             tmp / "update-ab", "static", mode, 1), "tiny")
    trainer = Trainer(cfg)
    trainer.train(resume=False, progress=False)       # one whole step: captures, the first update
    setup, policy = trainer.setup, trainer.policy
    samples = trainer.questions[:cfg.questions_per_step]
    policy.eval()
    trajs, _ = setup.rollout(samples, cfg.rollout, 0)
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)           # groups that are not flat: every row has an advantage
    learn = [t for t in trajs if setup.trains(t)]
    counters = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")

    def update(label: str, profile: bool = False) -> dict:
        policy.train()
        before = torch.cuda.memory_stats() if bench.gpu else {}
        bench.sync()
        t = time.perf_counter()
        prof = None
        if profile:
            kinds = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if bench.gpu else [])
            prof = torch.profiler.profile(activities=kinds)
            prof.__enter__()
        prep = prepare(policy, policy.collate(learn), cfg.algo, trainer.kl.value, cfg.algo.micro_batch_size)
        ppo_update(policy, trainer.optimizer, prep, cfg.algo, trainer.kl.value, cfg.max_grad_norm,
                   torch.Generator().manual_seed(0))
        bench.sync()
        if prof is not None:
            prof.__exit__(None, None, None)
        row = {"when": label, "update_s": round(time.perf_counter() - t, 3), "profiled": profile}
        if bench.gpu:
            after = torch.cuda.memory_stats()
            row.update({k: after.get(k, 0) - before.get(k, 0) for k in counters})
            row["reserved_gib"] = round(torch.cuda.memory_reserved() / 2**30, 2)
            row["allocated_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
        if prof is not None:
            key = "self_cuda_time_total" if bench.gpu else "self_cpu_time_total"
            row["top_ops"] = prof.key_averages().table(sort_by=key, row_limit=12).splitlines()
            row["launches"] = sum(e.count for e in prof.key_averages() if e.key.startswith("cudaLaunchKernel"))
        policy.eval()
        log(f"update_ab {label}: {row['update_s']} s")
        return row

    rows = [update("after a static rollout"), update("again, nothing between"), update("profiled", profile=True)]
    engine = setup.extras["engine"]()
    engine._buffers.clear()
    engine._graphs.clear()
    if bench.gpu:
        torch.cuda.empty_cache()
    rows.append(update("static KV buffers and graphs freed"))
    hf = HFEngine(trainer.model, tok, max_batch_size=64)
    prompts = [t.token_ids[:t.prompt_len] for t in learn]
    hf.generate(prompts, SamplingParams(max_new_tokens=bench.args.turn_tokens, temperature=1.0, seed=0))
    rows += [update("after an hf decode"), update("after an hf decode, profiled", profile=True)]
    policy.eval()
    setup.rollout(samples, cfg.rollout, 0)
    rows.append(update("after a second static rollout"))
    return {"trajectories": len(learn), "tokens": sum(len(t.token_ids) for t in learn), "rows": rows}


def merge_decode_rows(extra: Path, out: Path) -> None:
    """Add `extra`'s decode rows (a second device call's) to `out`, keeping `out`'s other sections."""
    base, more = json.loads(out.read_text()), json.loads(extra.read_text())
    seen = {(r["system"], r["shape"], r["batch"]) for r in base["decode"]}
    added = [r for r in more["decode"] if (r["system"], r["shape"], r["batch"]) not in seen]
    base["decode"] += added
    base.setdefault("merged_calls", []).append({"file": extra.name, "decode_rows": len(added),
                                                "device": more.get("device"), "elapsed_s": more.get("elapsed_s")})
    out.write_text(json.dumps(base, indent=1))
    log(f"added {len(added)} decode rows from {extra} to {out}")


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
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"model shapes to decode: {', '.join(SHAPES)}")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run, in priority order: {', '.join(SECTIONS)}")
    ap.add_argument("--merge", default=None, help="no measuring: add this file's decode rows (a second call's) to --out")
    args = ap.parse_args()
    if args.merge:
        merge_decode_rows(Path(args.merge), Path(args.out))
        return
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
    if unknown := set(args.shapes.split(",")) - set(SHAPES):
        raise SystemExit(f"--shapes: unknown shapes {sorted(unknown)}; choose from {', '.join(SHAPES)}")
    shapes = TINY_SHAPE if args.dry_run else {k: v for k, v in SHAPES.items() if k in args.shapes.split(",")}
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
            row = episode(bench, tok, models[first], batches[0], system, raw.get("hf" if system == "hf" else "static"))
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
        ep("static_loop")
    if "update_ab" in only:
        bench.out["update_ab"] = bench.guarded("update_ab", 60, lambda: update_ab(bench, tok, tmp))
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
