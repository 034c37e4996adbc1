"""Advantage estimators and policy losses by name, each behind one call signature, for recipes
(`algo.estimator`, `algo.policy_loss`). Both are `ragrl.registry.Registry`s like the protocols and
rewards: a method adds its own through its record (`Method.estimators`, `Method.policy_losses`).

    advantages, returns = compute_advantages("grpo", scores=s, mask=m, group_ids=g, eps=1e-6)
    loss, stats = POLICY_LOSSES["ppo_clip"](logprobs, old_logprobs, advantages, mask, algo_cfg)

Every entry of ADVANTAGE_ESTIMATORS takes keyword arguments
`scores [B] | None, token_rewards [B, T] | None, values [B, T] | None, mask [B, T],
group_ids [B] | None, logprobs [B, T] | None (the acting policy's, on action tokens), **cfg` and
returns `(advantages [B, T], returns [B, T])`.
Outcome rewards and token rewards convert into each other: a missing `token_rewards`
is `place_outcome_reward(scores)`, a missing `scores` is the sum of `token_rewards`
over action tokens.
"""
from __future__ import annotations

import functools
import inspect

import torch

from ragrl.algos import advantages as adv
from ragrl.algos.losses import ppo_policy_loss
from ragrl.algos.masked import AlgoInputError, masked_sum
from ragrl.errors import ConfigError
from ragrl.registry import Registry

_DATA_ARGS = ("scores", "token_rewards", "values", "mask", "group_ids", "logprobs")


def uniform_estimator(fn, needs: tuple[str, ...], **fixed):
    """Wrap estimator `fn` so it takes the uniform keyword signature; `needs` are the data
    arguments it reads, `fixed` the settings the name implies (e.g. dr_grpo: no std). What an
    entry of ADVANTAGE_ESTIMATORS (and of `Method.estimators`) is."""
    allowed = [p for p in inspect.signature(fn).parameters if p not in _DATA_ARGS and p not in fixed]

    @functools.wraps(fn)
    def estimator(*, scores=None, token_rewards=None, values=None, mask, group_ids=None, logprobs=None, **cfg):
        data = {"scores": scores, "token_rewards": token_rewards, "values": values, "mask": mask,
                "group_ids": group_ids, "logprobs": logprobs}
        unknown = sorted(set(cfg) - set(allowed))
        if unknown:
            raise ConfigError(f"{fn.__name__} does not take {', '.join(unknown)}; "
                              f"its settings are {', '.join(allowed) or 'none'}")
        missing = [name for name in needs if data[name] is None]
        if missing:
            raise AlgoInputError(f"{fn.__name__} needs {', '.join(missing)}")
        return fn(**{name: data[name] for name in needs}, **fixed, **cfg)

    estimator.needs = needs
    estimator.settings = tuple(allowed)
    return estimator


ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", {
    "gae": uniform_estimator(adv.gae, ("token_rewards", "values", "mask")),
    # GAE on group-centred outcomes: PPO with a critic, sampled n times a prompt (MMOA-RAG's MAPPO).
    "gae_baseline": uniform_estimator(adv.gae, ("token_rewards", "values", "mask", "group_ids")),
    "grpo": uniform_estimator(adv.grpo, ("scores", "group_ids", "mask")),
    "dr_grpo": uniform_estimator(adv.grpo, ("scores", "group_ids", "mask"), scale_by_std=False),
    "rloo": uniform_estimator(adv.rloo, ("scores", "group_ids", "mask")),
    # Each option of a choice once in a group (rollout.title_group: every), weighed by the policy's probability.
    "enumerated": uniform_estimator(adv.enumerated, ("scores", "group_ids", "mask", "logprobs")),
    "reinforce_pp": uniform_estimator(adv.reinforce_pp, ("token_rewards", "mask")),
    "reinforce_pp_baseline": uniform_estimator(adv.reinforce_pp, ("token_rewards", "mask", "group_ids")),
})


def ppo_clip(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             cfg) -> tuple[torch.Tensor, dict]:
    """`ppo_policy_loss` with the `algo:` section's clip_low, clip_high, dual_clip and loss_agg.
    Every entry of POLICY_LOSSES takes (logprobs, old_logprobs, advantages, mask [B, T], cfg) and
    returns (scalar loss, stats); `cfg` is the AlgoConfig."""
    return ppo_policy_loss(logprobs, old_logprobs, advantages, mask, cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                           cfg.loss_agg)


POLICY_LOSSES: Registry = Registry("policy loss", {"ppo_clip": ppo_clip})


def compute_advantages(name: str, *, scores: torch.Tensor | None = None,
                       token_rewards: torch.Tensor | None = None, values: torch.Tensor | None = None,
                       mask: torch.Tensor, group_ids=None, logprobs: torch.Tensor | None = None,
                       **cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator called `name` (a key of ADVANTAGE_ESTIMATORS) with settings `cfg`."""
    estimator = ADVANTAGE_ESTIMATORS[name]   # an unknown name: ConfigError naming the known ones
    if token_rewards is None and scores is not None:
        token_rewards = adv.place_outcome_reward(scores, mask)
    if scores is None and token_rewards is not None:
        scores = masked_sum(token_rewards, mask, dim=-1)
    return estimator(scores=scores, token_rewards=token_rewards, values=values, mask=mask, group_ids=group_ids,
                     logprobs=logprobs, **cfg)
