"""The faults that end real RL runs, injected into short tiny-model runs (issue #43): what ragrl did.

    .venv/bin/python benchmarks/faults.py            # ~4 min on 2 CPU cores -> benchmarks/results/faults.json

Each fault is injected into a real run of the real trainer (a tiny random Llama with SmolLM2's
tokenizer; BM25 over 100 demo passages; 4 training and 3 held-out demo questions) and compared with
the same run uninterrupted:

  nan_gradient          the policy's log-probs turn NaN in step 2's update
  collapse              every trajectory of step 3 scores -5 (guard.reward_drop 0.5 over 2 steps)
  server_restart        the real retrieval server (HTTP) stops in step 1's rollout and is back 2 s later
  server_gone           ... stops in step 1's rollout and stays away (guard.retrieval_wait_s 1); back, then --resume
  server_gone_in_eval   ... stops in step 1's evaluation (after its update); back, then --resume
  stalled_row           the engine stalls on one row of step 1 for 30 s (rollout.max_episode_s 2)
  truncated_checkpoint  the newest checkpoint's optimizer.pt cut in half, then --resume
  corrupted_checkpoint  one byte of the newest checkpoint's adapter flipped, then --resume

The server faults run MMOA-RAG's pipeline (`mmoa_mappo`, which searches at every step whatever the
random model writes); the others `search_r1_grpo`'s tiny variant. Per fault: what ragrl did, the
steps lost (completed steps whose work is gone: recomputed after a fallback or discarded by a
rollback; "lost" is completed work that is gone for good, "redone" what was recomputed), and whether the final metrics equal the uninterrupted run's where the fault is transient
(wall-clock readings left out). One table is printed and written as JSON.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import re
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEARCH_R1 = ("search_r1_grpo", ["steps=4", "save_every=1", "keep_last=3", "lr=0.001"])
MMOA = ("mmoa_mappo", ["steps=2", "save_every=100", "eval_every=1", "data.eval_n=2", "algo.minibatch_size=4",
                       "guard.retrieval_wait_s=1"])


def comparable(rows: list[dict]) -> list[dict]:
    """Rows without their wall-clock readings."""
    return [{k: v for k, v in r.items() if not ("time" in k or "wall" in k or k.endswith(("_s", "per_s")))}
            for r in rows]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(
        abs(x[k] - y[k]) <= 1e-6 + 1e-5 * abs(y[k]) for k in x) for x, y in zip(a, b))


class Env:
    """The tiny model and the data files under one temporary folder (the BM25 index of its corpus and
    SmolLM2's converted tokenizer are cached in $RAGRL_HOME as usual)."""

    def __init__(self, root: Path):
        from ragrl.datasets import load_questions
        from ragrl.models.tiny import make_tiny_model
        from ragrl.paths import DEMO_CORPUS
        from ragrl.retrieval.corpus import load_corpus

        self.root = root
        make_tiny_model(root / "model")
        write = lambda name, rows: (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        write("train.jsonl", load_questions("demo-train")[:4])
        write("eval.jsonl", load_questions("demo-eval")[:3])
        corpus = load_corpus(DEMO_CORPUS)
        write("corpus.jsonl", [corpus.passage(i) for i in range(100)])
        self.sets = [f"model.name={root / 'model'}", "model.dtype=float32", f"data.train={root / 'train.jsonl'}",
                     f"data.eval={root / 'eval.jsonl'}", f"data.corpus={root / 'corpus.jsonl'}", "data.eval_n=3",
                     "questions_per_step=2", "rollout.n=2", "rollout.max_turn_tokens=8",
                     "rollout.max_response_tokens=24", "sft.steps=0"]
        self.servers: list = []

    def config(self, recipe, name: str, *extra: str):
        from ragrl.train.recipe import load_train_config

        recipe_name, overrides = recipe
        return load_train_config(recipe_name, [*self.sets, *overrides, f"out_dir={self.root / name}", *extra], "tiny")

    def serve(self, port: int = 0):
        from ragrl.retrieval.index import load_index
        from ragrl.retrieval.resolve import cached_bm25_index
        from ragrl.retrieval.server import ServerThread, create_app

        server = ServerThread(create_app(load_index(cached_bm25_index(str(self.root / "corpus.jsonl")))), port=port)
        server.start()
        self.servers.append(server)
        return server


def train(cfg, *, resume=False, patch=None):
    """(rows in metrics.jsonl, the error that stopped the run or None) of one real training call."""
    from ragrl.errors import RagrlError
    from ragrl.train.run_dir import read_metrics
    from ragrl.train.trainer import Trainer

    trainer = Trainer(cfg)
    if patch is not None:
        patch(trainer)
    try:
        trainer.train(resume=resume, progress=False)
        error = None
    except RagrlError as e:
        error = e
    return read_metrics(Path(cfg.out_dir)), error, trainer


def on_call(owner, name: str, when, action) -> None:
    """Run `action()` before owner.name(...) whenever `when()` holds (once)."""
    call, fired = getattr(owner, name), []

    def wrapped(*a, **kw):
        if not fired and when():
            fired.append(1)
            action()
        return call(*a, **kw)
    setattr(owner, name, wrapped)


# ---------------------------------------------------------------- the faults

def nan_gradient(env, reference):
    import torch

    def patch(trainer):
        forward = trainer.policy.forward

        def poisoned(batch, **kw):
            out = forward(batch, **kw)
            if trainer.step == 2 and torch.is_grad_enabled():
                out["logprobs"] = out["logprobs"] * float("nan")
            return out
        trainer.policy.forward = poisoned
    rows, error, trainer = train(env.config(SEARCH_R1, "nan"), patch=patch)
    skipped = [r["step"] for r in rows if r.get("guard/nonfinite_skipped")]
    finite = all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    return {"did": f"skipped the non-finite update of step(s) {skipped}, weights all finite: {finite}; "
                   f"{len(rows)} of 4 steps ran", "survived": error is None and len(rows) == 4 and finite,
            "steps_lost": 0, "steps_redone": 0, "transient": False, "equal": None}


def collapse(env, reference):
    import ragrl.train.trainer as trainer_module

    original = trainer_module.make_reward

    def patch(trainer):
        visits = []

        def falling(spec):   # the recipe's reward + 1, except on the first visit of step 3: -5
            base = original(spec)
            return lambda traj, sample: -5.0 if trainer.step == 3 and not visits else float(base(traj, sample)) + 1.0
        trainer_module.make_reward = falling
        step = trainer.train_step

        def counting():
            out = step()
            if trainer.step == 3:
                visits.append(1)
            return out
        trainer.train_step = counting
    try:
        rows, error, trainer = train(env.config(SEARCH_R1, "collapse", "guard.reward_drop=0.5", "guard.window=2",
                                                "save_every=2"), patch=patch)
    finally:
        trainer_module.make_reward = original
    event = next((r for r in rows if r.get("guard/rollback")), {})
    redone = int(event["guard/tripped_step"] - event["step"]) + 1 if event else None
    return {"did": f"rule reward_drop tripped at step {int(event.get('guard/tripped_step', -1))}: rolled back to "
                   f"the checkpoint after step {int(event.get('step', 0)) - 1}, learning rate x{trainer.watch.lr_scale:g}, "
                   f"{len(trainer.watch.skipped_ids)} questions left out; finished {len(rows)} of 4 steps",
            "survived": error is None and len(rows) == 4, "steps_lost": 0, "steps_redone": redone,
            "transient": False, "equal": None}


def server_restart(env, reference):
    server = env.serve()
    port = int(server.url.rsplit(":", 1)[1])

    def down_for_2s():
        server.stop()
        threading.Timer(2.0, lambda: env.serve(port)).start()

    def patch(trainer):
        on_call(trainer.setup, "rollout", lambda: trainer.step == 1, down_for_2s)
    ref = train(env.config(MMOA, "server_ref", f"data.index={server.url}", "guard.retrieval_wait_s=30"))[0]
    t0 = time.perf_counter()
    rows, error, _ = train(env.config(MMOA, "server_restart", f"data.index={server.url}", "guard.retrieval_wait_s=30"),
                           patch=patch)
    return {"did": f"the client waited the restart out (run {time.perf_counter() - t0:.0f} s), no step redone",
            "survived": error is None and len(rows) == 2, "steps_lost": 0, "steps_redone": 0, "transient": True,
            "equal": same(comparable(rows), comparable(ref)), "_reference": ref}


def server_gone(env, reference, phase="rollout"):
    server = env.serve()
    port = int(server.url.rsplit(":", 1)[1])
    sets = (f"data.index={server.url}",)
    ref = train(env.config(MMOA, f"gone_ref_{phase}", *sets))[0]
    at = 1 if phase == "rollout" else 2

    def patch(trainer):
        owner = trainer.setup if phase == "rollout" else trainer
        on_call(owner, phase if phase == "rollout" else "evaluate", lambda: trainer.step == at, server.stop)
    name = f"gone_{phase}"
    stopped, error, _ = train(env.config(MMOA, name, *sets), patch=patch)
    code = getattr(error, "exit_code", None)
    env.serve(port)
    rows, error2, _ = train(env.config(MMOA, name, *sets), resume=True)
    from ragrl.train.checkpoint import latest_checkpoint
    return {"did": f"stopped with exit code {code} after {len(stopped)} logged step(s), checkpoint kept; "
                   f"--resume finished {len(rows)} of 2 steps",
            "survived": code == 75 and error2 is None and len(rows) == 2, "steps_lost": 0, "steps_redone": 0,
            "transient": True,
            "equal": same(comparable(rows), comparable(ref)), "checkpoint": str(latest_checkpoint(env.root / name))}


def server_gone_in_eval(env, reference):
    return server_gone(env, reference, phase="evaluate")


def stalled_row(env, reference):
    from ragrl.engines.base import Generation

    class StallOneRow:
        """The real engine; on step 1's first call, row 0 stalls until its deadline (or 30 s)."""

        def __init__(self, engine, trainer):
            self.engine, self.trainer, self.fired = engine, trainer, False

        def __getattr__(self, name):
            return getattr(self.engine, name)

        def generate(self, prompts, params):
            if self.fired or self.trainer.step != 1:
                return self.engine.generate(prompts, params)
            self.fired = True
            params = params if isinstance(params, list) else [params] * len(prompts)
            others = self.engine.generate(prompts[1:], params[1:])
            deadline = params[0].deadline
            time.sleep(30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic())))
            return [[Generation([], [], "timeout" if deadline is not None else "length")]] + others

    import ragrl.train.setup as setup_module
    make = setup_module.engine_for
    holder = {}

    def patch(trainer):
        holder["trainer"] = trainer
    setup_module.engine_for = lambda mcfg, model, tok, **kw: StallOneRow(make(mcfg, model, tok, **kw), holder["trainer"])
    try:
        rows, error, _ = train(env.config(SEARCH_R1, "stall", "rollout.max_episode_s=2"), patch=patch)
    finally:
        setup_module.engine_for = make
    step1 = rows[1] if len(rows) > 1 else {}
    return {"did": f"the stalled row ended as truncated after the 2 s bound (timeouts {step1.get('timeouts', 0):.2f} "
                   f"of step 1's trajectories; its rollout took {step1.get('time/rollout_s', float('nan')):.1f} s "
                   "against a 30 s stall); the others went on",
            "survived": error is None and len(rows) == 4 and step1.get("time/rollout_s", 99) < 15, "steps_lost": 0,
            "steps_redone": 0, "transient": False, "equal": None}


def damaged_checkpoint(env, reference, how="truncate"):
    from ragrl.train.checkpoint import latest_checkpoint

    name = f"ckpt_{how}"
    first = train(env.config(SEARCH_R1, name, "steps=3"))[0]
    newest = latest_checkpoint(env.root / name)
    target = newest / ("optimizer.pt" if how == "truncate" else "adapter_model.safetensors")
    data = bytearray(target.read_bytes())
    if how == "truncate":
        target.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    logs = _Capture()
    rows, error, _ = train(env.config(SEARCH_R1, name), resume=True)
    logs.close()
    warned = next((m for m in logs.messages if "is damaged" in m), "no warning")
    fallback = re.search(r"resuming from step_(\d+)", warned)
    redone = len(first) - int(fallback.group(1)) if fallback else None
    return {"did": f"{warned.split(' is damaged ')[-1][:120]}: fell back; --resume finished {len(rows)} of 4 steps",
            "survived": error is None and len(rows) == 4, "steps_lost": 0, "steps_redone": redone, "transient": True,
            "equal": same(comparable(rows), comparable(reference)), "logged_before": len(first)}


def corrupted_checkpoint(env, reference):
    return damaged_checkpoint(env, reference, how="corrupt")


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("ragrl").addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())

    def close(self):
        logging.getLogger("ragrl").removeHandler(self)


FAULTS = {"nan_gradient": nan_gradient, "collapse": collapse, "server_restart": server_restart,
          "server_gone": server_gone, "server_gone_in_eval": server_gone_in_eval, "stalled_row": stalled_row,
          "truncated_checkpoint": damaged_checkpoint, "corrupted_checkpoint": corrupted_checkpoint}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset of: " + ", ".join(FAULTS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "faults.json")
    args = ap.parse_args()
    wanted = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in wanted if f not in FAULTS]
    if unknown:
        ap.error(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results = []
    with tempfile.TemporaryDirectory(prefix="ragrl_faults_") as tmp:
        env = Env(Path(tmp))
        reference = comparable(train(env.config(SEARCH_R1, "reference"))[0])
        for name in wanted:
            t0 = time.perf_counter()
            out = FAULTS[name](env, reference)
            out.pop("_reference", None)
            results.append({"fault": name, **out, "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{name:<22} survived={out['survived']!s:<5} lost={out['steps_lost']!s:<2} "
                  f"redone={out['steps_redone']!s:<2} "
                  f"equal={out['equal']!s:<5} {out['did']}", flush=True)
        for server in env.servers:
            if server.thread.is_alive():
                server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "faults", "machine": platform.processor() or platform.machine(),
                                    "date": time.strftime("%Y-%m-%d"), "results": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
