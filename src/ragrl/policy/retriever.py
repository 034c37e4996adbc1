"""A query encoder as a Policy (HARR): actions are Plackett–Luce draws of documents.

Each trajectory holds the retrievals it sampled (`Trajectory.retrievals`: query text, candidate
pool rows, sampled positions, old log-prob). `collate` lays them out as [B, T] over retrieval
steps; `forward` re-embeds the query texts *with gradients*, scores them against the pool's
fixed passage vectors and returns the Plackett–Luce log-prob of each recorded draw. The
passage side never trains: the index stays valid while the query side moves (see README).
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from ragrl.algos.plackett_luce import pl_log_prob
from ragrl.errors import RagrlError
from ragrl.models.query_encoder import QueryEncoder
from ragrl.policy.base import ValueHeadPolicy
from ragrl.policy.lm_model import ValueHead


@dataclass
class RetrievalBatch:
    """[B, T] over retrieval steps, plus the flat list of the batch's A actions."""

    action_mask: torch.Tensor      # [B, T] float
    old_logprobs: torch.Tensor     # [B, T] float
    scores: torch.Tensor           # [B]
    group_ids: torch.Tensor        # [B]
    query_texts: list[str]         # [A]
    candidate_rows: torch.Tensor   # [A, M] long, corpus rows of each action's pool
    sampled: torch.Tensor          # [A, k] long, positions into the pool, draw order
    positions: torch.Tensor        # [A, 2] long, (row, step) of each action

    def __len__(self) -> int:
        return self.action_mask.shape[0]

    def select(self, idx) -> "RetrievalBatch":
        idx = torch.as_tensor(idx, dtype=torch.long)
        new_row = torch.full((len(self),), -1, dtype=torch.long)
        new_row[idx] = torch.arange(len(idx))
        keep = (new_row[self.positions[:, 0].cpu()] >= 0).nonzero(as_tuple=True)[0]
        pos = self.positions[keep].clone()
        pos[:, 0] = new_row[pos[:, 0].cpu()].to(pos.device)
        return RetrievalBatch(self.action_mask[idx], self.old_logprobs[idx], self.scores[idx],
                              self.group_ids[idx], [self.query_texts[i] for i in keep.tolist()],
                              self.candidate_rows[keep], self.sampled[keep], pos)

    def to(self, device) -> "RetrievalBatch":
        return RetrievalBatch(*(t.to(device) if isinstance(t, torch.Tensor) else t
                                for t in (self.action_mask, self.old_logprobs, self.scores, self.group_ids,
                                          self.query_texts, self.candidate_rows, self.sampled, self.positions)))


def collate_retrievals(trajs: list) -> RetrievalBatch:
    """Trajectories with `retrievals` → RetrievalBatch (T = most retrievals in one trajectory)."""
    B = len(trajs)
    T = max((len(t.retrievals) for t in trajs), default=0)
    mask, old = torch.zeros(B, max(T, 1)), torch.zeros(B, max(T, 1))
    texts, rows, picks, pos = [], [], [], []
    for i, t in enumerate(trajs):
        for j, a in enumerate(t.retrievals):
            mask[i, j], old[i, j] = 1.0, a.logprob
            texts.append(a.query_text)
            rows.append(a.candidate_rows)
            picks.append(a.sampled)
            pos.append((i, j))
    if texts and (len({len(r) for r in rows}) > 1 or len({len(p) for p in picks}) > 1):
        raise RagrlError("retrieval actions in one batch must share pool size and k")
    A = len(texts)
    if A == 0:   # no search in the whole step (a frozen generator that answered at once)
        return RetrievalBatch(mask, old, torch.tensor([t.reward for t in trajs], dtype=torch.float32),
                              torch.tensor([t.group for t in trajs], dtype=torch.long), [],
                              torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long),
                              torch.zeros(0, 2, dtype=torch.long))
    return RetrievalBatch(
        mask, old, torch.tensor([t.reward for t in trajs], dtype=torch.float32),
        torch.tensor([t.group for t in trajs], dtype=torch.long), texts,
        torch.tensor(rows, dtype=torch.long).reshape(A, -1), torch.tensor(picks, dtype=torch.long).reshape(A, -1),
        torch.tensor(pos, dtype=torch.long).reshape(A, 2))


class RetrieverPolicy(ValueHeadPolicy):
    """encoder: the trainable `QueryEncoder`; embeddings: the index's passage vectors [rows, dim]
    (fixed); temperature: the Plackett–Luce temperature the draws were sampled at. `train()` leaves
    the encoder in eval mode (QueryEncoder refuses dropout), so PPO's ratios start at 1."""

    def __init__(self, encoder: QueryEncoder, embeddings: torch.Tensor, temperature: float, *,
                 with_value_head: bool = False, with_reference: bool = False):
        self.module = encoder
        self.embeddings = embeddings.float()
        self.temperature = float(temperature)
        self.value_head = ValueHead(encoder.dim) if with_value_head else None
        self.has_values = self.value_head is not None
        # KL needs the starting encoder; HARR trains without KL, so the copy is made only on request.
        self._reference = copy.deepcopy(encoder).requires_grad_(False) if with_reference else None
        self._scorer = encoder

    @property
    def device(self) -> torch.device:
        return self.module.device

    def collate(self, trajs: list) -> RetrievalBatch:
        return collate_retrievals(trajs)

    def forward(self, batch: RetrievalBatch, *, with_values: bool = False, with_entropy: bool = False) -> dict:
        B, T = batch.action_mask.shape
        logprobs = torch.zeros(B, T, device=self.device)
        values = torch.zeros(B, T, device=self.device) if with_values else None
        entropy = torch.zeros(B, T, device=self.device) if with_entropy else None
        if not batch.query_texts:
            return {"logprobs": logprobs, "values": values, "entropy": entropy}
        # A GRPO group repeats one query text n times: embed each distinct text once.
        slot = {t: i for i, t in enumerate(dict.fromkeys(batch.query_texts))}
        uniq = list(slot)
        where = torch.tensor([slot[t] for t in batch.query_texts], device=self.device)
        q = self._scorer(uniq)[where]                                        # [A, d]
        cand = self.embeddings.to(self.device)[batch.candidate_rows]        # [A, M, d]
        scores = torch.einsum("ad,amd->am", q, cand)                        # [A, M]
        lp = pl_log_prob(scores, batch.sampled, self.temperature)          # [A]
        r, c = batch.positions[:, 0], batch.positions[:, 1]
        logprobs = logprobs.index_put((r, c), lp)
        if with_values and self.value_head is not None:
            values = values.index_put((r, c), self.value_head(q))
        if with_entropy:
            # The entropy of the first draw's softmax: the PL list's exact entropy has no closed form.
            p = torch.softmax(scores / self.temperature, dim=-1)
            entropy = entropy.index_put((r, c), -(p * torch.log(p.clamp_min(1e-30))).sum(-1))
        return {"logprobs": logprobs, "values": values, "entropy": entropy}

    @contextlib.contextmanager
    def reference(self):
        if self._reference is None:
            raise RagrlError("this retriever policy has no reference encoder (KL needs with_reference=True)")
        self._scorer = self._reference
        try:
            yield
        finally:
            self._scorer = self.module
