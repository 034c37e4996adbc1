"""What a training step's row says about its trajectories (the trainer adds its own state: learning
rate, KL coefficient, timings, the guards')."""
from __future__ import annotations

import torch

from ragrl.rollout.trajectory import EpisodeEnd


def flat_group_fraction(trajs) -> float:
    """Share of GRPO groups (trajectories with the same `group`) whose rewards are all equal.

    >>> from types import SimpleNamespace as T
    >>> flat_group_fraction([T(group=0, reward=1.0), T(group=0, reward=1.0), T(group=1, reward=0.0), T(group=1, reward=0.5)])
    0.5
    """
    groups = _group_rewards(trajs)
    return sum(len(v) == 1 for v in groups.values()) / max(len(groups), 1)


def _group_rewards(trajs) -> dict[int, set[float]]:
    """Each group's distinct rewards (to 9 places: a float sum's last bits make no group differ)."""
    groups: dict[int, set[float]] = {}
    for t in trajs:
        groups.setdefault(t.group, set()).add(round(float(t.reward), 9))
    return groups


def rows_of_informative_groups(trajs) -> list[int]:
    """Positions of the trajectories whose group's rewards differ (algo.drop_flat_groups), in order.

    >>> from types import SimpleNamespace as T
    >>> rows_of_informative_groups([T(group=0, reward=1.0), T(group=1, reward=0.0), T(group=0, reward=1.0),
    ...                             T(group=1, reward=0.5)])
    [1, 3]
    """
    groups = _group_rewards(trajs)
    return [i for i, t in enumerate(trajs) if len(groups[t.group]) > 1]


def trajectory_metrics(trajs) -> dict[str, float]:
    """Means over a step's scored trajectories: reward, answer scores, searches, lengths, format
    errors, timeouts, gold recall where known, per-agent rewards and a runner's own scalars."""
    n = len(trajs)
    rewards = torch.tensor([t.reward for t in trajs])
    row = {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if n > 1 else 0.0,
        "em": sum(t.metrics["em"] for t in trajs) / n, "f1": sum(t.metrics["f1"] for t in trajs) / n,
        "cover_em": sum(t.metrics["cover_em"] for t in trajs) / n,
        "searches": sum(t.num_searches for t in trajs) / n,
        "turns": sum(t.num_turns for t in trajs) / n,
        "response_len": sum(len(t.response_ids) for t in trajs) / n,
        "format_error_rate": sum(t.format_errors > 0 for t in trajs) / n,
        "retrieval_actions": sum(len(t.retrievals) for t in trajs) / n,
        "answered": sum(t.answer is not None for t in trajs) / n,
        # Groups whose samples all scored the same: a group-relative estimator learns nothing there.
        "flat_group_frac": flat_group_fraction(trajs),
        # Episodes cut by rollout.max_episode_s / max_rollout_s.
        "timeouts": sum(t.stop_reason == EpisodeEnd.TIMEOUT for t in trajs) / n,
    }
    recalls = [t.metrics["gold_recall"] for t in trajs if "gold_recall" in t.metrics]
    if recalls:
        row["gold_recall"] = sum(recalls) / len(recalls)
    # A pipeline's agents (MMOA-RAG) earn rewards on different scales: one mean each, and how
    # often each one's output drew its penalty.
    for agent in sorted({t.agent for t in trajs if t.agent}):
        mine = [t for t in trajs if t.agent == agent]
        row[f"reward/{agent}"] = sum(t.reward for t in mine) / len(mine)
        row[f"penalized/{agent}"] = sum(bool(t.metrics.get("penalized")) for t in mine) / len(mine)
    # Scalars a runner reports on its trajectories (the MMOA pipeline: documents the selector
    # kept, their F1 against gold, sub-questions): one mean each, over those that carry it.
    scalars: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in t.metrics.get("scalars", {}).items():
            scalars.setdefault(k, []).append(float(v))
    row.update({f"rollout/{k}": sum(v) / len(v) for k, v in sorted(scalars.items())})
    return row


def timing_metrics(trajs, rollout_stats: dict, seconds: dict[str, float]) -> dict[str, float]:
    """A step's wall times by phase (`seconds`: rollout, reward, update, step) and the rollout's
    generated tokens per second.

    >>> from types import SimpleNamespace as T
    >>> m = timing_metrics([T(num_action_tokens=30), T(num_action_tokens=10)], {"generate_s": 1.5, "retrieval_s": 0.2},
    ...                    {"rollout": 2.0, "reward": 0.1, "update": 3.0, "step": 5.2})
    >>> m["tokens_per_s"], m["time/update_s"], m["time/generate_s"]
    (20.0, 3.0, 1.5)
    """
    return {
        "time/rollout_s": seconds["rollout"], "time/generate_s": rollout_stats["generate_s"],
        "time/retrieval_s": rollout_stats["retrieval_s"], "time/reward_s": seconds["reward"],
        "time/update_s": seconds["update"], "time/step_s": seconds["step"],
        "tokens_per_s": sum(t.num_action_tokens for t in trajs) / max(seconds["rollout"], 1e-9),
    }
