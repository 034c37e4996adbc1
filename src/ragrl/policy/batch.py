"""Trajectories → padded tensors for the losses.

Every tensor is [B, L] over the *whole* sequence (prompt + actions + observations), right
padded. `action_mask` is 1 exactly where the policy generated the token, so every loss,
KL, entropy and value term that multiplies by it ignores prompt, retrieved and pad tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from ragrl.rollout.trajectory import Trajectory


@dataclass
class TrajBatch:
    input_ids: torch.Tensor        # [B, L] long
    attention_mask: torch.Tensor   # [B, L] long, 1 on real tokens
    action_mask: torch.Tensor      # [B, L] float, 1 on policy tokens
    old_logprobs: torch.Tensor     # [B, L] float, sampling log-probs (0 off the action mask)
    scores: torch.Tensor           # [B] float, outcome reward per trajectory
    group_ids: torch.Tensor        # [B] long
    # [B] long: each row's agent, an index into the policy's agent names (-1: none). Only where
    # the agents have adapters of their own (MMOA-RAG, agent_adapters: per_agent); else None.
    agent_ids: torch.Tensor | None = None
    # [B, L, H]: each row's states after the decoder's frozen bottom `trunk_depth` layers, kept for
    # an update's forwards (ragrl.policy.frozen_trunk); None until `LMPolicy.with_frozen_trunk`.
    trunk: torch.Tensor | None = None
    trunk_depth: int = 0

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor | list[int]) -> "TrajBatch":
        """Rows `idx`, trimmed to the longest remaining sequence (saves compute)."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        length = int(self.attention_mask[idx].sum(1).max())
        return self._map(lambda t: t[idx][:, :length] if t.dim() >= 2 else t[idx])

    def to(self, device: torch.device | str) -> "TrajBatch":
        """The same batch on `device` (the policy's: the losses run where the model is)."""
        return self._map(lambda t: t.to(device))

    def _map(self, fn) -> "TrajBatch":
        return replace(self, **{name: fn(t) for name, t in self._named_tensors().items()})

    def _named_tensors(self) -> dict[str, torch.Tensor]:
        """The fields holding a tensor, in field order (optional ones left out where None)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(self._named_tensors().values())


def collate(trajs: list[Trajectory], pad_id: int, agents: tuple[str, ...] = ()) -> TrajBatch:
    """Right-pad trajectories into a TrajBatch (scores from `traj.reward`); with `agents`, each
    row's `agent_ids` is its trajectory's agent's index in them (-1 for none of them)."""
    length = max(len(t.token_ids) for t in trajs)
    B = len(trajs)
    ids = torch.full((B, length), pad_id, dtype=torch.long)
    attn = torch.zeros((B, length), dtype=torch.long)
    act = torch.zeros((B, length), dtype=torch.float32)
    old = torch.zeros((B, length), dtype=torch.float32)
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        if not (len(t.action_mask) == len(t.logprobs) == n):
            raise ValueError(f"trajectory {t.sample_id}: ids/mask/logprobs lengths differ")
        ids[i, :n] = torch.tensor(t.token_ids)
        attn[i, :n] = 1
        act[i, :n] = torch.tensor(t.action_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    act[:, 0] = 0.0  # position 0 has no preceding context to predict it from
    agent_ids = torch.tensor([agents.index(t.agent) if t.agent in agents else -1 for t in trajs],
                             dtype=torch.long) if agents else None
    return TrajBatch(ids, attn, act, old, torch.tensor([t.reward for t in trajs], dtype=torch.float32),
                     torch.tensor([t.group for t in trajs], dtype=torch.long), agent_ids)
