"""The training progress bar (Rich): a no-op when disabled."""
from __future__ import annotations

import time
from datetime import timedelta

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

UNKNOWN = "-:--:--"


class TrainProgress:
    """A Rich progress bar over the RL steps with the latest reward (and an agent's F1 and searches,
    or a retriever's evidence recall), the time elapsed and the expected time left (a no-op when disabled).

    The time left is the run's expected end, not the bound: at the mean step time so far, the steps
    left to `total`, or with a time budget the steps that still fit in it (the trainer starts no step
    that would end past the budget, at its mean step time), whichever is fewer. With a budget the
    bar's total is the budget (seconds) and it fills with the share of the expected run done (so it
    fills with time when the budget is what ends the run); the count shows the step and the steps
    expected ("step 12/~40")."""

    def __init__(self, enabled: bool, total: int, start: int, time_budget_s: float | None = None):
        self.p, self.budget, self.step, self.t0 = None, time_budget_s, start, time.perf_counter()
        self.total, self.ends = total, []   # perf_counter at the end of each step of this call
        if enabled:
            count = ("step {task.fields[step]}/{task.fields[expected]}" if self.budget
                     else "{task.completed}/{task.total}")
            self.p = Progress(TextColumn("train"), BarColumn(bar_width=20), TextColumn(count),
                              TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                              TextColumn("{task.fields[left]} left"))
            self.task = self.p.add_task("train", total=self.budget or total, completed=0 if self.budget else start,
                                        info="", step=start, expected=f"~{total}" if self.budget else total,
                                        left=UNKNOWN)
            self.p.start()

    def expected(self) -> tuple[int, float | None]:
        """(the step the run is expected to end at, the expected seconds left; None before any step)."""
        if not self.ends:
            return self.total, None
        now, k = self.ends[-1], len(self.ends)
        # the mean step time; with one step, the time since the start (a filter or the start's
        # evaluation make it an overestimate until the second step)
        mean = (now - self.ends[0]) / (k - 1) if k > 1 else now - self.t0
        end = self.total
        if self.budget is not None and mean > 0:
            before = max(0.0, self.ends[0] - mean - self.t0)   # the filter and the start's evaluation
            end = min(end, max(self.step, self.step - k + int((self.budget - before) // mean)))
        return end, max(0, end - self.step) * mean

    def update(self, row: dict) -> None:
        self.step += 1
        self.ends.append(time.perf_counter())
        if self.p:
            info = f"reward {row['reward_mean']:.3f}"
            # a policy that writes (an agent): its answers and searches; one that only retrieves
            # (HARR's query encoder, no generated tokens): the evidence its documents hold
            writes = row.get("response_len", 1) > 0
            shown = (("f1", "f1", 3), ("searches", "searches", 2)) if writes else (("gold_recall", "recall", 3),)
            for key, label, digits in shown:
                if isinstance(row.get(key), (int, float)):
                    info += f" {label} {row[key]:.{digits}f}"
            end, left = self.expected()
            shown = UNKNOWN if left is None else str(timedelta(seconds=round(left)))
            if self.budget:
                elapsed = self.ends[-1] - self.t0
                share = elapsed / (elapsed + left) if left is not None and elapsed + left > 0 else 0.0
                self.p.update(self.task, completed=min(self.budget, share * self.budget), step=self.step,
                              expected=f"~{end}" if end < self.total else end, info=info, left=shown)
            else:
                self.p.update(self.task, advance=1, step=self.step, info=info, left=shown)

    def close(self) -> None:
        if self.p:
            self.p.stop()
