"""The Policy interface that both a causal LM and a query encoder satisfy.

The algorithms see only [B, T] tensors over a policy's own *action positions*: for an LM the
positions are tokens (T = sequence length, action_mask 1 on generated tokens); for a retriever
they are retrieval steps (T = most searches in one trajectory, action_mask 1 on real steps).
A policy turns its trajectories into such a batch (`collate`), returns the log-probs of the
recorded actions with gradients (`forward`), and says what its reference policy is
(`reference`, a context manager inside which `forward` computes the reference's log-probs).
"""
from __future__ import annotations

from typing import ContextManager, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class ActionBatch(Protocol):
    """What the update phase reads from any policy's batch."""

    action_mask: torch.Tensor     # [B, T] float, 1 on the policy's actions
    old_logprobs: torch.Tensor    # [B, T] float, sampling log-probs (0 off the mask)
    scores: torch.Tensor          # [B] float, outcome reward per trajectory
    group_ids: torch.Tensor       # [B] long, GRPO/RLOO groups

    def __len__(self) -> int: ...

    def select(self, idx) -> "ActionBatch": ...

    def to(self, device) -> "ActionBatch": ...


@runtime_checkable
class Policy(Protocol):
    """A trainable policy. `module` is what checkpoints save (weights or a LoRA adapter);
    `extra_modules` are saved beside it by name (a value head)."""

    module: nn.Module
    has_values: bool

    @property
    def device(self) -> torch.device: ...

    def collate(self, trajs: list) -> ActionBatch: ...

    def forward(self, batch: ActionBatch, *, with_values: bool = False,
                with_entropy: bool = False) -> dict[str, torch.Tensor | None]:
        """{"logprobs": [B, T] with grad, "values": [B, T] | None, "entropy": [B, T] | None}."""
        ...

    def reference(self) -> ContextManager: ...

    def with_frozen_trunk(self, batch: ActionBatch, micro_batches: list[torch.Tensor]) -> ActionBatch:
        """`batch` with whatever of every later forward is the same each time computed once
        (an LM's frozen bottom layers, ragrl.policy.frozen_trunk), or `batch` itself."""
        ...

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def extra_modules(self) -> dict[str, nn.Module] | None: ...

    def train(self) -> None: ...

    def eval(self) -> None: ...


class ValueHeadPolicy:
    """What every policy here shares: trainable parameters are the module's (those that require
    grad) plus an optional value head's, and the value head is checkpointed beside the module."""

    module: nn.Module
    value_head: nn.Module | None

    def trainable_parameters(self) -> list[nn.Parameter]:
        params = [p for p in self.module.parameters() if p.requires_grad]
        return params + (list(self.value_head.parameters()) if self.value_head is not None else [])

    def extra_modules(self) -> dict[str, nn.Module] | None:
        return {"value_head": self.value_head} if self.value_head is not None else None

    def with_frozen_trunk(self, batch, micro_batches: list[torch.Tensor]):
        return batch   # nothing to keep: a policy with a frozen part says so by overriding this

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()
