"""HARR on a CPU: does RL on the query encoder improve held-out retrieval over the full corpus?

    .venv/bin/python -m experiments.harr.harr_curve --minutes 20     # -> experiments/harr/results/harr_curve.{json,png}

Trains `harr_grpo` (tiny unless --variant; overrides with --set) on its train split (tiny:
multihop-train) for --minutes, checkpointing the encoder every --every steps and evaluating the
held-apart split (tiny: multihop-dev) at the same steps; the encoder kept is the one best there.
Then, for the base encoder and every checkpoint: evidence recall@3 / answer@3 on the held-out
eval sets (HotpotQA dev 358, MuSiQue dev 100, 2Wiki dev 345 with the kit's heuristic evidence)
over the dense index of the full 51k-passage corpus. The held-out curve is reported, never used
to choose. Finally the kept encoder against the base with paired differences, per set and
pooled over all held-out questions (the primary endpoint), and
naive RAG with a frozen SmolLM2 over each encoder's top 3 (answers re-generated only where the
top 3 changed: greedy decoding makes the rest identical). JSON and PNG are rewritten as it goes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0, help="training wall-time budget")
    ap.add_argument("--every", type=int, default=50, help="checkpoint + held-apart evaluation interval (steps)")
    ap.add_argument("--variant", default="tiny")
    ap.add_argument("--name", default="harr_curve")
    ap.add_argument("--downstream", action="store_true", help="also naive RAG EM/F1 with a frozen SmolLM2")
    ap.add_argument("--downstream-n", type=int, default=None,
                    help="naive RAG on the first N questions of each held-out set (default: all)")
    ap.add_argument("--eval-only", action="store_true", help="re-evaluate the run runs/NAME without training")
    ap.add_argument("--run", help="with --eval-only: the run to evaluate (default runs/NAME), e.g. a 1-hop run "
                                  "evaluated with --set retriever.hops=2")
    ap.add_argument("--no-curve", action="store_true", help="only the base and the kept encoder, no checkpoint curve")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    from ragrl.eval.plots import line_plot
    from ragrl.eval.retrieval import by_question_kind, compare_retrievers, load_held_out, paired_rows, retrieval_eval
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.retrieval.stochastic import StochasticRetriever
    from ragrl.train.averaging import WeightAverage
    from ragrl.train.checkpoint import load_checkpoint
    from ragrl.train.recipe import load_train_config
    from ragrl.train.run_dir import read_metrics
    from ragrl.methods.harr.setup import load_dense_backend
    from ragrl.train.trainer import Trainer

    out = RESULTS / args.name
    run_dir = ROOT / "runs" / (args.run or args.name)
    cfg = load_train_config("harr_grpo", [f"out_dir={run_dir}", "steps=100000", f"save_every={args.every}",
                                          f"eval_every={args.every}", "keep_best=recall", "keep_last=1000",
                                          *args.overrides], args.variant)
    tests = load_held_out()
    rc, k = cfg.retriever, cfg.rollout.topk
    if args.eval_only:
        dense = load_dense_backend(cfg)
        source = RESULTS / f"{args.run or args.name}.json"
        result = {**json.loads(source.read_text()), "curve": [], "evaluated_with": args.overrides}
    else:
        trainer = Trainer(cfg)
        dense = trainer.setup.extras["sampler"].index
        t0 = time.perf_counter()
        rows = trainer.train(progress=True, time_budget_s=args.minutes * 60)
        train_s = time.perf_counter() - t0
        result = {"settings": {"recipe": "harr_grpo", "variant": args.variant, "overrides": args.overrides,
                               "corpus_passages": len(dense), "train": cfg.data.train, "dev": cfg.data.eval,
                               "steps": len(rows), "train_minutes": train_s / 60,
                               "steps_per_minute": len(rows) / (train_s / 60),
                               # sampled retrieval episodes (questions x samples) per second of training,
                               # the question filter's pass and held-apart evaluations included
                               "episodes_per_second": len(rows) * cfg.questions_per_step * cfg.rollout.n / train_s,
                               "step_seconds_mean": sum(r["time/step_s"] for r in rows) / len(rows),
                               "rollout_seconds_mean": sum(r["time/rollout_s"] for r in rows) / len(rows),
                               "update_seconds_mean": sum(r["time/update_s"] for r in rows) / len(rows)},
                  "curve": []}

    def searches(encoder) -> dict:
        """The systems one encoder gives: top k, or with hops > 1 the hops with HARR's history and,
        to measure what the history adds, the same number of passages without it (top k·hops)."""
        hist = StochasticRetriever(dense, encoder, history=rc.history, history_words=rc.history_words)
        if rc.hops == 1:
            return {"": hist.search}
        flat = StochasticRetriever(dense, encoder, history=False)
        return {"": lambda qs, kk: hist.search_hops(qs, kk, rc.hops),
                "no_history/": lambda qs, kk: flat.search_hops(qs, kk, rc.hops)}

    def evaluate(encoder) -> dict:
        return {f"{prefix}{name}/{m}": v for prefix, fn in searches(encoder).items() for name, qs in tests.items()
                for m, v in retrieval_eval(fn, qs, k).items() if m != "per_question"}

    base_encoder = QueryEncoder(rc.encoder)   # the index's encoder, untrained
    if not args.no_curve:
        result["curve"].append({"step": 0, **evaluate(base_encoder)})
    metrics = {r["step"] + 1: r for r in read_metrics(run_dir) if "eval/recall" in r}
    # the checkpoints hold the trained module as it was (LoRA layers included) and, with ema_decay,
    # the weight average: what was evaluated on the held-apart split and exported
    encoder = QueryEncoder(rc.encoder, lora=rc.lora, lora_r=rc.lora_r, lora_alpha=rc.lora_alpha)
    average = WeightAverage(encoder, cfg.ema_decay) if cfg.ema_decay else None
    for ck in [] if args.no_curve else sorted((run_dir / "checkpoints").glob("step_*")):
        load_checkpoint(ck, model=encoder, restore_rng=False,
                        extra_modules={"weight_average": average} if average else None)
        step = int(ck.name.split("_")[1])
        with average.swapped_in(encoder) if average else contextlib.nullcontext():
            point = {"step": step, **evaluate(encoder)}
        if step in metrics:
            point.update({k_: metrics[step][k_] for k_ in ("eval/recall", "eval/recall_lo", "eval/recall_hi")})
        result["curve"].append(point)
        (out.parent / f"{out.name}.json").write_text(json.dumps(result, indent=1))
    best = json.loads((run_dir / "best.json").read_text())
    kept = QueryEncoder(str(run_dir / "best_encoder"))
    result["kept"] = best
    base, rl = searches(base_encoder), searches(kept)
    systems = {"base": base[""], "rl": rl[""]}
    if rc.hops > 1:
        systems.update({"base_no_history": base["no_history/"], "rl_no_history": rl["no_history/"]})
    result["final"] = {}
    for name, qs in tests.items():
        comp = compare_retrievers(systems, qs, k, baseline="base")
        if rc.hops > 1:   # what the history adds to each encoder
            for enc in ("base", "rl"):
                comp[f"history_effect_{enc}"] = paired_rows(comp[f"{enc}_no_history"]["per_question"],
                                                            comp[enc]["per_question"])[0]
        comp["recall_by_kind"] = by_question_kind(qs, comp["base"]["per_question"], comp["rl"]["per_question"])
        for s_ in systems:
            comp[s_].pop("per_question")
        result["final"][name] = comp
    every = [q for qs in tests.values() for q in qs]   # the primary endpoint: all held-out questions, pooled
    pooled = compare_retrievers({"base": systems["base"], "rl": systems["rl"]}, every, k, baseline="base")
    result["pooled"] = {k_: pooled[k_] for k_ in ("paired", "changed")}
    if args.downstream:   # RL against base; with hops, also what the history adds to each encoder
        pairs = [("base", "rl")] + ([("base_no_history", "base"), ("rl_no_history", "rl")] if rc.hops > 1 else [])
        result["downstream"] = downstream(cfg, tests, systems, pairs, args.downstream_n)
    (out.parent / f"{out.name}.json").write_text(json.dumps(result, indent=1))
    if not args.run or args.run == args.name:   # the run's own training curve (not another run's again)
        line_plot(read_metrics(run_dir), ["reward_mean", "eval/recall"], out.parent / f"{args.name}_train.png",
                  smooth=0.0)
    if result["curve"]:
        line_plot(result["curve"], [f"{n}/recall" for n in tests] + [f"{n}/answer_at_k" for n in tests],
                  out.parent / f"{out.name}.png", cols=2)
    print(json.dumps({"kept": best, "final": {n: r["paired"] for n, r in result["final"].items()},
                      "pooled": result["pooled"]["paired"], "downstream": result.get("downstream")}, indent=1))


def downstream(cfg, tests, systems: dict, pairs: list[tuple[str, str]], n: int | None) -> dict:
    """Naive RAG EM/F1 of a frozen SmolLM2 over each system's passages (all of them: k, or k·hops),
    on the first `n` questions of each set (all when None); paired differences (b − a) for each
    (a, b) in `pairs`. Answers are re-generated only where a system's passages differ from the
    first system's (greedy decoding makes the rest identical)."""
    from dataclasses import replace

    from ragrl.eval.retrieval import paired_rows
    from ragrl.eval.stats import bootstrap_ci
    from ragrl.quickstart.retriever_job import naive_rag_answers, qa_scores
    from ragrl.engines.hf import HFEngine
    from ragrl.policy.lm_model import build_policy

    lm, tok, _ = build_policy(replace(cfg.model, lora=False, init_adapter=None))
    engine = HFEngine(lm, tok, max_batch_size=32)
    out = {}
    for name, qs in tests.items():
        qs = qs[:n] if n else qs
        ids, answers, first = [str(q["id"]) for q in qs], {}, next(iter(systems))
        for system, search in systems.items():
            answers[system] = naive_rag_answers(engine, search, qs, cfg, reuse=answers.get(first))
        scores = {system: qa_scores(a, ids) for system, a in answers.items()}
        res = out[name] = {"n": len(qs), "regenerated": {s_: sum(answers[s_][i][0] != answers[first][i][0] for i in ids)
                                                         for s_ in systems if s_ != first}}
        for system in systems:
            res[system] = {key: [100 * v for v in bootstrap_ci([scores[system][i][key] for i in ids])]
                           for key in ("em", "f1")}
        for a, b in pairs:
            res[f"{b} - {a}"] = paired_rows(scores[a], scores[b], keys=("em", "f1"))[0]
    return out


if __name__ == "__main__":
    main()
