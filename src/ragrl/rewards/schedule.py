"""Reward schedules: which reward spec applies at which training step.

A curriculum in one run: e.g. gold recall first, then answer F1 (or a retrieval + format stage,
then F1). A schedule is a list of (from_step, spec), the first from step 0.

>>> s = RewardSchedule([(0, {"gold_recall": 1.0}), (100, {"f1": 1.0})])
>>> s.at(99), s.at(100)
({'gold_recall': 1.0}, {'f1': 1.0})
"""
from __future__ import annotations

import bisect
from typing import Any

from ragrl.errors import ConfigError
from ragrl.rewards.registry import CombinedReward, make_reward


class RewardSchedule:
    def __init__(self, stages: list[tuple[int, Any]]):
        if not isinstance(stages, (list, tuple)) or not stages:
            raise ConfigError("a reward schedule needs at least one (from_step, spec) stage")
        steps, specs = [], []
        for stage in stages:
            if not isinstance(stage, (list, tuple)) or len(stage) != 2:
                raise ConfigError(f"a schedule stage must be (from_step, spec), got {stage!r}")
            step, spec = stage
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ConfigError(f"from_step must be a non-negative integer, got {step!r}")
            if steps and step <= steps[-1]:
                raise ConfigError(f"schedule steps must strictly ascend, got {steps[-1]} then {step}")
            steps.append(step)
            specs.append(spec)
        if steps[0] != 0:
            raise ConfigError(f"the first schedule stage must start at step 0, not {steps[0]}")
        self.steps, self.specs = steps, specs
        self.rewards = [make_reward(spec) for spec in specs]  # validates every stage up front

    @classmethod
    def parse(cls, obj) -> "RewardSchedule":
        """From a recipe value: one spec (constant), or a list of stages given as
        `[from_step, spec]` pairs or `{"from_step": n, "reward": spec}` dicts."""
        if isinstance(obj, RewardSchedule):
            return obj
        if isinstance(obj, list) and obj and all(isinstance(s, dict) and "from_step" in s for s in obj):
            for s in obj:
                if set(s) != {"from_step", "reward"}:
                    raise ConfigError(f"a schedule stage takes from_step and reward, got {sorted(s)}")
            return cls([(s["from_step"], s["reward"]) for s in obj])
        if isinstance(obj, list) and obj and all(isinstance(s, (list, tuple)) for s in obj):
            return cls(list(obj))
        return cls([(0, obj)])

    def _index(self, step: int) -> int:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"a training step must be a non-negative integer, got {step!r}")
        return bisect.bisect_right(self.steps, step) - 1

    def at(self, step: int):
        """The reward spec in force at `step`."""
        return self.specs[self._index(step)]

    def reward_at(self, step: int) -> CombinedReward:
        """The compiled reward in force at `step`."""
        return self.rewards[self._index(step)]

    def __len__(self) -> int:
        return len(self.steps)
