"""A causal LM as a Policy: actions are the tokens it generated (Search-R1, R1-Searcher, ...).

A thin adapter over `ragrl.policy.lm_model` (model loading, LoRA, the frozen KL reference, the
one-pass `forward_actions`) and `ragrl.policy.batch.collate` (token-level [B, L] batches).

With `agents` (MMOA-RAG's per-agent adapters, ragrl.models.agent_adapters), a batch's rows run
under their own agent's adapter: one forward per agent present, results put back in row order."""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ragrl.models.agent_adapters import activate_agent, agent_adapter_map, reference_context
from ragrl.policy.base import ValueHeadPolicy
from ragrl.policy.batch import TrajBatch, collate
from ragrl.policy.lm_model import ValueHead, forward_actions


class LMPolicy(ValueHeadPolicy):
    def __init__(self, model: nn.Module, tokenizer, value_head: ValueHead | None = None,
                 agents: tuple[str, ...] = ()):
        self.module, self.tok, self.value_head = model, tokenizer, value_head
        self.has_values = value_head is not None
        # Agent names whose rows switch adapters; () unless the model has per-agent adapters.
        self.agents = tuple(agents) if agent_adapter_map(model) else ()
        self._in_reference = False

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def collate(self, trajs: list) -> TrajBatch:
        return collate(trajs, self.tok.pad_token_id, self.agents)

    def forward(self, batch: TrajBatch, *, with_values: bool = False, with_entropy: bool = False) -> dict:
        run = lambda b: forward_actions(self.module, b.input_ids, b.attention_mask, b.action_mask,  # noqa: E731
                                        value_head=self.value_head if with_values else None,
                                        with_entropy=with_entropy)
        ids = batch.agent_ids
        if not self.agents or ids is None or self._in_reference:   # the reference is one adapter for all
            return run(batch)
        present = ids.unique().tolist()
        if len(present) == 1:
            activate_agent(self.module, self.agents[present[0]] if present[0] >= 0 else None)
            return run(batch)
        B, L = batch.input_ids.shape
        out: dict = {}
        for a in present:
            rows = (ids == a).nonzero(as_tuple=True)[0]
            activate_agent(self.module, self.agents[a] if a >= 0 else None)
            part = run(batch.select(rows))
            for key, t in part.items():
                if t is None:
                    out[key] = None
                    continue
                full = out.get(key)
                if full is None:
                    full = t.new_zeros(B, L)
                t = torch.nn.functional.pad(t, (0, L - t.shape[1]))
                out[key] = full.index_put((rows.to(t.device),), t)   # out of place: keeps autograd
        return out

    @contextlib.contextmanager
    def reference(self):
        with reference_context(self.module):
            self._in_reference = True
            try:
                yield
            finally:
                self._in_reference = False
