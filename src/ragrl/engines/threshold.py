"""Decide between two actions by a probability threshold (SmartRAG's inference mode, usable by any
protocol whose steps start with the action marker: `ragrl eval --search-threshold`).

The SmartRAG paper's policy can be run with a second knob on the retrieval rate: at each step, search
when the probability of the search action exceeds a threshold (0.5 by default), otherwise
answer. Here the two actions start with multi-token markers (`[Search]`, `[Answer]`) that share
their first token, so the decision compares the probabilities of the whole markers:

    p_search = P(search marker | context) / (P(search marker | context) + P(answer marker | context))

The chosen marker is forced, the rest of the step is generated as usual (greedy or sampled),
and the Generation holds the marker tokens too (with their log-probs), so the episode runner
and every reward see an ordinary step. Wraps any engine that exposes its HF `model`.
"""
from __future__ import annotations

import torch

from ragrl.engines.base import Generation, SamplingParams
from ragrl.errors import ConfigError


class ThresholdDecisionEngine:
    def __init__(self, engine, search_marker: str, answer_marker: str, threshold: float = 0.5):
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"search threshold must be in [0, 1], got {threshold}")
        self.engine, self.tokenizer, self.threshold = engine, engine.tokenizer, float(threshold)
        self.markers = {"search": self.tokenizer.encode(search_marker, add_special_tokens=False),
                        "answer": self.tokenizer.encode(answer_marker, add_special_tokens=False)}
        self.texts = {"search": search_marker, "answer": answer_marker}
        self.decisions: list[float] = []     # p_search of every decision made (for reports)

    @torch.no_grad()
    def p_search(self, prompt: list[int]) -> tuple[float, dict[str, list[float]]]:
        """p_search for one context, and each marker's per-token log-probs."""
        model = self.engine.model
        device = next(model.parameters()).device
        seqs = [prompt + self.markers[k] for k in ("search", "answer")]
        width = max(map(len, seqs))
        ids = torch.full((2, width), self.engine.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s, device=device), 1
        logits = model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)
        per_token = {}
        for i, k in enumerate(("search", "answer")):
            m = self.markers[k]
            pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(m), device=device)
            per_token[k] = logits[i, pos, torch.tensor(m, device=device)].tolist()
        ls, la = sum(per_token["search"]), sum(per_token["answer"])
        return float(torch.sigmoid(torch.tensor(ls - la))), per_token

    def generate(self, prompts: list[list[int]], params) -> list[list[Generation]]:
        per_prompt = list(params) if isinstance(params, list) else [params] * len(prompts)
        chosen, forced, lps = [], [], []
        for p in prompts:
            ps, per_token = self.p_search(list(p))
            self.decisions.append(ps)
            kind = "search" if ps > self.threshold else "answer"
            chosen.append(kind)
            forced.append(list(p) + self.markers[kind])
            lps.append(per_token[kind])
        rest = [SamplingParams(**{**sp.__dict__, "max_new_tokens": max(1, sp.max_new_tokens - len(self.markers[k]))})
                for sp, k in zip(per_prompt, chosen)]
        gens = self.engine.generate(forced, rest)
        out = []
        for kind, lp, gs in zip(chosen, lps, gens):
            out.append([Generation(self.markers[kind] + g.token_ids, lp + list(g.logprobs), g.stop_reason,
                                   g.stop_string, text=self.texts[kind] + g.text if g.text else "") for g in gs])
        return out
