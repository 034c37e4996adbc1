"""KL between the policy and a frozen reference, per token, and the KL coefficient controllers.

Shapes: B = sequences, T = tokens; logprobs are of the *sampled* tokens, so every
estimator below is a single-sample Monte-Carlo estimate of KL(policy || reference)
(Schulman, "Approximating KL divergence", 2020). With x = logprobs - ref_logprobs:

    k1 = x                       unbiased, high variance, can be negative
    abs = |x|
    k2 = x^2 / 2                 biased, low variance, >= 0
    k3 = exp(-x) - 1 + x         unbiased, low variance, >= 0
    low_var_kl = k3 computed with x clamped to [-20, 20] and the result to [0, 10]
                 (the stable version PPO/GRPO trainers use as a loss)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ragrl.algos.losses import agg_loss
from ragrl.algos.masked import check_same_shape
from ragrl.errors import ConfigError

KL_KINDS = ("k1", "k2", "k3", "abs", "low_var_kl")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl",
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL estimate [B, T] (see module docstring); 0 off `mask` when one is given.
    Gradient flows into `logprobs` only: the reference is frozen."""
    if kind not in KL_KINDS:
        raise ConfigError(f"unknown KL estimator {kind!r}; choose one of {', '.join(KL_KINDS)}")
    if logprobs.shape != ref_logprobs.shape:
        raise ConfigError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} differ")
    x = logprobs - ref_logprobs.detach()
    if mask is not None:
        check_same_shape(mask, logprobs=logprobs)
        x = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    if kind == "k1":
        kl = x
    elif kind == "abs":
        kl = x.abs()
    elif kind == "k2":
        kl = 0.5 * x ** 2
    elif kind == "k3":
        kl = torch.exp(-x) - 1 + x
    else:
        x = x.clamp(-20.0, 20.0)
        kl = (torch.exp(-x) - 1 + x).clamp(0.0, 10.0)
    return kl


def kl_penalty_in_reward(token_rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor,
                         coef: float) -> torch.Tensor:
    """Shaped rewards r_t - coef * kl_t on action tokens (PPO-RLHF style; pair with GAE or
    REINFORCE++). token_rewards, kl, mask [B, T] → [B, T]; kl is detached (it is reward).
    Off the mask the rewards are returned as given."""
    check_same_shape(mask, token_rewards=token_rewards, kl=kl)
    penalty = torch.where(mask.bool(), kl.detach().to(token_rewards.dtype),
                          torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device))
    return token_rewards - coef * penalty


def kl_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
            kind: str = "low_var_kl", agg: str = "token_mean") -> torch.Tensor:
    """KL(policy || reference) as a loss term (GRPO style): scalar, gradient into logprobs."""
    return agg_loss(kl_estimate(logprobs, ref_logprobs, kind, mask=mask), mask, agg)


@dataclass
class FixedKLController:
    """A constant KL coefficient; `update` does nothing (same interface as the adaptive one)."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


@dataclass
class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (2019), used by SmartRAG's PPO.

    After each batch of `n_steps` samples with observed KL `current_kl`:
        e = clip(current_kl / target - 1, -0.2, 0.2)
        value *= 1 + e * n_steps / horizon
    so the coefficient grows when the policy drifts past the target and shrinks below it,
    by at most 20% per `horizon` samples.
    """

    value: float
    target: float
    horizon: int

    def __post_init__(self):
        if self.target <= 0 or self.horizon <= 0:
            raise ConfigError(f"adaptive KL needs target > 0 and horizon > 0, got {self.target}, {self.horizon}")

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), int(state["horizon"])


@dataclass
class RL4LMsKLController:
    """RL4LMs' adaptive KL coefficient (SmartRAG's PPO config: initial 0.001, target 0.2).

    After each update with observed KL `current_kl`:
        value *= 1 + 0.1 * clip((current_kl - target) / target, -0.2, 0.2)
    i.e. at most ±2% per update, whatever the batch size (unlike Ziegler's, which scales with it).

    >>> c = RL4LMsKLController(0.001, 0.2)
    >>> c.update(0.3, n_steps=64); round(c.value, 10)      # error 0.5, clipped to 0.2: x1.02
    0.00102
    >>> c.update(0.15, n_steps=64); round(c.value, 10)     # error -0.25 -> -0.2: x0.98
    0.0009996
    """

    value: float
    target: float

    def __post_init__(self):
        if self.target <= 0:
            raise ConfigError(f"adaptive KL needs target > 0, got {self.target}")

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max((float(current_kl) - self.target) / self.target, -0.2), 0.2)
        self.value *= 1.0 + 0.1 * error

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.target = float(state["value"]), float(state["target"])


KL_CONTROLLERS = ("ziegler", "rl4lms")


def make_kl_controller(coef: float, target: float | None = None, horizon: int = 10000, kind: str = "ziegler"):
    """Adaptive controller (`kind`: ziegler or rl4lms) when a target KL is given, fixed otherwise."""
    if target is None:
        return FixedKLController(coef)
    if kind == "rl4lms":
        return RL4LMsKLController(coef, target)
    if kind != "ziegler":
        raise ConfigError(f"algo.kl_controller must be one of {', '.join(KL_CONTROLLERS)}; got {kind!r}")
    return AdaptiveKLController(coef, target, horizon)
