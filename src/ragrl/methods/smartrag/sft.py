"""SmartRAG's SFT warm start: answer directly what the base model already knows, search the rest.

Following the paper's data construction: the base model answers each training question
closed-book (greedy, the `direct` baseline prompt). Where it is already right, the target
episode answers at once (with the gold answer); otherwise the target searches with the question and answers from the
documents: the gold passages are put into the results when the question lists them, and an
episode whose answer is not visible in its documents is dropped (it would teach guessing).

"Right" is exact match by default (`smartrag.known_if: em`). A small model answers in sentences, so
EM finds nothing it knows (SmolLM2-135M: 0 of 300); `known_if: cover_em` counts a gold answer said
inside the sentence, unless that answer is already in the question (else "What is the capital of
Waupaca County?" -> "Waupaca County is ..." would count as knowing "Waupaca").
"""
from __future__ import annotations

import logging
import random

from ragrl.datasets import load_questions
from ragrl.errors import ConfigError
from ragrl.eval.harness import EvalConfig, run_system
from ragrl.methods.synthetic import answer_visible, direct_trajectory, synth_trajectory
from ragrl.policy.model_config import engine_for
from ragrl.retrieval.base import Hit, Retriever
from ragrl.retrieval.corpus import load_corpus
from ragrl.retrieval.resolve import corpus_of
from ragrl.rewards.qa import cover_em, exact_match, normalize_answer
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.protocol import TextProtocol, get_protocol
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
    trajs = run_system("direct", engine, None, samples, EvalConfig(systems=["direct"], n=len(samples), seed=seed))
    return [known_closed_book(t.answer or "", t.golds, s["question"], criterion) for s, t in zip(samples, trajs)]


def smartrag_targets(tok, protocol: TextProtocol, samples: list[dict], known: list[bool], retriever: Retriever,
                     passages: dict[str, Hit], cfg: RolloutConfig, seed: int = 0) -> tuple[list[Trajectory], dict]:
    """The SFT episodes and counts {direct, search, dropped} (see the module docstring)."""
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


def smartrag_episodes(cfg, model, tok, retriever) -> list[Trajectory]:
    """SmartRAG's warm start (`sft.builder: smartrag`): the closed-book check by the model being
    warm-started (its LoRA is still zero: the base model), then direct or search targets."""
    samples = load_questions(cfg.data.train)
    if cfg.sft.max_questions:
        samples = random.Random(cfg.seed).sample(samples, min(cfg.sft.max_questions, len(samples)))
    corpus = load_corpus(corpus_of(cfg.data.index, cfg.data.corpus))
    wanted = {pid for s in samples for pid in s.get("gold_passage_ids") or []}
    passages = {pid: Hit(pid, corpus.titles[i], corpus.texts[i], 0.0) for pid in wanted
                if (i := corpus.row(pid)) is not None}
    model.eval()
    known = closed_book_right(engine_for(cfg.model, model, tok), samples, cfg.seed, cfg.smartrag.known_if)
    trajs, counts = smartrag_targets(tok, get_protocol(cfg.agent), samples, known, retriever, passages,
                                     cfg.rollout, cfg.seed)
    log.info("SmartRAG SFT: %d answer directly (right closed-book), %d search, %d dropped (answer not in "
             "the documents)", counts["direct"], counts["search"], counts["dropped"])
    if not trajs:
        raise ConfigError(f"SmartRAG SFT built no episode from {cfg.data.train}")
    return trajs
