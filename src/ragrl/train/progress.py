"""Progress over numbered steps (the SFT warm start's, the RL steps'): a live Rich bar on a terminal,
plain lines at intervals elsewhere; a no-op when disabled (every rank but 0).

Off a terminal (`ragrl train ... > train.out`, nohup, CI) a Rich bar draws nothing until it stops, so
the reporter prints plain lines instead: at the first step, then at most one every
RAGRL_PROGRESS_EVERY_S seconds (default 30; 0: every step), and at the last step (or, if the run
stops early, at close):

    [12:03:41] RL step 40/150 reward 0.412 f1 0.310 searches 1.20 · 3.1 s/step · ~5m 40s left
    [12:04:02] SFT step 60/60 loss 1.234 · 0.4 s/step · done after 24s

They go to stderr, flushed at once, as the console's log records do (ragrl.cli.console): stdout
keeps what a command prints as its result. The bar draws where Rich's console draws (stdout), so
that is the stream checked: a terminal (not TERM=dumb), or Jupyter, gets the bar.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from datetime import timedelta

from rich import get_console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

log = logging.getLogger(__name__)

UNKNOWN = "-:--:--"
EVERY_ENV = "RAGRL_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 30.0


def progress_every_s() -> float:
    """Seconds between two plain progress lines: RAGRL_PROGRESS_EVERY_S, else 30 (a value that is
    not a number of seconds, >= 0, is named in a warning and the default used)."""
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return DEFAULT_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value < 0:
        log.warning("%s=%r is not a number of seconds (>= 0); printing progress every %.0f s",
                    EVERY_ENV, raw, DEFAULT_EVERY_S)
        return DEFAULT_EVERY_S
    return value


def live_display() -> bool:
    """Whether a Rich bar can draw: Rich's console (stdout) is a terminal other than TERM=dumb, or Jupyter."""
    console = get_console()
    return console.is_jupyter or (console.is_terminal and not console.is_dumb_terminal)


def duration(seconds: float) -> str:
    """A duration for a progress line: '45s', '5m 40s', '2h 05m'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


class StepProgress:
    """One stage's progress over its steps (`advance(info)` after each): a Rich bar with the step,
    `info`, the time elapsed and the expected time left on a terminal, plain lines on stderr
    elsewhere (see the module docstring); a no-op when disabled. `live` forces one or the other.

    The time left is the run's expected end, not the bound: at the mean step time so far, the steps
    left to `total`, or with a time budget the steps that still fit in it (the trainer starts no step
    that would end past the budget, at its mean step time), whichever is fewer. With a budget the
    bar's total is the budget (seconds) and it fills with the share of the expected run done (so it
    fills with time when the budget is what ends the run); the count shows the step and the steps
    expected ("step 12/~40")."""

    def __init__(self, stage: str, total: int, start: int = 0, *, enabled: bool = True,
                 time_budget_s: float | None = None, label: str | None = None, transient: bool = False,
                 live: bool | None = None):
        self.stage, self.p, self.budget, self.step, self.t0 = stage, None, time_budget_s, start, time.perf_counter()
        self.total, self.ends = total, []   # perf_counter at the end of each step of this call
        self.plain = enabled and not (live_display() if live is None else live)
        self.every = progress_every_s() if self.plain else math.inf
        self.printed_at: float | None = None   # when the last plain line was printed
        self.pending: str | None = None        # the latest plain line, if not printed yet
        if enabled and not self.plain:
            count = ("step {task.fields[step]}/{task.fields[expected]}" if self.budget
                     else "{task.completed}/{task.total}")
            self.p = Progress(TextColumn(label or stage), BarColumn(bar_width=20), TextColumn(count),
                              TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                              TextColumn("{task.fields[left]} left"), transient=transient)
            self.task = self.p.add_task(stage, total=self.budget or total, completed=0 if self.budget else start,
                                        info="", step=start, expected=f"~{total}" if self.budget else total,
                                        left=UNKNOWN)
            self.p.start()

    def mean_step_s(self) -> float | None:
        """The mean step time; with one step, the time since the start (a filter or the start's
        evaluation make it an overestimate until the second step); None before any step."""
        if not self.ends:
            return None
        k = len(self.ends)
        return (self.ends[-1] - self.ends[0]) / (k - 1) if k > 1 else self.ends[-1] - self.t0

    def expected(self) -> tuple[int, float | None]:
        """(the step the run is expected to end at, the expected seconds left; None before any step)."""
        mean = self.mean_step_s()
        if mean is None:
            return self.total, None
        end, k = self.total, len(self.ends)
        if self.budget is not None and mean > 0:
            before = max(0.0, self.ends[0] - mean - self.t0)   # the filter and the start's evaluation
            end = min(end, max(self.step, self.step - k + int((self.budget - before) // mean)))
        return end, max(0, end - self.step) * mean

    def advance(self, info: str = "") -> None:
        """One step done; `info` is what it measured ("loss 1.234")."""
        self.step += 1
        self.ends.append(time.perf_counter())
        if self.p:
            end, left = self.expected()
            shown = UNKNOWN if left is None else str(timedelta(seconds=round(left)))
            if self.budget:
                elapsed = self.ends[-1] - self.t0
                share = elapsed / (elapsed + left) if left is not None and elapsed + left > 0 else 0.0
                self.p.update(self.task, completed=min(self.budget, share * self.budget), step=self.step,
                              expected=f"~{end}" if end < self.total else end, info=info, left=shown)
            else:
                self.p.update(self.task, advance=1, step=self.step, info=info, left=shown)
        elif self.plain:
            self._line(info)

    def _line(self, info: str) -> None:
        now, (end, left), mean = self.ends[-1], self.expected(), self.mean_step_s()
        count = f"{self.step}/~{end}" if end < self.total else f"{self.step}/{self.total}"
        rate = f"{mean:.1f} s/step" if mean < 100 else f"{mean:.0f} s/step"
        tail = f"done after {duration(now - self.t0)}" if self.step >= end else f"~{duration(left)} left"
        self.pending = " · ".join([" ".join(filter(None, [f"[{time.strftime('%H:%M:%S')}] {self.stage} step",
                                                          count, info])), rate, tail])
        if self.printed_at is None or now - self.printed_at >= self.every or self.step >= end:
            self.printed_at = now
            self._print()

    def _print(self) -> None:
        # sys.stderr as it is now (a test's capture, a redirected stream), flushed: a line is seen at once
        print(self.pending, file=sys.stderr, flush=True)
        self.pending = None

    def close(self) -> None:
        if self.p:
            self.p.stop()
        if self.pending is not None:   # the last step, when the run stopped before `total`
            self._print()


class TrainProgress(StepProgress):
    """The RL steps' progress: each step's reward (and an agent's F1 and searches, or a retriever's
    evidence recall), shown as "train" on the bar and "RL" in a plain line."""

    def __init__(self, enabled: bool, total: int, start: int, time_budget_s: float | None = None,
                 live: bool | None = None):
        super().__init__("RL", total, start, enabled=enabled, time_budget_s=time_budget_s, label="train", live=live)

    def update(self, row: dict) -> None:
        info = f"reward {row['reward_mean']:.3f}"
        # a policy that writes (an agent): its answers and searches; one that only retrieves
        # (HARR's query encoder, no generated tokens): the evidence its documents hold
        writes = row.get("response_len", 1) > 0
        shown = (("f1", "f1", 3), ("searches", "searches", 2)) if writes else (("gold_recall", "recall", 3),)
        for key, label, digits in shown:
            if isinstance(row.get(key), (int, float)):
                info += f" {label} {row[key]:.{digits}f}"
        self.advance(info)


@contextlib.contextmanager
def sft_progress(total: int, enabled: bool = True):
    """run_sft's `progress` callback over a StepProgress ("SFT step 10/60 loss 1.234"), closed on exit."""
    bar = StepProgress("SFT", total, enabled=enabled, transient=True)
    try:
        yield lambda step, steps, loss: bar.advance(f"loss {loss:.3f}")
    finally:
        bar.close()
