"""A causal LM as a Policy: actions are the tokens it generated (Search-R1, R1-Searcher, ...).

A thin adapter over `ragrl.train.policy` (model loading, LoRA, the frozen KL reference, the
one-pass `forward_actions`) and `ragrl.train.batch.collate` (token-level [B, L] batches)."""
from __future__ import annotations

import torch
from torch import nn

from ragrl.policy.base import ValueHeadPolicy
from ragrl.train.batch import TrajBatch, collate
from ragrl.train.policy import ValueHead, forward_actions, reference_context


class LMPolicy(ValueHeadPolicy):
    def __init__(self, model: nn.Module, tokenizer, value_head: ValueHead | None = None):
        self.module, self.tok, self.value_head = model, tokenizer, value_head
        self.has_values = value_head is not None

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def collate(self, trajs: list) -> TrajBatch:
        return collate(trajs, self.tok.pad_token_id)

    def forward(self, batch: TrajBatch, *, with_values: bool = False, with_entropy: bool = False) -> dict:
        return forward_actions(self.module, batch.input_ids, batch.attention_mask, batch.action_mask,
                               value_head=self.value_head if with_values else None, with_entropy=with_entropy)

    def reference(self):
        return reference_context(self.module)
