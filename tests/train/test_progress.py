"""The training bar's time left is the run's expected end (steps left at the mean step time, or the
steps that still fit in the time budget), not what is left of the bound. Off a terminal the same
progress comes as plain lines on stderr: at the first step, then at most one per interval
(RAGRL_PROGRESS_EVERY_S), and at the last step or at close."""
import io
import re

import pytest
from rich.console import Console

from ragrl.train import progress
from ragrl.train.progress import TrainProgress

ROW = {"reward_mean": 0.5, "gold_recall": 0.25, "f1": 0.0, "response_len": 0.0}   # a retriever policy's row


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    return now


def steps(bar: TrainProgress, clock, *ends: float) -> None:
    for t in ends:
        clock[0] = t
        bar.update(ROW)


def test_under_a_budget_the_steps_that_fit_end_the_run(clock):
    # 10 s of filter and start evaluation, then 2 s steps: (100 - 10) / 2 = 45 steps fit (the trainer
    # stops before step 46: 10 + 2 * 46 > 100), fewer than the recipe's 150
    bar = TrainProgress(False, 150, 0, time_budget_s=100.0)
    steps(bar, clock, 12.0, 14.0, 16.0)
    assert bar.expected() == (45, 42 * 2.0)


def test_steps_that_end_before_the_budget_give_the_time_left_not_the_bound(clock):
    bar = TrainProgress(True, 20, 0, time_budget_s=100.0, live=True)
    steps(bar, clock, 12.0, 14.0, 16.0)
    task = bar.p.tasks[0]
    bar.close()
    assert bar.expected() == (20, 17 * 2.0)                       # the bound would say 84 s
    assert task.fields["left"] == "0:00:34" and task.fields["expected"] == 20 and task.fields["step"] == 3
    assert task.total == 100.0 and task.completed == pytest.approx(100.0 * 16 / (16 + 34))


def test_without_a_budget_the_bar_counts_steps(clock):
    bar = TrainProgress(True, 10, 4, live=True)
    assert bar.p.tasks[0].fields["left"] == progress.UNKNOWN       # nothing to go on before a step
    steps(bar, clock, 5.0, 8.0)
    task = bar.p.tasks[0]
    bar.close()
    assert task.completed == 6 and task.total == 10 and task.fields["left"] == "0:00:12"   # 4 steps of 3 s
    assert "recall 0.250" in task.fields["info"]


def test_an_agent_shows_its_f1_and_searches(clock):
    bar = TrainProgress(True, 10, 0, live=True)
    steps(bar, clock, 1.0)
    bar.update({"reward_mean": 0.5, "f1": 0.25, "searches": 1.5, "gold_recall": 0.1, "response_len": 40.0})
    info = bar.p.tasks[0].fields["info"]
    bar.close()
    assert info == "reward 0.500 f1 0.250 searches 1.50"


# ---------------------------------------------------------------- off a terminal: plain lines
LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (?P<text>.*)$")


def lines(capsys) -> list[str]:
    """The plain progress lines printed since the last call, without their clock time; nothing on stdout."""
    out, err = capsys.readouterr()
    assert out == "" and "\x1b" not in err   # stderr only, no terminal escape codes
    found = [LINE.match(line) for line in err.splitlines()]
    assert all(found), err
    return [m["text"] for m in found]


def test_off_a_terminal_a_line_at_the_first_step_then_each_interval_and_at_the_last(clock, capsys, monkeypatch):
    monkeypatch.setenv(progress.EVERY_ENV, "10")
    bar = TrainProgress(True, 10, 0, live=False)
    assert bar.p is None and lines(capsys) == []               # no bar, nothing before a step
    steps(bar, clock, 2.0)                                     # the first step: 2 s since the start
    assert lines(capsys) == ["RL step 1/10 reward 0.500 recall 0.250 · 2.0 s/step · ~18s left"]
    for t in (4.0, 6.0, 8.0, 10.0):                            # under 10 s since the last line: silent
        steps(bar, clock, t)
        assert lines(capsys) == []
    steps(bar, clock, 12.0)                                    # 10 s after the first line
    assert lines(capsys) == ["RL step 6/10 reward 0.500 recall 0.250 · 2.0 s/step · ~8s left"]
    steps(bar, clock, 14.0, 16.0, 18.0)
    assert lines(capsys) == []
    steps(bar, clock, 20.0)                                    # the last step, whatever the interval
    assert lines(capsys) == ["RL step 10/10 reward 0.500 recall 0.250 · 2.0 s/step · done after 20s"]
    bar.close()
    assert lines(capsys) == []                                 # nothing left to print


def test_a_run_that_stops_early_prints_its_last_step_at_close_with_the_steps_a_budget_leaves(clock, capsys,
                                                                                          monkeypatch):
    monkeypatch.setenv(progress.EVERY_ENV, "100")
    bar = TrainProgress(True, 150, 0, time_budget_s=100.0, live=False)
    steps(bar, clock, 12.0, 14.0, 16.0)                        # 45 steps fit (test above)
    assert lines(capsys) == ["RL step 1/~8 reward 0.500 recall 0.250 · 12.0 s/step · ~1m 24s left"]
    bar.close()                                                # the run ended (say, a rollback limit)
    assert lines(capsys) == ["RL step 3/~45 reward 0.500 recall 0.250 · 2.0 s/step · ~1m 24s left"]


def test_sft_progress_prints_every_step_at_interval_zero_and_nothing_when_disabled(clock, capsys, monkeypatch):
    monkeypatch.setenv(progress.EVERY_ENV, "0")
    monkeypatch.setattr(progress, "live_display", lambda: False)
    with progress.sft_progress(3) as report:
        for step, loss in enumerate((2.5, 1.75, 1.2345), start=1):
            clock[0] = 0.5 * step
            report(step, 3, loss)
    assert lines(capsys) == ["SFT step 1/3 loss 2.500 · 0.5 s/step · ~1s left",
                             "SFT step 2/3 loss 1.750 · 0.5 s/step · ~0s left",
                             "SFT step 3/3 loss 1.234 · 0.5 s/step · done after 2s"]
    with progress.sft_progress(3, enabled=False) as report:   # a rank other than 0
        report(1, 3, 1.0)
    assert lines(capsys) == []


def test_the_bar_draws_only_where_rich_sees_a_terminal(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for force, live in ((True, True), (None, False)):
        monkeypatch.setattr(progress, "get_console", lambda f=force: Console(file=io.StringIO(), force_terminal=f))
        bar = TrainProgress(True, 10, 0)
        bar.close()
        assert (bar.p is not None, bar.plain) == (live, not live)
    monkeypatch.setenv("TERM", "dumb")                         # a terminal Rich cannot redraw on
    monkeypatch.setattr(progress, "get_console", lambda: Console(file=io.StringIO(), force_terminal=True))
    assert not progress.live_display()


def test_the_interval_comes_from_the_environment_and_a_bad_value_falls_back_to_30_s(monkeypatch, caplog):
    monkeypatch.delenv(progress.EVERY_ENV, raising=False)
    assert progress.progress_every_s() == 30.0
    monkeypatch.setenv(progress.EVERY_ENV, "2.5")
    assert progress.progress_every_s() == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(progress.EVERY_ENV, bad)
        assert progress.progress_every_s() == 30.0
        assert f"RAGRL_PROGRESS_EVERY_S={bad!r}" in caplog.text


@pytest.mark.parametrize("seconds, shown", [(0.4, "0s"), (45, "45s"), (340, "5m 40s"), (7500, "2h 05m")])
def test_durations(seconds, shown):
    assert progress.duration(seconds) == shown
