"""SmartRAG's SFT warm start: answer directly what the base model already knows, search the rest.

Following the paper's data construction: the base model answers each training question
closed-book (greedy, the `direct` baseline prompt). Where it is already right (EM), the target
episode answers at once; otherwise the target searches with the question and answers from the
documents: the gold passages are put into the results when the question lists them, and an
episode whose answer is not visible in its documents is dropped (it would teach guessing).
"""
from __future__ import annotations

import logging
import random

from ragrl.agents.base import Protocol
from ragrl.retrieval.base import Hit, Retriever
from ragrl.rollout.episode import RolloutConfig
from ragrl.rollout.trajectory import Trajectory

log = logging.getLogger("ragrl.sft")


def closed_book_right(engine, samples: list[dict], seed: int = 0) -> list[bool]:
    """Whether the model answers each question exactly right with no retrieval (greedy)."""
    from ragrl.eval.harness import EvalConfig, run_system, score

    trajs = run_system("direct", engine, None, samples, EvalConfig(systems=["direct"], n=len(samples), seed=seed))
    return [score(t).metrics["em"] >= 1.0 for t in trajs]


def smartrag_targets(tok, protocol: Protocol, samples: list[dict], known: list[bool], retriever: Retriever,
                     passages: dict[str, Hit], cfg: RolloutConfig, seed: int = 0) -> tuple[list[Trajectory], dict]:
    """The SFT episodes and counts {direct, search, dropped} (see the module docstring)."""
    from ragrl.train.recipe import answer_visible
    from ragrl.train.sft import direct_trajectory, synth_trajectory

    rng = random.Random(seed)
    one_search = RolloutConfig(**{**cfg.__dict__, "max_turns": 2})   # search once, then answer
    out, counts = [], {"direct": 0, "search": 0, "dropped": 0}
    for s, right in zip(samples, known):
        if right:
            out.append(direct_trajectory(tok, protocol, s))
            counts["direct"] += 1
            continue
        t = synth_trajectory(tok, protocol, s, retriever, passages, one_search, rng)
        if answer_visible(t):
            out.append(t)
            counts["search"] += 1
        else:
            counts["dropped"] += 1
    return out, counts
