"""`ragrl eval`: run an agent and the baselines on the same questions; write a report."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_(
        agent: str = typer.Option("search_r1", "--agent", help="protocol: search_r1, rag_r1, r1_searcher, smartrag"),
        model: str = typer.Option("smollm2-135m-instruct", "--model", help="registry name, HF id or local path"),
        adapter: Optional[Path] = typer.Option(None, "--adapter", help="a LoRA adapter dir (e.g. a run's final_adapter)"),
        index: Optional[str] = typer.Option(None, "--index", help="index dir or http:// URL (default: BM25 of the demo corpus)"),
        data: str = typer.Option("demo-eval", "--data", help="question file (JSONL[.gz]) or demo-eval"),
        n: int = typer.Option(200, "--n", min=1, help="number of questions (first n)"),
        systems: str = typer.Option("direct,naive_rag,agent", "--systems", help="comma list of direct,naive_rag,agent"),
        topk: int = typer.Option(3, "--topk", min=1),
        max_turns: int = typer.Option(4, "--max-turns", min=1),
        batch_size: int = typer.Option(32, "--batch-size", min=1),
        seed: int = typer.Option(0, "--seed"),
        device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU if there is one), cpu, cuda or cuda:N"),
        out: Path = typer.Option(Path("runs/eval"), "--out"),
    ) -> None:
        """Evaluate with greedy decoding; writes report.md/json, trajectories_*.jsonl and a bar chart."""
        from dataclasses import replace

        from ragrl.datasets import load_questions
        from ragrl.eval.harness import SYSTEMS, EvalConfig, evaluate
        from ragrl.eval.plots import bar_chart
        from ragrl.eval.report import format_table, write_report
        from ragrl.eval.stats import summarize
        from ragrl.models.policy import load_policy
        from ragrl.retrieval.inprocess import make_retriever
        from ragrl.rollout.hf_engine import HFEngine
        from ragrl.train.config import TrainConfig
        from ragrl.train.trainer import default_retriever

        chosen = [s.strip() for s in systems.split(",") if s.strip()]
        bad = [s for s in chosen if s not in SYSTEMS]
        if bad or not chosen:
            raise typer.BadParameter(f"unknown systems {bad}; choose from {', '.join(SYSTEMS)}", param_hint="--systems")
        from ragrl.errors import ConfigError
        from ragrl.train.policy import resolve_device

        try:   # before any work
            torch_device = resolve_device(device, setting="--device")
        except ConfigError as error:
            raise typer.BadParameter(str(error), param_hint="--device")
        samples = load_questions(data, limit=n)
        retriever = make_retriever(index) if index else default_retriever(TrainConfig())
        lm, tok = load_policy(model, device=torch_device)
        if adapter is not None:
            from peft import PeftModel

            lm = PeftModel.from_pretrained(lm, str(adapter))
        engine = HFEngine(lm, tok, max_batch_size=batch_size)
        cfg = EvalConfig(agent=agent, systems=chosen, n=len(samples), batch_size=batch_size, topk=topk, seed=seed)
        cfg.rollout = replace(cfg.rollout, topk=topk, max_turns=max_turns)
        from rich.progress import Progress

        with Progress() as bar:
            tasks: dict[str, int] = {}

            def progress(system: str, done: int, total: int) -> None:
                if system not in tasks:
                    tasks[system] = bar.add_task(system, total=total)
                bar.update(tasks[system], completed=done)

            res = evaluate(engine, retriever, samples, cfg, progress=progress)
        results = {s: {"trajectories": r["trajectories"],
                       "summary": summarize(r["trajectories"], r["wall_s"], per_question=True)} for s, r in res.items()}
        baseline = "naive_rag" if "naive_rag" in results and len(results) > 1 else None
        write_report(out, results, {"model": model, "adapter": str(adapter) if adapter else None, "agent": agent,
                                    "index": index or "bm25(demo corpus)", "data_file": data, "n": len(samples),
                                    "seed": seed, "decoding": "greedy"}, baseline=baseline)
        bar_chart(results, out / "report.png")
        typer.echo(format_table(results))
        typer.echo(f"report: {out / 'report.md'}")
