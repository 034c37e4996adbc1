"""What each RL step draws and at which learning rate: pure functions of (config, step).

Both depend on the step number alone, so a resumed run continues the data order and the
schedule exactly with nothing saved but the step.
"""
from __future__ import annotations

import math

import torch

from ragrl.train.config import TrainConfig


def step_questions(n_questions: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices of the questions for `step`: consecutive slices of per-epoch permutations.

    >>> step_questions(5, 0, 2, 0) == step_questions(5, 0, 2, 0)
    True
    >>> sorted(step_questions(4, 0, 2, 1) + step_questions(4, 1, 2, 1))
    [0, 1, 2, 3]
    """
    out = []
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(pos, n_questions)
        g = torch.Generator().manual_seed(seed * 100_003 + epoch)
        out.append(int(torch.randperm(n_questions, generator=g)[i]))
    return out


def make_scheduler(optimizer, cfg: TrainConfig):
    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        frac = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        return 1.0 - frac if cfg.lr_schedule == "linear" else 0.5 * (1 + math.cos(math.pi * frac))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
