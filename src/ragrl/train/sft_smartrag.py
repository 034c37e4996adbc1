"""SmartRAG's SFT warm start: answer directly what the base model already knows, search the rest.

Following the paper's data construction: the base model answers each training question
closed-book (greedy, the `direct` baseline prompt). Where it is already right, the target
episode answers at once (with the gold answer); otherwise the target searches with the question and answers from the
documents: the gold passages are put into the results when the question lists them, and an
episode whose answer is not visible in its documents is dropped (it would teach guessing).

"Right" is exact match by default (`sft.known_if: em`). A small model answers in sentences, so
EM finds nothing it knows (SmolLM2-135M: 0 of 300); `known_if: cover_em` counts a gold answer said
inside the sentence, unless that answer is already in the question (else "What is the capital of
Waupaca County?" -> "Waupaca County is ..." would count as knowing "Waupaca").
"""
from __future__ import annotations

import logging
import random

from ragrl.agents.base import Protocol
from ragrl.rewards.qa import cover_em, exact_match, normalize_answer
from ragrl.retrieval.base import Hit, Retriever
from ragrl.rollout.episode import RolloutConfig
from ragrl.rollout.trajectory import Trajectory

log = logging.getLogger("ragrl.sft")


def known_closed_book(answer: str, golds: list[str], question: str, criterion: str = "em") -> bool:
    """Whether a closed-book answer counts as already right (see the module docstring).

    >>> known_closed_book("Kuczynka is a city in Poland.", ["Poland"], "In what country is Kuczynka?", "cover_em")
    True
    >>> known_closed_book("Kuczynka is a city in Poland.", ["Poland"], "In what country is Kuczynka?", "em")
    False
    >>> known_closed_book("Waupaca County is a state.", ["Waupaca"], "What is the capital of Waupaca County?", "cover_em")
    False
    """
    if criterion == "em":
        return exact_match(answer, golds) >= 1.0
    if criterion != "cover_em":
        raise ValueError(f"unknown closed-book criterion {criterion!r} (em | cover_em)")
    q = f" {normalize_answer(question)} "
    fresh = [g for g in golds if normalize_answer(g) and f" {normalize_answer(g)} " not in q]
    return cover_em(answer, fresh) >= 1.0


def closed_book_right(engine, samples: list[dict], seed: int = 0, criterion: str = "em") -> list[bool]:
    """Whether the model answers each question right with no retrieval (greedy; `known_closed_book`)."""
    from ragrl.eval.harness import EvalConfig, run_system

    trajs = run_system("direct", engine, None, samples, EvalConfig(systems=["direct"], n=len(samples), seed=seed))
    return [known_closed_book(t.answer or "", t.golds, s["question"], criterion) for s, t in zip(samples, trajs)]


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
