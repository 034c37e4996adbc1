"""Episode runners by shape: a protocol's `runner` names the one that plays its episodes.

`multi_turn` (the core's): one LM acts turn by turn until it answers. A method whose episodes have
another shape registers its runner here from its record (MMOA-RAG's `pipeline`: rewriter ->
retrieval -> selector -> generator, one trajectory per agent). Every runner returns the
Trajectories the same trainer consumes.
"""
from __future__ import annotations

from typing import Callable

from ragrl.registry import Registry
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.protocol import TextProtocol

# (engine, protocol, retriever, samples, cfg, *, group_offset[, settings]): a method's runner also
# gets its method's own settings section (ragrl.methods.base.runner_settings).
Runner = Callable[..., tuple[list, dict]]

RUNNERS: Registry[Runner] = Registry("episode runner", {"multi_turn": run_episodes})


def run_agent(engine, protocol: TextProtocol, retriever, samples: list[dict], cfg: RolloutConfig, *,
              group_offset: int = 0, settings=None):
    """Roll out `protocol`'s episodes with its runner; (trajectories, stats). `settings`: the runner's
    method's own section, given to a runner that has one (the core's multi_turn has none)."""
    extra = {} if settings is None else {"settings": settings}
    return RUNNERS[protocol.runner](engine, protocol, retriever, samples, cfg, group_offset=group_offset, **extra)


def answering(trajs: list, protocol: TextProtocol) -> list:
    """The trajectories that hold each episode's answer (one per question and sample): all of a
    single-agent protocol's, the answering agent's of a pipeline (`protocol.answering_agent`)."""
    agent = protocol.answering_agent
    return [t for t in trajs if agent is None or t.agent == agent]


def episodes_by_question(trajs: list, protocol: TextProtocol) -> dict[str, list]:
    """Each question's trajectories by `sample_id` (every agent of a pipeline), the answering one
    first: how an evaluation reads one greedy episode a question."""
    by_q: dict[str, list] = {}
    for t in trajs:
        by_q.setdefault(t.sample_id, []).append(t)
    agent = protocol.answering_agent
    return {q: sorted(ts, key=lambda t: agent is not None and t.agent != agent) for q, ts in by_q.items()}
