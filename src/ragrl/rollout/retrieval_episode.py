"""Retrieval-only episodes (HARR without a generator): one sampled retrieval per trajectory.

The question is the query; the retriever samples k documents; the trajectory records the draw
(`Trajectory.retrievals`) and the documents (turn passage ids and text), and rewards read them
(gold-passage recall, answer in the documents). No tokens are generated, so a step costs a few
query encodings: this is the cheap, dense-reward setting in which a retriever policy learns on a
CPU. With a generator in the loop, `run_episodes` is the runner and every search is sampled.
"""
from __future__ import annotations

import time

import torch

from ragrl.retrieval.stochastic import QueryRequest, StochasticRetriever
from ragrl.rollout.episode import RolloutConfig
from ragrl.rollout.trajectory import Trajectory, Turn


def run_retrieval_episodes(retriever: StochasticRetriever, samples: list[dict], cfg: RolloutConfig, *,
                           group_offset: int = 0) -> tuple[list[Trajectory], dict[str, float]]:
    """`cfg.n` trajectories per sample (sample-major), each one Plackett–Luce draw of `cfg.topk`."""
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(int(cfg.seed or 0))
    requests = [QueryRequest(s["question"], s["question"]) for s in samples for _ in range(cfg.n)]
    drawn = retriever.sample(requests, cfg.topk, generator=g)
    trajs = []
    for j, (hits, action) in enumerate(drawn):
        i = j // cfg.n
        s = samples[i]
        turn = Turn(action_text=s["question"], kind="search", queries=[s["question"]],
                    passage_ids=[[h.id for h in hits]],
                    observation="\n".join(f"{h.title}. {h.text}" for h in hits))
        trajs.append(Trajectory(
            sample_id=str(s.get("id", i)), question=s["question"], golds=list(s.get("answers", [])),
            token_ids=[], action_mask=[], logprobs=[], prompt_len=0, group=group_offset + i,
            turns=[turn], retrievals=[action] if action is not None else [], num_searches=1, num_turns=1,
            stop_reason="retrieved", metrics={"protocol": "retrieval"}))
    return trajs, {"generate_s": 0.0, "retrieval_s": time.perf_counter() - t0, "gen_tokens": 0}
