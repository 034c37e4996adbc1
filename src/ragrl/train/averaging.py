"""Weight averaging (Polyak / EMA) of the trained parameters, for evaluation and export.

    avg = WeightAverage(policy.module, decay=0.99)
    avg.update(policy.module)            # after every optimizer step
    with avg.swapped_in(policy.module):  # evaluate / export the averaged weights
        ...

Rollouts keep sampling from the online weights (the policy the estimator's log-probs belong to);
only what is evaluated, kept as best and exported is the average. The running average is an
`nn.Module` of buffers, so the trainer checkpoints it with the other extra modules and a resumed
run continues it exactly.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ragrl.errors import ConfigError


class WeightAverage(nn.Module):
    """avg ← decay · avg + (1 − decay) · param, over `module`'s trainable parameters, starting
    from their current values. decay in (0, 1); with steps of updates the average spans roughly
    the last 1 / (1 − decay) of them."""

    def __init__(self, module: nn.Module, decay: float):
        super().__init__()
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"ema_decay must be in (0, 1) (0 turns averaging off), got {decay}")
        self.decay = float(decay)
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        for i, p in enumerate(self._params(module)):
            # Buffer names must be plain; the parameter names (with dots) are kept in order.
            self.register_buffer(f"avg_{i}", p.detach().clone().float())

    def _params(self, module: nn.Module) -> list[torch.Tensor]:
        named = dict(module.named_parameters())
        return [named[n] for n in self.names]

    def _averages(self) -> list[torch.Tensor]:
        return [getattr(self, f"avg_{i}") for i in range(len(self.names))]

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        for avg, p in zip(self._averages(), self._params(module)):
            avg.lerp_(p.detach().float(), 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self, module: nn.Module):
        """The module holds the averaged weights inside the block and its own ones again after."""
        params = self._params(module)
        online = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, avg in zip(params, self._averages()):
                p.copy_(avg.to(p.dtype))
        try:
            yield module
        finally:
            with torch.no_grad():
                for p, keep in zip(params, online):
                    p.copy_(keep)
