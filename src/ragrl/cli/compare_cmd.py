"""`ragrl compare`: trained runs, their starts and the baselines in one table (ragrl.compare)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        runs: list[Path] = typer.Argument(None, help="training run folders (each one's config.yaml says how it is evaluated)"),
        data: list[str] = typer.Option([], "--data", help="question file (JSONL[.gz], kit: path or demo name); repeat for several"),
        n: Optional[int] = typer.Option(None, "--n", min=1, help="the first N questions of each --data file \\[default: all]"),
        index: Optional[str] = typer.Option(None, "--index", help="the comparison's index folder \\[default: the one the runs searched, else BM25 over --corpus]"),
        corpus: Optional[str] = typer.Option(None, "--corpus", help="the comparison's corpus \\[default: the one the runs searched]"),
        reader: str = typer.Option("smollm2-135m-instruct", "--reader", help="the model of direct, naive_rag and a retriever run's reader"),
        topk: int = typer.Option(3, "--topk", min=1, help="naive_rag's passages (a run keeps its own rollout.topk)"),
        batch_size: int = typer.Option(32, "--batch-size", min=1),
        seed: int = typer.Option(0, "--seed"),
        no_start: bool = typer.Option(False, "--no-start", help="leave out each run's start (no paired difference against it)"),
        skip_start: list[str] = typer.Option([], "--skip-start", help="leave out this run's start only (its folder name; repeatable)"),
        allow_mismatch: bool = typer.Option(False, "--allow-mismatch", help="compare runs trained on another corpus or index (the table names each row's index)"),
        train: list[str] = typer.Option([], "--train", help="train this recipe's variant first into OUT/runs/<recipe> (repeat; resumed, or skipped when finished)"),
        minutes: float = typer.Option(0.0, "--minutes", min=0.0, help="with --train: a safety bound on each recipe's RL wall "
                                                                      "time; RL trains the recipe's fixed steps, and a run the "
                                                                      "bound cuts says so loudly (0: no bound)"),
        variant: Optional[str] = typer.Option("tiny", "--variant", help="with --train: the recipes' variant"),
        set_: list[str] = typer.Option([], "--set", help="with --train: an override for every recipe, key=value (repeatable)"),
        device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N"),
        dtype: str = typer.Option("float32", "--dtype", help="the LM weights' precision while generating: float32, "
                                                             "or bfloat16 (faster where the hardware computes it "
                                                             "natively; greedy answers can differ from float32's)"),
        out: Path = typer.Option(Path("runs/compare"), "--out"),
        cache_from: list[Path] = typer.Option([], "--cache-from", help="an earlier comparison's folder: each system it "
                                                                     "evaluated with the same key (questions, corpus, "
                                                                     "index, weights, settings) is reused, not run "
                                                                     "again (repeatable)"),
    ) -> None:
        """Evaluate every run as it was trained, its start (where its RL began, through earlier stages),
        direct and naive_rag on the same questions, corpus, index and reader; write compare.md/json,
        f1_vs_searches.png and a page for `ragrl view OUT`."""
        from ragrl.compare.comparison import run_comparison  # late: keeps `ragrl --help` instant
        from ragrl.errors import ConfigError  # late: keeps `ragrl --help` instant
        from ragrl.policy.lm_model import resolve_device  # late: keeps `ragrl --help` instant

        if not data:
            raise typer.BadParameter("name the questions to compare on, e.g. --data kit:eval/hotpotqa_dev.jsonl.gz",
                                     param_hint="--data")
        if not runs and not train:
            raise typer.BadParameter("name run folders, or recipes to train with --train", param_hint="RUNS")
        try:
            torch_device = resolve_device(device, setting="--device")
        except ConfigError as error:
            raise typer.BadParameter(str(error), param_hint="--device")
        run_dirs = list(runs or [])
        if train:
            from ragrl.compare.train_runs import train_recipes  # late: keeps `ragrl --help` instant

            run_dirs += train_recipes(train, out / "runs", minutes=minutes, variant=variant, overrides=set_)
        with Progress(transient=True) as bar:
            tasks: dict[str, int] = {}

            def progress(system: str, done: int, total: int) -> None:
                if system not in tasks:
                    tasks[system] = bar.add_task(system, total=total)
                bar.update(tasks[system], completed=done)

            run_comparison(run_dirs, data=data, out=out, n=n, index=index, corpus=corpus, reader=reader, topk=topk,
                           batch_size=batch_size, seed=seed, allow_mismatch=allow_mismatch, with_start=not no_start,
                           skip_start=frozenset(skip_start),
                           device=torch_device, progress=progress, cache_from=tuple(cache_from), dtype=dtype)
        typer.echo((out / "compare.md").read_text().split("\n## Against")[0])
        typer.echo(f"table: {out / 'compare.md'}; plot: {out / 'f1_vs_searches.png'}; every answer: ragrl view {out}")
