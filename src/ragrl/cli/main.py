"""`ragrl` command line: one Typer app; each concern registers its thin commands."""
from __future__ import annotations

import signal
import sys

import typer

from ragrl.cli.console import setup_console
from ragrl.errors import RagrlError, RankLost

app = typer.Typer(
    name="ragrl",
    help="Train retrieval-augmented LLM agents with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Each module adds its commands to `app` (kept in separate files so each reads top to bottom).
from ragrl.cli import compare_cmd, data_cmd, eval_cmd, index_cmd, serve_cmd, train_cmd  # noqa: E402

for _mod in (index_cmd, serve_cmd, eval_cmd, train_cmd, compare_cmd, data_cmd):
    _mod.register(app)


@app.callback()
def _console(verbose: bool = typer.Option(False, "--verbose", "-v",
                                          help="show the libraries' log lines (INFO), progress bars and warnings too; "
                                               "give it before the command: ragrl -v train ...")) -> None:
    """Train retrieval-augmented LLM agents with reinforcement learning."""
    setup_console(verbose)   # what reaches the terminal: see ragrl.cli.console


_stop = {"sigterm": False}


def _raise_on_sigterm(signum, frame) -> None:
    """SIGTERM (`kill`, a job scheduler's stop) is raised like Ctrl-C, so that a run's `finally` blocks
    run: its stage time is recorded, its trackers and retrieval server close."""
    _stop["sigterm"] = True
    raise KeyboardInterrupt


def _interrupted() -> None:
    if _stop["sigterm"]:
        typer.secho("stopped (SIGTERM): what was written stays; `--resume` continues a training run", fg="red", err=True)
        sys.exit(143)   # 128 + 15, as a shell reports a process that SIGTERM ended
    typer.secho("aborted", fg="red", err=True)
    sys.exit(130)


def main() -> None:
    """Entry point that turns user-fixable errors into one clear line (exit code 2; a run that stopped
    on a fault exits with its own code: 75 retrieval outage, 3 collapse, 74 a full disk, 69 a rank lost,
    see ragrl.errors; Ctrl-C 130, SIGTERM 143)."""
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        code = app(standalone_mode=False)
        # Typer turns Ctrl-C (and so SIGTERM) into Exit(130) and, outside standalone mode, returns an
        # Exit's code instead of raising it: a stopped run must not exit 0.
        if code == 130:
            _interrupted()
        if isinstance(code, int) and code:
            sys.exit(code)
    except RankLost as e:
        from ragrl.train.rank_watch import exit_without_teardown  # late: keeps `ragrl --help` instant
        typer.secho(f"error: {e}", fg="red", err=True)
        exit_without_teardown(e.exit_code)   # the run's files are closed by now
    except RagrlError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        sys.exit(getattr(e, "exit_code", 2))
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors
        # typer >= 0.20 raises its own vendored copy (typer._click.exceptions), which is not a
        # subclass of click's classes: recognise both by the base class name.
        if any(cls.__name__ == "ClickException" for cls in type(e).__mro__):
            e.show()
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
