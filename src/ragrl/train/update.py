"""The update phase of one RL step: advantages, then PPO epochs of minibatch updates.

Rollout produced a batch (`policy.collate(trajs)`); this file turns it into gradient steps for
any `Policy` (an LM over tokens, a retriever over sampled documents): it touches only the
batch's action mask, old log-probs, scores and group ids, and what `policy.forward` returns. Under several
processes each rank holds its own rows; gradients are *summed* across ranks after the
loss was divided by the global (all-ranks) token or sequence count, so N ranks with B/N
rows each take exactly the step one process takes with all B rows.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ragrl.algos.advantages import place_outcome_reward
from ragrl.algos.kl import kl_estimate, kl_penalty_in_reward
from ragrl.algos.losses import agg_loss, value_loss
from ragrl.algos.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, compute_advantages
from ragrl.policy.base import ActionBatch, Policy
from ragrl.policy.fsdp import clip_grad_norm, is_dtensor, is_sharded, reshard
from ragrl.train.config import AlgoConfig
from ragrl.train.distributed import all_sum, is_distributed
from ragrl.train.guards import sampled_entropy
from ragrl.train.step_metrics import rows_of_informative_groups

log = logging.getLogger("ragrl.train")


@dataclass
class Prepared:
    """Per-row targets computed once before the PPO epochs."""

    batch: ActionBatch
    advantages: torch.Tensor      # [B, L]
    returns: torch.Tensor         # [B, L]
    old_values: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    stats: dict


@torch.no_grad()
def prepare(policy: Policy, batch: ActionBatch, cfg: AlgoConfig, kl_coef: float,
            micro_batch_size: int) -> Prepared:
    """Reference log-probs, old values and advantages for a rollout batch (no gradient).

    The batch moves to the policy's device first: every later tensor (targets, minibatches) lives there."""
    batch = batch.to(policy.device)
    mask = batch.action_mask
    ref = values = None
    need_ref = kl_coef > 0
    order = by_length(torch.arange(len(batch)), row_lengths(batch))
    micro_batches = [order[s: s + micro_batch_size] for s in range(0, len(batch), micro_batch_size)]
    # The frozen bottom layers run once per row when at least two forwards would each run them.
    if cfg.reuse_frozen_trunk and cfg.ppo_epochs + need_ref + policy.has_values >= 2:
        batch = policy.with_frozen_trunk(batch, micro_batches)
    if need_ref or policy.has_values:
        L = mask.shape[1]
        pad = lambda t: torch.nn.functional.pad(t, (0, L - t.shape[1]))  # noqa: E731
        # float32 targets whatever the mask's dtype: micro batches fill them out of row order.
        new = lambda: torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # noqa: E731
        ref = new() if need_ref else None
        values = new() if policy.has_values else None
        for idx in micro_batches:
            mb = batch.select(idx)
            if need_ref:
                with policy.reference():
                    ref[idx] = pad(policy.forward(mb)["logprobs"]).float()
            if policy.has_values:
                values[idx] = pad(policy.forward(mb, with_values=True)["values"]).float()
    token_rewards = place_outcome_reward(batch.scores, mask)
    stats = {}
    if need_ref:
        kl = kl_estimate(batch.old_logprobs, ref, cfg.kl_kind, mask=mask)
        # Mean over every rank's action tokens, so an adaptive KL coefficient stays equal on all ranks.
        kl_sum, n_tok = all_sum([float((kl * mask).sum()), float(mask.sum())])
        stats["kl_ref"] = kl_sum / max(n_tok, 1.0)
        if cfg.kl_in_reward:
            token_rewards = kl_penalty_in_reward(token_rewards, kl, mask, kl_coef)
    # Estimators that whiten over the batch do it over every rank's rows (one all-reduce).
    reduce = (lambda t: t.new_tensor(all_sum(t.tolist()))) if is_distributed() else None
    # Each estimator gets those of these settings it takes (gamma/lam for the token-level ones).
    offered = {"gamma": cfg.gamma, "lam": cfg.lam, "reduce": reduce}
    settings = {k: v for k, v in offered.items() if k in ADVANTAGE_ESTIMATORS[cfg.estimator].settings}
    # Group estimators read `scores`; a KL-in-reward penalty only reaches token-level ones.
    adv, ret = compute_advantages(cfg.estimator, scores=batch.scores, token_rewards=token_rewards,
                                  values=values, mask=mask, group_ids=batch.group_ids,
                                  logprobs=batch.old_logprobs, **settings)
    reshard(policy.module)   # FSDP keeps the root's weights gathered after a forward with no backward
    return Prepared(batch, adv, ret, values, ref, stats)


def update_on(policy: Policy, optimizer, learn: list, cfg: AlgoConfig, kl_coef: float, max_grad_norm: float,
              *, seed: int, step: int, critic_only: bool, single_rank: bool) -> tuple[Prepared | None, dict]:
    """The gradient steps of one RL step on the trajectories `learn` -> (prepared targets or None, stats).

    The batch is collated once; with `cfg.drop_flat_groups` the update takes only the rows of
    groups whose rewards differ, while `action_entropy` (which guard.entropy_floor reads) covers
    them all, flat (often collapsed) groups included. No update is taken when every group is flat,
    or when the policy took no action in any row (a retriever whose frozen generator never
    searched), and the stats say so. `seed` seeds the minibatch order.
    """
    batch = policy.collate(learn)   # `prepare` moves it to the policy's device
    kept = rows_of_informative_groups(learn) if cfg.drop_flat_groups else list(range(len(learn)))
    update_batch = batch if len(kept) == len(learn) else batch.select(kept) if kept else None
    prep = None
    if update_batch is None:
        log.info("step %d: every group's rewards are equal (algo.drop_flat_groups); the update is skipped", step)
        stats = {"updates": 0.0, "update_skipped": 1.0}
    elif single_rank and float(update_batch.action_mask.sum()) == 0:
        # One rank only: under several, a rank that skipped would leave the others waiting in the
        # gradient all-reduce, so every rank takes the (zero) update.
        log.warning("step %d: no action of the policy in %d trajectories; the update is skipped", step, len(learn))
        stats = {"updates": 0.0, "update_skipped": 1.0}
    else:
        prep = prepare(policy, update_batch, cfg, kl_coef, cfg.micro_batch_size)
        stats = ppo_update(policy, optimizer, prep, cfg, kl_coef, max_grad_norm,
                           torch.Generator().manual_seed(seed), critic_only=critic_only)
    stats["critic_only"] = float(critic_only)
    stats["update_trajectories"] = float(len(kept))
    stats["guard/nonfinite_skipped"] = float(stats.pop("nonfinite_skipped", 0))
    if float(batch.action_mask.sum()):
        stats["action_entropy"] = sampled_entropy(batch.old_logprobs, batch.action_mask)
    return prep, stats


def row_lengths(batch: ActionBatch) -> torch.Tensor | None:
    """Tokens per row of a token-level batch; None for one without them (a retriever's)."""
    mask = getattr(batch, "attention_mask", None)
    return mask.sum(1) if mask is not None else None


def by_length(idx: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """`idx` [N] reordered by `lengths[idx]` (ascending, ties kept in order), so consecutive micro
    batches pad to similar lengths: an MMOA-RAG selector prompt is ~8x its rewriter's, and a
    shuffled micro batch pads every row to its longest. The minibatch (and so its loss, a sum
    over micro batches) is unchanged.

    >>> by_length(torch.tensor([4, 0, 2]), torch.tensor([9, 5, 1, 5, 3])).tolist()
    [2, 4, 0]
    """
    if lengths is None:
        return idx
    lengths = lengths.to(idx.device)  # the batch may live on the GPU, the permutation on the CPU
    return idx[torch.argsort(lengths[idx], stable=True)]


def ppo_update(policy: Policy, optimizer, prep: Prepared, cfg: AlgoConfig, kl_coef: float,
               max_grad_norm: float, generator: torch.Generator, critic_only: bool = False) -> dict:
    """Run cfg.ppo_epochs over shuffled minibatches; return averaged stats.

    critic_only (critic warm-up): the loss is the value loss alone and only the value head steps;
    the policy's own parameters get no gradient (None, so Adam leaves them and their state alone)."""
    params = policy.trainable_parameters()
    others: list[torch.nn.Parameter] = []
    if critic_only:
        if not policy.has_values:
            raise ValueError("critic_only needs a policy with a value head")
        kl_coef = 0.0   # no KL term either: nothing of the policy is trained
        critic = {id(p) for p in policy.value_head.parameters()}
        others = [p for p in params if id(p) not in critic]
        params = [p for p in params if id(p) in critic]
    try:
        # No graph through the trunk, so the backward runs through the value head alone.
        for p in others:
            p.requires_grad_(False)
        return _epochs(policy, optimizer, prep, cfg, kl_coef, max_grad_norm, generator, params, others, critic_only)
    finally:
        for p in others:
            p.requires_grad_(True)
            p.grad = None


def _epochs(policy, optimizer, prep, cfg, kl_coef, max_grad_norm, generator, params, others, critic_only) -> dict:
    batch = prep.batch
    B = len(batch)
    agg = cfg.loss_agg
    sharded = is_sharded(policy.module)
    # minibatch_size counts trajectories over all ranks: each rank takes its share, so N ranks
    # make as many optimizer steps per epoch as one process (ranks hold equal row counts).
    world = dist.get_world_size() if is_distributed() else 1
    local_mb = -(-cfg.minibatch_size // world)
    lengths = row_lengths(batch)
    stats_sum: dict[str, float] = {}
    n_updates = n_micro = n_skipped = 0
    for _ in range(cfg.ppo_epochs):
        order = torch.randperm(B, generator=generator)
        for s in range(0, B, local_mb):
            mb_idx = by_length(order[s: s + local_mb], lengths)
            mask_mb = batch.action_mask[mb_idx]
            # Global denominators: the loss of each micro batch is its share of the minibatch mean.
            denom = all_sum([float(mask_mb.sum()) if agg == "token_mean" else float((mask_mb.sum(1) > 0).sum())])[0]
            optimizer.zero_grad(set_to_none=True)
            finite = True
            for m in range(0, len(mb_idx), cfg.micro_batch_size):
                idx = mb_idx[m: m + cfg.micro_batch_size]
                st = _micro_step(policy, prep, idx, cfg, kl_coef, agg, denom, critic_only)
                finite = finite and math.isfinite(st["loss"])
                n_micro += 1
                for k, v in st.items():
                    if math.isfinite(v):   # one poisoned micro batch must not turn the step's means into NaN
                        stats_sum[k] = stats_sum.get(k, 0.0) + v
            for p in others:   # a per-agent forward may have switched their grads back on: drop them
                p.grad = None
            _sync_grads(params)
            gn = float(clip_grad_norm(params, max_grad_norm) if sharded
                       else torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
            if world > 1:   # every rank must take the same decision: a NaN loss on one skips them all
                finite = all_sum([0.0 if finite else 1.0])[0] == 0
            if not (finite and math.isfinite(gn)):
                # A non-finite loss or gradient would write NaN into the weights and Adam's moments
                # for good: the optimizer step is not taken (guard.nonfinite_steps counts such steps).
                log.warning("update skipped: non-finite %s", "loss" if not finite else f"gradient norm ({gn})")
                optimizer.zero_grad(set_to_none=True)
                n_skipped += 1
                continue
            stats_sum["grad_norm"] = stats_sum.get("grad_norm", 0.0) + gn
            optimizer.step()
            n_updates += 1
    # Averages over the micro batches actually run (a batch smaller than minibatch_size runs
    # fewer than minibatch_size / micro_batch_size of them).
    out = {k: v / max(1, n_updates if k == "grad_norm" else n_micro) for k, v in stats_sum.items()}
    out["updates"] = n_updates
    out["nonfinite_skipped"] = n_skipped
    return out


def _micro_step(policy: Policy, prep: Prepared, idx: torch.Tensor, cfg: AlgoConfig,
                kl_coef: float, agg: str, denom: float, critic_only: bool = False) -> dict:
    mb = prep.batch.select(idx)
    L = mb.action_mask.shape[1]
    adv, ret = prep.advantages[idx][:, :L], prep.returns[idx][:, :L]
    mask = mb.action_mask
    out = policy.forward(mb, with_values=policy.has_values, with_entropy=cfg.entropy_coef > 0 and not critic_only)
    # Scale so the sum over micro batches (and ranks) equals the minibatch mean.
    share = (float(mask.sum()) if agg == "token_mean" else float((mask.sum(1) > 0).sum())) / max(denom, 1.0)
    pg, st = POLICY_LOSSES[cfg.policy_loss](out["logprobs"], mb.old_logprobs, adv, mask, cfg)
    loss = pg.detach() if critic_only else pg   # critic warm-up: logged, not trained on
    st = {k: v for k, v in st.items()}
    st["pg_loss"] = float(pg.detach())
    if kl_coef > 0 and not cfg.kl_in_reward:
        kl = kl_estimate(out["logprobs"], prep.ref_logprobs[idx][:, :L], cfg.kl_kind, mask=mask)
        kl_term = agg_loss(kl, mask, agg)
        loss = loss + kl_coef * kl_term
        st["kl_loss"] = float(kl_term.detach())
    if out["entropy"] is not None:
        ent = agg_loss(out["entropy"], mask, agg)
        loss = loss - cfg.entropy_coef * ent
        st["entropy"] = float(ent.detach())
    if policy.has_values:
        value_coef, value_clip = cfg.critic
        vl, vst = value_loss(out["values"], prep.old_values[idx][:, :L], ret, mask, value_clip, agg)
        loss = loss + value_coef * vl
        st.update(vst, value_loss=float(vl.detach()))
    (loss * share).backward()
    st["loss"] = float(loss.detach())
    return st


def _sync_grads(params: list[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks (each rank's loss is already divided by the global count).
    Sharded (FSDP) parameters are skipped: their backward already reduce-scattered the sum."""
    if not is_distributed():
        return
    for p in params:
        if is_dtensor(p):
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
