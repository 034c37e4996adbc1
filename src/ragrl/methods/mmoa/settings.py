"""MMOA-RAG's own settings: the `mmoa:` section of a recipe (its pipeline runner's branching and
decoding). Until 2026-11-28 they were `rollout.selector_samples`, `rollout.generator_samples` and
`rollout.greedy_agents`; those keys are still read, with a deprecation message."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ragrl.errors import ConfigError
from ragrl.methods.mmoa.protocol import AGENTS
from ragrl.yaml_config import setting


@dataclass
class MMOASettings:
    """The pipeline runner's knobs: how a training pipeline branches, and which agents sample."""

    selector_samples: int = setting(1, help=(
        "Selections sampled per pipeline, each answered; they share a group, so a group baseline "
        "compares selections of the same candidates. Training only: evaluation uses 1."))
    generator_samples: int = setting(1, help=(
        "Answers sampled per selection (one prompt, one group). Training only: evaluation uses 1."))
    # A frozen selector sampled at 0.7 keeps a gold first document far less often than greedily.
    greedy_agents: list[str] = setting(factory=list, help=(
        "Agents that decode greedily in training rollouts whatever rollout.temperature says, e.g. "
        "frozen ones, so their sampling noise does not reach the trained agents' rewards. Evaluation "
        "decodes every agent alike."))


def check_settings(settings: MMOASettings) -> None:
    """Branching counts are integers >= 1, and the agents it names are the pipeline's: checked when a
    recipe loads (the method's check) and by the runner itself, which experiments call directly."""
    for name in ("selector_samples", "generator_samples"):
        k = getattr(settings, name)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"mmoa.{name} must be an integer >= 1, got {k!r}")
    unknown = [a for a in settings.greedy_agents if a not in AGENTS]
    if unknown:
        raise ConfigError(f"mmoa.greedy_agents: {', '.join(map(repr, unknown))} is not an agent of the MMOA "
                          f"pipeline (its agents: {', '.join(AGENTS)})")


def evaluation_settings(settings: MMOASettings) -> MMOASettings:
    """As evaluation runs the pipeline: one selection and one answer, every agent decoded alike."""
    return replace(settings, selector_samples=1, generator_samples=1, greedy_agents=[])


MOVED_KEYS = {"rollout.selector_samples": "selector_samples", "rollout.generator_samples": "generator_samples",
              "rollout.greedy_agents": "greedy_agents"}
