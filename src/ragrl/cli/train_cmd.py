"""`ragrl train`, `ragrl sft` and `ragrl quickstart`: thin layers over ragrl.train.

The library is imported inside each command, not at the top: it loads torch and transformers
(~8 s), which `ragrl --help` and a mistyped command should not wait for."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ragrl.cli.console import narrate


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        recipe: Optional[str] = typer.Argument(None, help="recipe file or bundled name, e.g. search_r1_grpo"),
        key: Optional[str] = typer.Argument(None, show_default=False,
                                            help="with --explain: one setting (algo.estimator) or a section "
                                                 "(algo) instead of every setting"),
        list_: bool = typer.Option(False, "--list", help="list the shipped recipes, their methods and variants"),
        variant: Optional[str] = typer.Option(None, "--variant", "-v", help="recipe variant, e.g. tiny"),
        set_: list[str] = typer.Option([], "--set", help="override: key.sub=value (repeatable)"),
        resume: bool = typer.Option(False, "--resume", help="continue from <out_dir>/checkpoints/latest"),
        check: bool = typer.Option(False, "--check", help="resolve and validate everything (config, data, index, "
                                                          "model, device), then exit without training"),
        minutes: float = typer.Option(0.0, "--minutes", min=0.0,
                                      help="wall-time bound of the RL steps: no step starts that would end past it "
                                           "(at the mean step time so far); the run then checkpoints and writes its "
                                           "final adapter as at its last step (0: no bound, the recipe's steps)"),
        explain: bool = typer.Option(False, "--explain",
                                     help="print each setting of this recipe (with --variant and --set): its value, "
                                          "default, allowed values and help, then exit (nothing is loaded or "
                                          "trained). `ragrl train RECIPE --explain KEY`: one setting "
                                          "(algo.estimator) or a section (algo); no KEY (or all): every setting"),
    ) -> None:
        """Train an agent with RL (optionally after an SFT warm start, as the recipe says)."""
        from ragrl.train.recipe import load_train_config, recipe_listing, run_recipe  # late: see the module docstring

        if list_:
            for row in recipe_listing():
                variants = ", ".join(row["variants"]) or "-"
                typer.echo(f"{row['recipe']:<20} {row['method']:<12} variants: {variants:<32} {row['paper']}")
            return
        if recipe is None:
            raise typer.BadParameter("name a recipe (ragrl train --list shows them)", param_hint="RECIPE")
        if key is not None and not explain:
            raise typer.BadParameter(f"{key!r}: a second argument is read only with --explain "
                                     f"(ragrl train {recipe} --explain {key})", param_hint="KEY")

        cfg = load_train_config(recipe, set_, variant)
        if explain:   # the config alone: no model, data or index is opened
            from ragrl.config_help import explain as explain_settings, format_explain  # late: see the module docstring
            from ragrl.train.check import all_ranges  # late: see the module docstring

            typer.echo(format_explain(explain_settings(type(cfg), cfg, key, ranges=all_ranges())), nl=False)
            return
        if check:
            from ragrl.train.check import check_everything  # late: keeps `ragrl --help` instant

            for line in check_everything(cfg):
                typer.echo(f"ok  {line}")
            typer.echo(f"{recipe}: the recipe resolves and everything it needs is there (nothing was trained)")
            return
        run_recipe(cfg, resume=resume, time_budget_s=minutes * 60 or None)

    @app.command()
    def sft(
        recipe: str = typer.Argument("search_r1_grpo", help="recipe whose agent/data/sft settings to use"),
        variant: Optional[str] = typer.Option(None, "--variant", "-v"),
        set_: list[str] = typer.Option([], "--set", help="override: key.sub=value (repeatable)"),
        out: Path = typer.Option(Path("runs/sft"), "--out", help="writes <out>/adapter"),
    ) -> None:
        """SFT warm start on synthesised search episodes (train split); writes a LoRA adapter."""
        from ragrl.train.check import check_ranges  # late: keeps `ragrl --help` instant
        from ragrl.train.progress import sft_progress  # late: keeps `ragrl --help` instant
        from ragrl.train.recipe import load_train_config, sft_policy, sft_warm_start  # late: keeps `ragrl --help` instant
        from ragrl.train.setup import default_retriever  # late: keeps `ragrl --help` instant

        cfg = load_train_config(recipe, set_, variant)
        check_ranges(cfg)   # sft.batch_size=0 or sft.lr=0 fails here, before the model loads
        if cfg.sft.steps <= 0:
            raise typer.BadParameter("sft.steps is 0 in this recipe; pass --set sft.steps=N")
        model, tok, _ = sft_policy(cfg)

        with sft_progress(cfg.sft.steps) as progress:   # minutes on a CPU: a bar, or plain lines off a terminal
            res = sft_warm_start(cfg, model, tok, default_retriever(cfg), out, progress=progress)
        typer.echo(f"SFT done: loss {res.losses[0]:.3f} -> {res.losses[-1]:.3f}; adapter in {res.adapter_dir}")

    @app.command()
    def quickstart(
        out: Path = typer.Option(Path("runs/quickstart"), "--out"),
        job: str = typer.Option("retriever", "--job",
                                help="retriever: RL on the query encoder (HARR, full 51k corpus; needs the data kit); "
                                     "agent: SFT + GRPO on the search agent (Search-R1, bundled demo corpus)"),
        set_: list[str] = typer.Option([], "--set", help="override the job's tiny recipe (harr_grpo or search_r1_grpo)"),
        minutes: Optional[float] = typer.Option(None, "--minutes", min=0.0,
                                                help="safety bound on the whole job's wall time: RL trains the job's fixed "
                                                     "steps (the same seed gives the same table on any machine) and starts "
                                                     "no step past this bound; a run it cuts says so loudly \\[default: 45 "
                                                     "for retriever, 60 for agent] (0: no bound)"),
        held_out: Optional[int] = typer.Option(None, "--held-out", min=1,
                                               help="retriever job: only the first N questions of each held-out set "
                                                    "(a short run; default: all)"),
    ) -> None:
        """The main job: index, evaluate, RL, evaluate again on held-out questions, print the before/after table."""
        if job not in ("retriever", "agent"):
            raise typer.BadParameter(f"{job!r} is not one of retriever, agent", param_hint="--job")
        # The job prints one line per stage and its own bars; ragrl's log lines go to the run's train.log,
        # but for HARR's question filter, a stage's result (shown under the RL stage's line).
        narrate("question filter:")
        if job == "retriever":
            from ragrl.quickstart.retriever_job import run_retriever_quickstart  # late: keeps `ragrl --help` instant

            run_retriever_quickstart(str(out), set_, minutes=45.0 if minutes is None else (minutes or None),
                                     held_out_n=held_out)
        else:
            if held_out is not None:
                raise typer.BadParameter("applies to --job retriever only", param_hint="--held-out")
            from ragrl.quickstart.agent_job import run_quickstart  # late: keeps `ragrl --help` instant

            run_quickstart(str(out), set_, minutes=60.0 if minutes is None else (minutes or None))
