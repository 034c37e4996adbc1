"""A causal LM as a Policy: actions are the tokens it generated (Search-R1, R1-Searcher, ...).

A thin adapter over `ragrl.policy.lm_model` (model loading, LoRA, the frozen KL reference, the
one-pass `forward_actions`) and `ragrl.policy.batch.collate` (token-level [B, L] batches).

With `agents` (MMOA-RAG's per-agent adapters, ragrl.models.agent_adapters), a batch's rows run
under their own agent's adapter: one forward per agent present, results put back in row order."""
from __future__ import annotations

import contextlib
import dataclasses
import logging

import torch
from torch import nn

from ragrl.models.agent_adapters import activate_agent, agent_adapter_map, reference_context
from ragrl.policy.base import ValueHeadPolicy
from ragrl.policy.batch import TrajBatch, collate
from ragrl.policy.frozen_trunk import frozen_depth
from ragrl.policy.lm_model import ValueHead, forward_actions, trunk_states
from ragrl.policy.logprobs import decoder_and_head


log = logging.getLogger("ragrl.train")
# The largest log-prob gap (nats) between the kept-trunk and whole-decoder forwards that is float rounding.
TRUNK_TOLERANCE = 1e-3


class LMPolicy(ValueHeadPolicy):
    def __init__(self, model: nn.Module, tokenizer, value_head: ValueHead | None = None,
                 agents: tuple[str, ...] = ()):
        self.module, self.tok, self.value_head = model, tokenizer, value_head
        self.has_values = value_head is not None
        # Agent names whose rows switch adapters; () unless the model has per-agent adapters.
        self.agents = tuple(agents) if agent_adapter_map(model) else ()
        self._in_reference = False
        # algo.reuse_frozen_trunk's check on this model, made on its first update: None until then.
        self._trunk_agrees: bool | None = None

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def collate(self, trajs: list) -> TrajBatch:
        return collate(trajs, self.tok.pad_token_id, self.agents)

    def forward(self, batch: TrajBatch, *, with_values: bool = False, with_entropy: bool = False) -> dict:
        run = lambda b: forward_actions(self.module, b.input_ids, b.attention_mask, b.action_mask,  # noqa: E731
                                        value_head=self.value_head if with_values else None,
                                        with_entropy=with_entropy, trunk=b.trunk, trunk_depth=b.trunk_depth)
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

    def with_frozen_trunk(self, batch: TrajBatch, micro_batches: list[torch.Tensor]) -> TrajBatch:
        """`batch` carrying each row's states after the decoder's frozen bottom layers, run once here
        (micro batch by micro batch, `micro_batches` holding row indices), so the update's later
        forwards run only the layers above them (ragrl.policy.frozen_trunk). The batch as it is where
        no layer is frozen, or where this model's first check found the two paths disagree."""
        depth = frozen_depth(self.module, decoder_and_head(self.module)[0])
        if depth == 0 or len(batch) == 0 or self._trunk_agrees is False:
            return batch
        B, L = batch.input_ids.shape
        if sorted(int(i) for idx in micro_batches for i in idx) != list(range(B)):
            raise ValueError("with_frozen_trunk's micro batches must hold every row of the batch once")
        states = None
        for idx in micro_batches:
            mb = batch.select(idx)
            h = trunk_states(self.module, mb.input_ids, mb.attention_mask, mb.action_mask, depth)  # [b, l, H]
            if states is None:
                states = h.new_zeros(B, L, h.shape[-1])
            states[idx.to(states.device), : h.shape[1]] = h
        kept = dataclasses.replace(batch, trunk=states, trunk_depth=depth)
        if self._trunk_agrees is None:
            self._trunk_agrees = self._kept_trunk_agrees(batch, kept, micro_batches[0], depth)
        return kept if self._trunk_agrees else batch

    @torch.no_grad()
    def _kept_trunk_agrees(self, batch: TrajBatch, kept: TrajBatch, rows: torch.Tensor, depth: int) -> bool:
        """Whether one micro batch's log-probs from the kept trunk are the whole decoder's: a decoder
        that does more between its embeddings and its first layer (Gemma scales them) would differ,
        and then every forward runs the whole decoder (said once, in the log)."""
        training = self.module.training
        self.module.eval()   # a LoRA dropout above the trunk would draw differently in the two passes
        try:
            whole = self.forward(batch.select(rows))["logprobs"]
            part = self.forward(kept.select(rows))["logprobs"]
        finally:
            self.module.train(training)
        gap = float((whole - part).abs().max()) if whole.numel() else 0.0
        if gap > TRUNK_TOLERANCE:
            log.warning("algo.reuse_frozen_trunk: log-probs from this model's kept bottom %d layers differ from "
                        "the whole decoder's by up to %.3g; every forward runs the whole decoder", depth, gap)
            return False
        log.info("update: the decoder's frozen bottom %d layers run once per trajectory (algo.reuse_frozen_trunk; "
                 "log-probs within %.1g of the whole decoder's)", depth, gap)
        return True

    @contextlib.contextmanager
    def reference(self):
        with reference_context(self.module):
            self._in_reference = True
            try:
                yield
            finally:
                self._in_reference = False
