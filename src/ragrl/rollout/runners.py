"""Episode runners by shape: the protocol says which one plays its episodes.

`multi_turn` (Search-R1, R1-Searcher, RAG-R1, SmartRAG): one LM acts turn by turn until it answers.
`pipeline` (MMOA-RAG): rewriter → retrieval → selector → generator, one trajectory per agent.
Both return Trajectories the same trainer consumes.
"""
from __future__ import annotations

from ragrl.rollout.episode import RolloutConfig, run_episodes
from ragrl.rollout.pipeline import run_mmoa_episodes

RUNNERS = {"multi_turn": run_episodes, "pipeline": run_mmoa_episodes}


def run_agent(engine, protocol, retriever, samples: list[dict], cfg: RolloutConfig, *, group_offset: int = 0):
    """Roll out `protocol`'s episodes with its runner; (trajectories, stats)."""
    runner = RUNNERS[getattr(protocol, "runner", "multi_turn")]
    return runner(engine, protocol, retriever, samples, cfg, group_offset=group_offset)


def answering(trajs: list, protocol) -> list:
    """The trajectories that hold each episode's answer (one per question and sample): all of a
    single-agent protocol's, the generator's of a pipeline (`protocol.answering_agent`)."""
    agent = getattr(protocol, "answering_agent", None)
    return [t for t in trajs if agent is None or t.agent == agent]
