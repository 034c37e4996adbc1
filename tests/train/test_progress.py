"""The training bar's time left is the run's expected end (steps left at the mean step time, or the
steps that still fit in the time budget), not what is left of the bound."""
import pytest

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
    bar = TrainProgress(True, 20, 0, time_budget_s=100.0)
    steps(bar, clock, 12.0, 14.0, 16.0)
    task = bar.p.tasks[0]
    bar.close()
    assert bar.expected() == (20, 17 * 2.0)                       # the bound would say 84 s
    assert task.fields["left"] == "0:00:34" and task.fields["expected"] == 20 and task.fields["step"] == 3
    assert task.total == 100.0 and task.completed == pytest.approx(100.0 * 16 / (16 + 34))


def test_without_a_budget_the_bar_counts_steps(clock):
    bar = TrainProgress(True, 10, 4)
    assert bar.p.tasks[0].fields["left"] == progress.UNKNOWN       # nothing to go on before a step
    steps(bar, clock, 5.0, 8.0)
    task = bar.p.tasks[0]
    bar.close()
    assert task.completed == 6 and task.total == 10 and task.fields["left"] == "0:00:12"   # 4 steps of 3 s
    assert "recall 0.250" in task.fields["info"]


def test_an_agent_shows_its_f1_and_searches(clock):
    bar = TrainProgress(True, 10, 0)
    steps(bar, clock, 1.0)
    bar.update({"reward_mean": 0.5, "f1": 0.25, "searches": 1.5, "gold_recall": 0.1, "response_len": 40.0})
    info = bar.p.tasks[0].fields["info"]
    bar.close()
    assert info == "reward 0.500 f1 0.250 searches 1.50"
