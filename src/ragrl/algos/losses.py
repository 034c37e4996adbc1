"""Policy, value and entropy losses as pure tensor functions.

Shapes: B = sequences, T = tokens per sequence. `mask` [B, T] is the action mask; every
loss is computed on action tokens only, so prompt and retrieved-document tokens add
nothing to the loss or its gradient, whatever their log-probs or advantages hold.
Losses return `(scalar loss, stats)` where stats are plain floats for logging.
"""
from __future__ import annotations

import torch

from ragrl.algos.masked import AlgoInputError, check_same_shape, masked_count, masked_mean, masked_sum
from ragrl.errors import ConfigError

AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean") -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    token_mean:          sum over all action tokens / number of action tokens (long
                         answers weigh more; the DAPO / Dr. GRPO choice).
    seq_mean_token_sum:  mean over sequences of the per-sequence token sum.
    seq_mean_token_mean: mean over sequences of the per-sequence token mean (original
                         GRPO: every sequence weighs the same).
    Sequences with no action token are left out of the sequence means.
    """
    if mode not in AGG_MODES:
        raise ConfigError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGG_MODES)}")
    m = mask.bool()
    check_same_shape(m, loss_mat=loss_mat)
    if mode == "token_mean":
        return masked_mean(loss_mat, m)
    per_sequence = masked_sum(loss_mat, m, dim=-1)
    if mode == "seq_mean_token_mean":
        per_sequence = per_sequence / masked_count(m, dim=-1, dtype=loss_mat.dtype).clamp(min=1)
    return masked_mean(per_sequence, m.any(dim=-1))


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                    dual_clip: float | None = None, agg: str = "token_mean") -> tuple[torch.Tensor, dict]:
    """PPO clipped surrogate (also GRPO's loss), with asymmetric clip and optional dual clip.

    logprobs [B, T]: log-probs of the taken tokens under the current policy (with grad).
    old_logprobs, advantages, mask [B, T]: from the rollout; no gradient flows into them.
    Per token, with r = exp(logprobs - old_logprobs):

        loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        dual clip c > 1, where A < 0:  loss = min(that, -A c)

    The dual clip bounds the loss of a negative-advantage token whose ratio has exploded
    (the plain max would be unbounded there). The log-ratio is clamped to [-20, 20] so a
    badly stale token cannot overflow exp().

    stats: clip_frac (share of action tokens where the clipped term was the larger one),
    dual_clip_frac, ratio_mean, approx_kl = mean of (r - 1) - log r, the k3 estimate of
    KL(old || new) from tokens sampled by the old policy (>= 0, low variance).
    """
    m = mask.bool()
    check_same_shape(m, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    if not (0 <= clip_low < 1 and clip_high >= 0):
        raise ConfigError(f"PPO clip range needs 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ConfigError(f"dual_clip must be > 1 (it bounds -A * ratio from above), got {dual_clip}")

    zero = _zero(logprobs)
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), zero).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    adv = torch.where(m, advantages.detach().to(logprobs.dtype), zero)

    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    dual_active = torch.zeros_like(m)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (loss_mat > bound)
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, bound), loss_mat)

    loss = agg_loss(loss_mat, m, agg)
    with torch.no_grad():
        r = ratio.detach()
        stats = {
            "clip_frac": float(masked_mean(clip_active.to(r.dtype), m)),
            "dual_clip_frac": float(masked_mean(dual_active.to(r.dtype), m)),
            "ratio_mean": float(masked_mean(r, m)),
            "approx_kl": float(masked_mean((r - 1) - log_ratio.detach(), m)),
        }
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, agg: str = "token_mean") -> tuple[torch.Tensor, dict]:
    """Clipped critic loss, per token 0.5 * max((V - R)^2, (V_clip - R)^2) with
    V_clip = V_old + clip(V - V_old, -clip, +clip); clip=None gives plain 0.5 (V - R)^2.

    values [B, T] (with grad), old_values, returns, mask [B, T] → (scalar, stats).
    The max keeps the update pessimistic: moving V further than `clip` from V_old
    earns nothing when it would have reduced the error.
    stats: vf_clip_frac (tokens where the clipped error was the larger), value_mean.
    """
    m = mask.bool()
    check_same_shape(m, values=values, old_values=old_values, returns=returns)
    zero = _zero(values)
    v = torch.where(m, values, zero)
    target = torch.where(m, returns.detach().to(values.dtype), zero)
    unclipped = (v - target) ** 2
    if clip is None:
        loss_mat, clip_active = 0.5 * unclipped, torch.zeros_like(m)
    else:
        if clip <= 0:
            raise ConfigError(f"value clip must be > 0 (or None to disable), got {clip}")
        old = torch.where(m, old_values.detach().to(values.dtype), zero)
        v_clipped = old + (v - old).clamp(-clip, clip)
        clipped = (v_clipped - target) ** 2
        loss_mat, clip_active = 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped
    loss = agg_loss(loss_mat, m, agg)
    stats = {"vf_clip_frac": float(masked_mean(clip_active.to(v.dtype), m)),
             "value_mean": float(masked_mean(v.detach(), m))}
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: [..., V] → [...] (computed in float32+).
    Uses H = logsumexp(z) - sum_v p_v z_v, which needs no [..., V] log-prob tensor."""
    z = logits if logits.dtype == torch.float64 else logits.float()
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token entropy on action tokens, 0 elsewhere: logits [B, T, V], mask [B, T] → [B, T].
    (ragrl.policy.logprobs.action_logprobs computes it at action positions only, cheaper.)"""
    if logits.shape[:-1] != mask.shape:
        raise AlgoInputError(f"logits {tuple(logits.shape)} do not match mask {tuple(mask.shape)} + [V]")
    entropy = entropy_from_logits(logits)
    return torch.where(mask.bool(), entropy, _zero(entropy))


def entropy_loss(entropy: torch.Tensor, mask: torch.Tensor, agg: str = "token_mean") -> torch.Tensor:
    """Aggregated entropy of the action tokens (a scalar to *maximise*): entropy, mask [B, T].
    The trainer adds the bonus as `loss = pg_loss - entropy_coef * entropy_loss(...)`."""
    return agg_loss(entropy, mask, agg)
