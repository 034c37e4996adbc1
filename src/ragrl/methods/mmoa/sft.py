"""MMOA-RAG's SFT warm start, built from the data as the released code does.

Per training question: the rewriter's target is the question's decomposition where the data
has one (`question_decomposition`, MuSiQue), else the question itself; the retriever runs on
those sub-questions with the shared candidate budget; the selector's target is the gold passages
among the retrieved ones (no example when none was retrieved); the generator's target is the
gold answer, from the documents the selector's target keeps (else the top 3). Each example is a
(prompt, response) trajectory of its agent with the prompt masked, like a pipeline rollout.
"""
from __future__ import annotations

import logging
import random

from ragrl.datasets import load_questions
from ragrl.methods.mmoa.protocol import MMOAProtocol, split_budget
from ragrl.retrieval.base import Retriever
from ragrl.rollout.protocol import chat_ids, get_protocol
from ragrl.rollout.trajectory import Trajectory, Turn

log = logging.getLogger("ragrl.sft")


def decomposition(sample: dict) -> list[str]:
    steps = sample.get("question_decomposition") or []
    subqs = [s.get("question", "") if isinstance(s, dict) else str(s) for s in steps]
    subqs = [q.strip() for q in subqs if q and q.strip()]
    return subqs[:4] or [sample["question"]]


def _example(tok, agent: str, messages: list[dict], target: str, sample: dict) -> Trajectory:
    p = chat_ids(tok, messages)
    r = tok.encode(target, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    return Trajectory(sample_id=str(sample["id"]), question=sample["question"], golds=list(sample["answers"]),
                      token_ids=p + r, action_mask=[0] * len(p) + [1] * len(r), logprobs=[0.0] * (len(p) + len(r)),
                      prompt_len=len(p), agent=agent, turns=[Turn(action_text=target, kind=agent)])


def mmoa_sft_examples(tok, protocol: MMOAProtocol, samples: list[dict], retriever: Retriever,
                      total_candidates: int = 10) -> tuple[list[Trajectory], dict]:
    out, counts = [], {"rewriter": 0, "selector": 0, "generator": 0}
    for s in samples:
        subqs = decomposition(s)
        out.append(_example(tok, "rewriter", protocol.rewriter_messages(s["question"]), "\n".join(subqs), s))
        counts["rewriter"] += 1
        docs, seen = [], set()
        for q, k in zip(subqs, split_budget(len(subqs), total_candidates)):
            for h in retriever.search([q], k)[0]:
                if h.id not in seen:
                    seen.add(h.id)
                    docs.append(h)
        gold = set(s.get("gold_passage_ids") or [])
        keep = [i for i, h in enumerate(docs) if h.id in gold]
        if keep:
            target = ",".join(f"Document{i}" for i in keep)
            out.append(_example(tok, "selector", protocol.selector_messages(s["question"], docs), target, s))
            counts["selector"] += 1
        shown = [docs[i] for i in keep] or docs[:3]
        out.append(_example(tok, "generator", protocol.generator_messages(s["question"], shown), s["answers"][0], s))
        counts["generator"] += 1
    return out, counts


def mmoa_episodes(cfg, model, tok, retriever) -> list[Trajectory]:
    """MMOA-RAG's warm start (`sft.builder: mmoa`): one example per agent per question."""
    samples = load_questions(cfg.data.train)
    if cfg.sft.max_questions:
        samples = random.Random(cfg.seed).sample(samples, min(cfg.sft.max_questions, len(samples)))
    trajs, counts = mmoa_sft_examples(tok, get_protocol(cfg.agent), samples, retriever)
    log.info("MMOA SFT: %s examples per agent", counts)
    return trajs
