"""Statistics of a step's GRPO groups (the trainer logs them in every row)."""
from __future__ import annotations


def flat_group_fraction(trajs) -> float:
    """Share of GRPO groups (trajectories with the same `group`) whose rewards are all equal.

    >>> from types import SimpleNamespace as T
    >>> flat_group_fraction([T(group=0, reward=1.0), T(group=0, reward=1.0), T(group=1, reward=0.0), T(group=1, reward=0.5)])
    0.5
    """
    groups: dict[int, set[float]] = {}
    for t in trajs:
        groups.setdefault(t.group, set()).add(round(float(t.reward), 9))
    return sum(len(v) == 1 for v in groups.values()) / max(len(groups), 1)
