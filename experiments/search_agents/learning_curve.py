"""Evidence that RL learns: held-out EM/F1 (95% CIs) against RL steps, from the SFT checkpoint.

    .venv/bin/python -m experiments.search_agents.learning_curve --minutes 120 --eval-every 10 --eval-n 100

Runs `search_r1_grpo` (tiny variant unless --variant) starting from an SFT warm start (made
here first, or given with --adapter), evaluates the held-out split at step 0 and every
--eval-every steps, and writes experiments/search_agents/results/learning_curve.json and .png after every
evaluation (a killed run keeps what it measured). Not part of CI: it takes hours on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=120.0, help="RL wall-time budget")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-n", type=int, default=100)
    ap.add_argument("--variant", default="tiny")
    ap.add_argument("--adapter", default=None, help="SFT adapter dir (default: run the recipe's SFT here)")
    ap.add_argument("--out", default=str(RESULTS / "learning_curve"))
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "learning_curve"))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--dev", action="store_true",
                    help="for choosing settings without eval questions: evaluate on the train file's "
                         "100 HotpotQA-train questions (unfiltered, like HotpotQA dev) and train on the rest")
    args = ap.parse_args()
    if args.dev:
        train_file, dev_file = dev_split(Path(args.run_dir))
        args.overrides = [f"data.train={train_file}", f"data.eval={dev_file}", *args.overrides]

    from ragrl.eval.plots import line_plot
    from ragrl.eval.stats import paired_diffs
    from ragrl.policy.lm_model import build_policy
    from ragrl.train.recipe import load_train_config, sft_warm_start
    from ragrl.train.trainer import Trainer
    from ragrl.train.setup import default_retriever

    cfg = load_train_config("search_r1_grpo", [f"out_dir={args.run_dir}", "steps=100000",
                                               f"data.eval_n={args.eval_n}", *args.overrides], args.variant)
    retriever = default_retriever(cfg)
    if args.adapter:
        cfg.model.init_adapter = args.adapter
    model, tok, _ = build_policy(cfg.model)
    t0 = time.perf_counter()
    if not args.adapter:
        sft_warm_start(cfg, model, tok, retriever, Path(args.run_dir) / "sft")
    sft_s = time.perf_counter() - t0
    trainer = Trainer(cfg, retriever=retriever, model_bundle=(model, tok, None))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    curve: list[dict] = []
    train_rows: list[dict] = []

    per_question: dict[int, dict] = {}

    def record(step: int) -> None:
        row = {"step": step, **trainer.evaluate(per_question=True)}
        per_question[step] = row.pop("per_question")
        # Paired bootstrap against the SFT-only start on the same questions: the gain from RL alone.
        diff = paired_diffs(per_question[0], per_question[step]) if step else None
        if diff:
            row.update({f"{k}_vs_step0": diff[k]["diff"] for k in ("em", "f1", "cover_em")})
            row.update({f"{k}_vs_step0_{b}": diff[k][f"ci_{b}"] for k in ("em", "f1", "cover_em") for b in ("lo", "hi")})
            row["f1_vs_step0_p"] = diff["f1"].get("p_value")
        curve.append(row)
        print(json.dumps(row), flush=True)
        data = {"recipe": "search_r1_grpo", "variant": args.variant, "eval_n": args.eval_n,
                "eval_file": cfg.data.eval, "train_file": cfg.data.train, "sft_seconds": sft_s,
                "questions_per_step": cfg.questions_per_step, "group_size": cfg.rollout.n,
                "curve": curve, "train": train_rows,
                "per_question": {str(k): v for k, v in per_question.items()},
                "note": "eval = greedy decoding on held-out questions; CIs are 95% percentile bootstrap; "
                        "*_vs_step0 = paired bootstrap difference against the SFT-only start"}
        out.with_suffix(".json").write_text(json.dumps(data, indent=1))
        line_plot(curve, ["f1", "em", "cover_em", "searches"], out.with_suffix(".png"))

    record(0)
    deadline = time.perf_counter() + args.minutes * 60
    first = True
    while time.perf_counter() < deadline:
        trainer.cfg.steps = trainer.step + args.eval_every
        rows = trainer.train(resume=not first, progress=False,
                             time_budget_s=deadline - time.perf_counter())
        first = False
        train_rows += [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
        record(trainer.step)


def dev_split(run_dir: Path) -> tuple[Path, Path]:
    """Split the bundled train file into (rest, dev): dev = its HotpotQA-train questions that
    came with their contexts (not filtered by BM25 reachability, so they are as hard as the
    held-out HotpotQA dev questions). Settings are chosen on dev; eval questions never take part."""
    from ragrl.datasets import load_questions

    rows = load_questions("demo-train")
    dev = [r for r in rows if r.get("dataset") == "hotpotqa" and r.get("gold_source") is None]
    rest = [r for r in rows if not (r.get("dataset") == "hotpotqa" and r.get("gold_source") is None)]
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = run_dir / "train_rest.jsonl", run_dir / "dev.jsonl"
    for path, part in zip(paths, (rest, dev)):
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
    return paths


if __name__ == "__main__":
    main()
