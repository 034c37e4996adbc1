"""Advantage estimators: pure functions from rewards (and values) to per-token advantages.

Shapes: B = sequences in the batch, T = tokens per sequence (prompt and observation
tokens included or not: only `mask` decides which tokens are actions).
Every estimator returns `(advantages[B, T], returns[B, T])`, both 0 where mask is 0,
and none of them carries gradient (they are targets, not predictions).

Rewards come either as a scalar outcome per sequence, `scores[B]`, or as token-level
rewards `token_rewards[B, T]`; `place_outcome_reward` turns the first into the second
by putting each score on the sequence's last action token.
"""
from __future__ import annotations

import torch

from ragrl.algos.masked import AlgoInputError, check_same_shape, masked_sum, masked_whiten

# --------------------------------------------------------------------------- helpers

def _check_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.dim() != 2:
        raise AlgoInputError(f"the action mask must be [B, T], got shape {tuple(mask.shape)}")
    return mask.bool()


def _check_scores(scores: torch.Tensor, mask: torch.Tensor) -> None:
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise AlgoInputError(
            f"scores must be [B] with B={mask.shape[0]} (one per sequence), got {tuple(scores.shape)}")


def _check_no_reward_off_actions(token_rewards: torch.Tensor, mask: torch.Tensor) -> None:
    # The recursions below only visit action tokens, so a reward on an observation
    # token would be dropped without a word. Say so instead.
    off = torch.where(mask, torch.zeros_like(token_rewards), token_rewards)
    if bool((off != 0).any()):
        raise AlgoInputError(
            "token_rewards are non-zero on tokens outside the action mask; put rewards on action "
            "tokens (place_outcome_reward puts an outcome on the last action token)")


def last_action_index(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of the last action token per row, and whether the row has any.
    mask [B, T] → (index [B] long, has_action [B] bool); index is 0 for empty rows."""
    m = _check_mask(mask)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    index = torch.where(m, positions, torch.zeros_like(positions)).argmax(dim=-1)
    return index, m.any(dim=-1)


def place_outcome_reward(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Put each sequence's scalar reward on its last action token.

    scores [B], mask [B, T] → token_rewards [B, T] (float). A sequence with no action
    token gets no reward anywhere: there is no token to credit it to.
    """
    m = _check_mask(mask)
    _check_scores(scores, m)
    index, has_action = last_action_index(m)
    rewards = torch.zeros(m.shape, dtype=torch.float32 if not scores.is_floating_point()
                          else scores.dtype, device=m.device)
    value = torch.where(has_action, scores.to(rewards.dtype), torch.zeros_like(rewards[:, 0]))
    return rewards.scatter(1, index[:, None], value[:, None])


def group_index(group_ids, batch_size: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Map arbitrary group ids (tensor, or a list of ints/strings) to dense indices.
    → (index [B] long in 0..G-1, group sizes [G] long)."""
    if isinstance(group_ids, torch.Tensor):
        ids = group_ids.reshape(-1)
        if ids.shape[0] != batch_size:
            raise AlgoInputError(f"group_ids has {ids.shape[0]} entries for a batch of {batch_size}")
        _, index = torch.unique(ids, return_inverse=True)
    else:
        ids = list(group_ids)
        if len(ids) != batch_size:
            raise AlgoInputError(f"group_ids has {len(ids)} entries for a batch of {batch_size}")
        dense: dict = {}
        index = torch.tensor([dense.setdefault(g, len(dense)) for g in ids], dtype=torch.long)
    index = index.to(device)
    return index, torch.bincount(index)


def _group_mean(scores: torch.Tensor, index: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Per-group mean of scores [B] → [G]."""
    sums = torch.zeros(sizes.shape[0], dtype=scores.dtype, device=scores.device).index_add(0, index, scores)
    return sums / sizes.to(scores.dtype)


def _broadcast(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] → [B, T]: the sequence's value on each of its action tokens, 0 elsewhere."""
    return torch.where(mask, per_sequence[:, None].expand(mask.shape), torch.zeros((), dtype=per_sequence.dtype,
                                                                                   device=mask.device))


def _discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t'} where t' is the next *action* token (observation tokens
    are skipped, as in GAE below). rewards, mask [B, T] → [B, T], 0 off the mask."""
    running = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        out.append(torch.where(mask[:, t], running, torch.zeros_like(running)))
    return torch.stack(out[::-1], dim=1)


# --------------------------------------------------------------------------- estimators

def subtract_group_baseline(rewards: torch.Tensor, mask: torch.Tensor, group_ids) -> torch.Tensor:
    """rewards [B, T] with each sequence's group-mean outcome (outcome = the sum of its token
    rewards) subtracted on its last action token, so every group's outcomes average 0.

    >>> r = torch.tensor([[0., 1.], [0., 0.], [0., 3.]]); m = torch.ones(3, 2, dtype=torch.bool)
    >>> subtract_group_baseline(r, m, [0, 0, 7]).tolist()   # group 0: mean 0.5; group 7 alone: mean 3
    [[0.0, 0.5], [0.0, -0.5], [0.0, 0.0]]
    """
    outcome = rewards.sum(dim=-1)
    index, sizes = group_index(group_ids, outcome.shape[0], outcome.device)
    baseline = _group_mean(outcome, index, sizes)[index]
    last, has_action = last_action_index(mask)
    shift = torch.where(has_action, baseline, torch.zeros_like(baseline))
    return rewards.scatter_add(1, last[:, None], -shift[:, None])


@torch.no_grad()
def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
        gamma: float = 1.0, lam: float = 1.0, whiten: bool = True,
        reduce=None, group_ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over ACTION tokens only (PPO with a critic).

    token_rewards, values, mask: [B, T] → (advantages [B, T], returns [B, T]).

    A multi-turn trajectory is `prompt, action, observation, action, observation, ...`;
    the observation tokens (retrieved documents) were not chosen by the policy, so the
    MDP step after action token t is the next *action* token t', not t+1:

        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lam * A_{t'}

    with V and A of "after the last action" equal to 0. The backward recursion carries
    (next value, next advantage) unchanged across masked positions, so the result equals
    GAE on the compacted action-only sequence (the multi-turn fix used by Search-R1/verl).
    Rewards must sit on action tokens (an error is raised otherwise); values at
    observation positions are never read.

    returns = advantages + values (before whitening) are the critic's targets; with
    `whiten`, advantages are normalised to mean 0 / std 1 over all action tokens.

    With `group_ids` [B] (the n samples of one prompt share an id), each sequence's reward is
    first centred on its group's mean outcome (subtract_group_baseline): the critic then only has
    to learn what the *action* adds, not how hard the question is, which it cannot tell apart
    from a handful of samples of a small value head (MMOA-RAG's questions vary far more than its
    agents' choices do). With gamma=1 the critic's targets average 0 in every group.
    """
    m = _check_mask(mask)
    check_same_shape(m, token_rewards=token_rewards, values=values)
    _check_no_reward_off_actions(token_rewards, m)
    values = values.detach().to(torch.promote_types(values.dtype, token_rewards.dtype))
    rewards = token_rewards.detach().to(values.dtype)
    if group_ids is not None:
        rewards = subtract_group_baseline(rewards, m, group_ids)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    zero = torch.zeros_like(next_adv)
    out = []
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        is_action = m[:, t]
        next_value = torch.where(is_action, values[:, t], next_value)
        next_adv = torch.where(is_action, adv_t, next_adv)
        out.append(torch.where(is_action, adv_t, zero))
    advantages = torch.stack(out[::-1], dim=1)
    returns = torch.where(m, advantages + values, torch.zeros_like(values))
    if whiten:
        advantages = masked_whiten(advantages, m, reduce=reduce)
    return advantages, returns


@torch.no_grad()
def grpo(scores: torch.Tensor, group_ids, mask: torch.Tensor, eps: float = 1e-6,
         scale_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantage: (s - mean_g) / (std_g + eps), the same on every action
    token of a sequence (GRPO). scale_by_std=False gives Dr. GRPO's (s - mean_g).

    scores [B], group_ids [B] (the n samples of one question share an id), mask [B, T]
    → (advantages [B, T], returns [B, T]) with returns == advantages (no critic).
    std_g is the unbiased sample std. A group of one sample has no baseline to compare
    against, so its advantage is 0 (it contributes nothing, rather than noise).
    """
    m = _check_mask(mask)
    _check_scores(scores, m)
    scores = scores.detach().to(torch.promote_types(scores.dtype, torch.float32))
    index, sizes = group_index(group_ids, scores.shape[0], scores.device)
    centered = scores - _group_mean(scores, index, sizes)[index]
    if scale_by_std:
        sq = torch.zeros(sizes.shape[0], dtype=scores.dtype, device=scores.device).index_add(0, index, centered ** 2)
        std = (sq / (sizes - 1).clamp(min=1).to(scores.dtype)).sqrt()
        scale = std[index] + eps
        # eps=0 with a group of equal scores would be 0/0; such a group carries no signal.
        centered = torch.where(scale > 0, centered / scale.clamp(min=torch.finfo(scale.dtype).tiny),
                               torch.zeros_like(centered))
    per_sequence = torch.where(sizes[index] > 1, centered, torch.zeros_like(centered))
    advantages = _broadcast(per_sequence, m)
    return advantages, advantages.clone()


@torch.no_grad()
def rloo(scores: torch.Tensor, group_ids, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out: A_i = s_i - mean_{j != i, same group} s_j, on every action token.

    Equivalently n/(n-1) * (s_i - mean_g). scores [B], group_ids [B], mask [B, T]
    → (advantages [B, T], returns [B, T]); groups of one get 0 (no other sample to
    form a baseline from).
    """
    m = _check_mask(mask)
    _check_scores(scores, m)
    scores = scores.detach().to(torch.promote_types(scores.dtype, torch.float32))
    index, sizes = group_index(group_ids, scores.shape[0], scores.device)
    sums = torch.zeros(sizes.shape[0], dtype=scores.dtype, device=scores.device).index_add(0, index, scores)
    n = sizes[index].to(scores.dtype)
    others_mean = (sums[index] - scores) / (n - 1).clamp(min=1)
    per_sequence = torch.where(n > 1, scores - others_mean, torch.zeros_like(scores))
    advantages = _broadcast(per_sequence, m)
    return advantages, advantages.clone()


@torch.no_grad()
def enumerated(scores: torch.Tensor, group_ids, mask: torch.Tensor,
               logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact policy gradient of a choice whose group holds each option once instead of samples
    of it (`rollout.title_group: every`; Expected Policy Gradients, Ciosek & Whiteson 2018).

    scores [B], group_ids [B], mask [B, T], logprobs [B, T] (each token's log-prob under the policy
    that acted; only action tokens are read) → (advantages [B, T], returns [B, T]), returns ==
    advantages. Within a group of k rows with action tokens, pi = softmax of the rows' sequence
    log-probs (the policy's probability of each option among them) and row b gets
    A_b = k * pi_b * (s_b - sum_j pi_j s_j) on every action token. The gradient of E_pi[s] is
    sum_b pi_b (s_b - baseline) grad log p_b; the k gives a group the weight k samples of it carry
    under grpo, since the loss averages over the batch's rows (or tokens).
    Rows without an action token, and groups of one, get 0.
    """
    m = _check_mask(mask)
    _check_scores(scores, m)
    check_same_shape(m, logprobs=logprobs)
    scores = scores.detach().to(torch.promote_types(scores.dtype, torch.float32))
    sequence_logp = masked_sum(logprobs.detach().to(scores.dtype), m, dim=-1)
    index, sizes = group_index(group_ids, scores.shape[0], scores.device)
    active = m.any(dim=-1)
    per_sequence = torch.zeros_like(scores)
    for g in range(sizes.shape[0]):
        rows = torch.nonzero((index == g) & active).flatten()
        if rows.numel() < 2:
            continue
        pi = torch.softmax(sequence_logp[rows], dim=0)
        baseline = (pi * scores[rows]).sum()
        per_sequence[rows] = rows.numel() * pi * (scores[rows] - baseline)
    advantages = _broadcast(per_sequence, m)
    return advantages, advantages.clone()


@torch.no_grad()
def reinforce_pp(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                 group_ids=None, reduce=None) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns over action tokens, whitened over the whole batch.

    token_rewards, mask [B, T] → (advantages [B, T], returns [B, T]).
    returns G_t = r_t + gamma * G_{next action token}. With `group_ids` (R1-Searcher's
    variant) the group-mean outcome is first subtracted from each sequence's reward on
    its last action token, so with gamma=1 every token carries (outcome - group mean),
    where outcome = sum of the sequence's token rewards; a group of one sample uses
    its own outcome as baseline. Then advantages = whiten(returns) over every action
    token in the batch (global, not per group: that is what makes it "++"); under several
    processes `reduce` (see masked_whiten) makes "the batch" every rank's rows.
    """
    m = _check_mask(mask)
    check_same_shape(m, token_rewards=token_rewards)
    _check_no_reward_off_actions(token_rewards, m)
    rewards = token_rewards.detach().to(torch.promote_types(token_rewards.dtype, torch.float32))
    if group_ids is not None:
        rewards = subtract_group_baseline(rewards, m, group_ids)
    returns = _discounted_returns(rewards, m, gamma)
    return masked_whiten(returns, m, reduce=reduce), returns


__all__ = ["place_outcome_reward", "last_action_index", "group_index", "subtract_group_baseline", "gae", "grpo",
           "rloo", "enumerated", "reinforce_pp"]
