"""ragrl.train.steps: the data order and the learning-rate schedule, functions of (config, step) alone."""
import pytest
import torch

from ragrl.train.config import TrainConfig
from ragrl.train.steps import make_scheduler, step_questions


@pytest.mark.parametrize("n_questions,per_step", [(7, 3), (6, 2), (5, 5), (4, 6)])
def test_step_questions_cover_every_question_once_per_epoch(n_questions, per_step):
    steps = 3 * n_questions  # whole epochs worth of positions, whatever per_step is
    drawn = [i for s in range(steps) for i in step_questions(n_questions, s, per_step, seed=3)]
    epochs = [drawn[e * n_questions:(e + 1) * n_questions] for e in range(len(drawn) // n_questions)]
    assert len(epochs) >= 3
    for order in epochs:
        assert sorted(order) == list(range(n_questions))
    if n_questions > 3:  # fresh shuffles: the epochs do not all repeat the same order
        assert len({tuple(o) for o in epochs}) > 1
    assert drawn[:per_step] == step_questions(n_questions, 0, per_step, seed=3)       # deterministic
    other = [i for s in range(steps) for i in step_questions(n_questions, s, per_step, seed=4)]
    assert other != drawn or n_questions < 3


@pytest.mark.parametrize("schedule,expected", [("constant", [0.5, 1.0, 1.0, 1.0, 1.0]),
                                               ("linear", [0.5, 1.0, 1.0, 2 / 3, 1 / 3])])
def test_the_schedule_warms_up_then_follows_its_shape(schedule, expected):
    """2 warm-up steps (1/2, 2/2), then `lr_schedule` from 1 at step 2 down by 1/3 a step (steps 2-4 of 5)."""
    cfg = TrainConfig(steps=5, warmup_steps=2, lr_schedule=schedule)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(opt, cfg)
    seen = []
    for _ in range(5):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert seen == pytest.approx(expected)
