"""Retrieval-only episodes (HARR without a generator): `hops` sampled retrievals per trajectory.

The question is the query; the retriever samples k documents; the trajectory records the draw
(`Trajectory.retrievals`) and the documents (turn passage ids and text), and rewards read them
(gold-passage recall, answer in the documents). No tokens are generated, so a step costs a few
query encodings: this is the cheap, dense-reward setting in which a retriever policy learns on a
CPU. With hops > 1, each later hop embeds the question with HARR's history of what the earlier
hops drew (titles and leading words: the next hop's entity is usually named there) and draws k
passages not drawn yet; the episode's reward is credited to every hop. With a generator in the
loop, `run_episodes` is the runner and every search it makes is sampled.

Wall-time bounds (rollout.max_episode_s / max_rollout_s) are checked before each hop: a draw is
never interrupted, but past the bound every episode ends there (stop_reason "timeout"), with the
hops drawn so far.
"""
from __future__ import annotations

import time

import torch

from ragrl.retrieval.stochastic import QueryRequest, StochasticRetriever, found_entry
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import episode_deadline
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn


def run_retrieval_episodes(retriever: StochasticRetriever, samples: list[dict], cfg: RolloutConfig, *,
                           group_offset: int = 0, hops: int = 1,
                           history_branches: int = 0) -> tuple[list[Trajectory], dict[str, float]]:
    """`cfg.n` trajectories per sample (sample-major), each `hops` Plackett–Luce draws of `cfg.topk`.

    history_branches B > 0: the hops before the last are drawn once per block of n / B consecutive
    trajectories of a group and shared by the block (a tree of B branches), so the last hop sees
    B distinct histories per question. Each trajectory still records every hop's action, so a
    shared draw is credited with the mean advantage of its block: the tree's unbiased estimate.
    """
    t0 = time.perf_counter()
    # Every episode starts with the call (and shares each hop's draw call), so all share one deadline.
    start = time.monotonic()
    deadline = episode_deadline(cfg, start, episode_start=start)
    g = torch.Generator().manual_seed(int(cfg.seed or 0))
    trajs = [Trajectory(sample_id=str(s.get("id", i)), question=s["question"], golds=list(s.get("answers", [])),
                        token_ids=[], action_mask=[], logprobs=[], prompt_len=0, group=group_offset + i,
                        stop_reason=EpisodeEnd.RETRIEVED, metrics={"protocol": "retrieval"})
             for i, s in enumerate(samples) for _ in range(cfg.n)]
    found: list[list[list]] = [[] for _ in trajs]      # per trajectory, the hits of each hop so far
    row, words = retriever.index.corpus.row, retriever.history_words
    block = cfg.n // history_branches if history_branches else 1
    for hop in range(hops):
        if deadline is not None and time.monotonic() >= deadline:
            for t in trajs:
                t.stop_reason = EpisodeEnd.TIMEOUT
            break
        # the trajectories that draw at this hop; the others copy their block leader's draw
        shared = block > 1 and hop < hops - 1
        drawers = [i for i in range(len(trajs)) if not shared or i % block == 0]
        requests = [QueryRequest(trajs[i].question, trajs[i].question,
                                 [found_entry(trajs[i].question, hs, words) for hs in found[i]],
                                 [row(h.id) for hs in found[i] for h in hs]) for i in drawers]
        drawn = dict(zip(drawers, retriever.sample(requests, cfg.topk, generator=g)))
        for i, t in enumerate(trajs):
            hits, action = drawn[i - i % block if shared else i]
            found[i].append(hits)
            t.turns.append(Turn(action_text=t.question, kind="search", queries=[t.question],
                                passage_ids=[[h.id for h in hits]], passage_titles=[[h.title for h in hits]],
                                passage_texts=[[h.full_text for h in hits]],
                                observation="\n".join(f"{h.title}. {h.text}" for h in hits)))
            if action is not None:
                t.retrievals.append(action)
            t.num_searches += 1
            t.num_turns += 1
    return trajs, {"generate_s": 0.0, "retrieval_s": time.perf_counter() - t0, "gen_tokens": 0,
                   "timeouts": sum(t.stop_reason == EpisodeEnd.TIMEOUT for t in trajs)}
