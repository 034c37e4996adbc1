"""Sampling on the device, vectorised over a batch, with a seed per row: pure functions over tensors.

Why not `torch.multinomial` with a `torch.Generator` per row (what `HFEngine` does): that is one
call per row per token, driven from Python, which a compiled decode step or a CUDA graph cannot
hold. Here every row's randomness is a counter-based hash of (row seed, token index, vocabulary
id), so a batch of rows draws in one vectorised expression, on any device, and a row's draws do
not depend on which other rows share its batch or which slot it sits in.

A draw is Gumbel-max: argmax(logits / T + g) with g = -log(-log u) picks token v with probability
softmax(logits / T)[v]. u has 24 random bits (exact in float32), so g lies in [-2.85, 17.3]: a
token whose probability is below e^-20 (2e-9) of the most likely one's cannot be drawn, an error
far below anything a rollout can see.

The hash works modulo the Mersenne prime P = 2^31 - 1, where every product of two residues fits in
int64 without overflow (overflow would be undefined in the C++ a compiler emits), and mixes with
xor-shifts between multiplications.
"""
from __future__ import annotations

import torch

P = 2**31 - 1
_MULTIPLIERS = (1_103_515_245, 742_938_285, 1_583_458_089, 950_706_376, 48_271)


def _mix(h: torch.Tensor, multiplier: int) -> torch.Tensor:
    h = (h * multiplier) % P
    return h ^ (h >> 15)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """u in (0, 1), a function of (seed, counter, vocabulary id) alone.

    seeds: [B] int64 in [0, P); counters: [B] int64 (the index of the token being drawn).
    Returns [B, V] float32.
    """
    h = _mix((seeds + 1) % P, _MULTIPLIERS[0])
    h = _mix((h + counters % P) % P, _MULTIPLIERS[1])[:, None]
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)[None, :]
    h = _mix((h + vocab) % P, _MULTIPLIERS[2])
    h = _mix(h % P, _MULTIPLIERS[3])
    h = _mix(h % P, _MULTIPLIERS[4])
    return ((h % P) >> 7).to(torch.float32).add_(0.5).mul_(1.0 / 2**24)


def nucleus_mask(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where a token is inside its row's top-p nucleus.

    probs: [B, V]; top_p: [B] in (0, 1]. The smallest set of most likely tokens whose mass reaches
    top_p is kept; the most likely token always is (its mass before is 0). Returns [B, V] bool.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep_sorted = (sorted_probs.cumsum(-1) - sorted_probs) < top_p[:, None]
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor,
                  counters: torch.Tensor, use_top_p: bool, any_sampled: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob under the raw logits.

    logits: [B, V] float32; temperature: [B] (0 = greedy); top_p: [B]; seeds, counters: [B] int64.
    use_top_p: whether any row has top_p < 1 (a Python bool, so a compiled step specialises on it
    and rows without truncation skip the sort).
    Returns tokens [B] int64 and logprobs [B] float32 = log_softmax(logits)[token]: temperature 1,
    before top-p, what a plain forward pass of the trainer recomputes.
    any_sampled: False when every row is greedy (then no noise is drawn).
    """
    if not any_sampled:
        tokens = logits.argmax(-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    if use_top_p:
        inside = nucleus_mask(torch.softmax(scaled, dim=-1), top_p)
        scaled = scaled.masked_fill(~inside, float("-inf"))
    gumbel = -torch.log(-torch.log(uniform_noise(seeds, counters, logits.shape[-1])))
    drawn = (scaled + gumbel).argmax(-1)
    tokens = torch.where(greedy, logits.argmax(-1), drawn)
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
    return tokens, logprobs
