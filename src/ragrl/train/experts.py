"""Expert episodes in the RL group (DAVID-GRPO's expert bootstrapping, `experts_per_group`).

A small policy's group of samples rarely holds a search that found the answer, so a
group-relative advantage has nothing good to move towards. Each question's group gets
`experts_per_group` off-policy episodes that search as the SFT episodes do (the question, then the
further gold titles, or under `experts_query: missed_gold` only one the searches missed), in the
runner's episode shape, with the index's own results (nothing put in). They are scored by the
step's reward like any sample, and their old log-probs are the current policy's, so the clipped
ratio starts at 1 for them as for an on-policy sample.
"""
from __future__ import annotations

import random

import torch

from ragrl.methods.synthetic import corpus_passages, expert_trajectory
from ragrl.retrieval.base import Hit, Retriever
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.protocol import TextProtocol, get_protocol
from ragrl.rollout.trajectory import Trajectory


def expert_episodes(tok, protocol: TextProtocol, samples: list[dict], trajs: list[Trajectory],
                    retriever: Retriever, passages: dict[str, Hit], cfg: RolloutConfig, per_group: int,
                    seed: int, next_query: str = "every_gold") -> list[Trajectory]:
    """Up to `per_group` expert episodes for each sample that has gold passages, each given the group
    of that sample's rollouts in `trajs`. A question whose expert search shows no gold answer gets
    none (see `expert_trajectory`), so a step may hold fewer than len(samples) * per_group."""
    group_of = {t.sample_id: t.group for t in trajs}
    rng = random.Random(seed)   # which gold title is searched first, among equals
    out = []
    for i, s in enumerate(samples):
        sid = str(s.get("id", i))
        if sid not in group_of or not s.get("gold_passage_ids"):
            continue
        for _ in range(per_group):
            t = expert_trajectory(tok, protocol, s, retriever, passages, cfg, rng, next_query)
            if t is not None:
                t.sample_id, t.group = sid, group_of[sid]
                t.metrics["expert"] = True
                out.append(t)
    return out


class ExpertSource:
    """A run's expert episodes by step: `source(samples, trajs, step)`. The corpus (for the gold
    titles) is read on the first call, not when the trainer is built."""

    def __init__(self, cfg, extras: dict):
        self.cfg, self.tok, self.retriever = cfg, extras["tokenizer"], extras["retriever"]
        self.protocol = get_protocol(cfg.agent)
        self.passages: dict[str, Hit] | None = None

    def __call__(self, samples: list[dict], trajs: list[Trajectory], step: int) -> list[Trajectory]:
        cfg = self.cfg
        if self.passages is None:
            self.passages = corpus_passages(cfg.data.index, cfg.data.corpus)
        return expert_episodes(self.tok, self.protocol, samples, trajs, self.retriever, self.passages,
                               cfg.rollout, cfg.experts_per_group, seed=cfg.seed * 1_000_003 + step,
                               next_query=cfg.experts_query)


@torch.no_grad()
def take_policy_logprobs(policy, trajs: list[Trajectory], micro_batch_size: int) -> None:
    """Write the policy's own log-prob of each action token into `trajs[i].logprobs` (0.0 elsewhere):
    the old log-probs of episodes the policy did not sample."""
    for s in range(0, len(trajs), micro_batch_size):
        part = trajs[s: s + micro_batch_size]
        batch = policy.collate(part).to(policy.device)
        logprobs = policy.forward(batch)["logprobs"].float().cpu()
        for row, t in enumerate(part):
            # the batch is padded to its longest row, so every row's positions are there
            lp = logprobs[row, : len(t.token_ids)].tolist()
            t.logprobs = [v if m else 0.0 for v, m in zip(lp, t.action_mask)]
