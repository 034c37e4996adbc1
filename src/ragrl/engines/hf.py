"""Batched sampling on any Hugging Face causal LM (plain or peft), with our own decode loop.

Why not `model.generate`: we need per-sequence stop strings and limits, the exact log-prob of
every sampled token, and finished rows dropped from the batch (and the KV cache) at once, so a
sequence that is done stops costing compute.

One batch, shapes with B rows (prompt × sample) and P = longest prompt:
  prefill: input_ids [B, P] left-padded, attention_mask [B, P], position_ids [B, P]
  decode:  input_ids [b, 1] for the b rows still running, attention_mask [b, P + t]
Left padding shifts every row's positions, so positions are counted over real tokens only
(cumsum of the mask - 1); without that, a short prompt in a batch would see different RoPE
positions than alone and produce different text.

Log-probs are log_softmax of the raw logits (temperature 1, no top-p) at the sampled token: that
is what a plain forward pass of the trainer recomputes, so PPO ratios start at exactly 1 whatever
temperature/top-p the rollout used.

`engine.model` is the very module passed in. A trainer that updates it in place (optimizer steps
on the same parameters, or on its peft adapters) needs no weight sync: the next `generate` sees
the new weights.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from ragrl.engines.base import Generation, SamplingParams
from ragrl.engines.kv_cache import PrefixStore, batch_from_entries, new_cache
from ragrl.engines.requests import (
    check_requests,
    default_eos,
    expire_rows,
    past_deadline,
    row_seed,
    shared_prefix_len,
    stop_string_in,
    stop_window,
    to_generation,
)
from ragrl.errors import ConfigError, RagrlError
from ragrl.models.hf_compat import cache_keyword
from ragrl.models.lm_weights import load_policy


class HFEngine:
    """`Engine` over a transformers causal LM; rows are processed in batches of `max_batch_size`.

    device: where to run (default: where the model already is; the model is moved if it differs).
    eos_token_ids: ids that end a sequence (default: tokenizer eos, `<|im_end|>`, generation config eos).
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64, device=None, eos_token_ids=None):
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        #: prefixes shorter than this are not worth a separate prefill
        self.min_shared_prefix = 16
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if next(model.parameters()).device != self.device:
            model.to(self.device)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else default_eos(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids)
        self._store: PrefixStore | None = None
        #: prompt tokens actually run through the model (not taken from a cache); for benchmarks
        self.prefill_tokens = 0

    @contextlib.contextmanager
    def prefix_caching(self, max_tokens: int = 262_144):
        """Reuse the KV of earlier generations whose tokens a new prompt extends (multi-turn).

        Only valid while the weights stay fixed: the store is emptied on exit, so wrap exactly one
        rollout (all its turns) and never an optimizer step.
        """
        outer = self._store
        self._store = outer or PrefixStore(max_tokens)
        try:
            yield self
        finally:
            if outer is None:
                self._store.clear()
            self._store = outer

    @classmethod
    def from_name(cls, name: str, *, dtype=torch.float32, device="cpu", **kwargs) -> HFEngine:
        """Load a policy by name (see `ragrl.models.load_policy`) and wrap it."""

        model, tokenizer = load_policy(name, dtype=dtype, device=device)
        return cls(model, tokenizer, device=device, **kwargs)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[Generation]]:
        """For each prompt, `params.n` continuations (see `Engine.generate`).

        Sampling is reproducible given `SamplingParams.seed`: each row draws from its own
        torch.Generator seeded from (seed, prompt position, sample index), so results do not depend
        on batch size (up to float noise in the logits), and duplicate prompts in one call still
        get different samples. With seed None
        the seed is drawn from torch's global RNG (so `torch.manual_seed` makes that reproducible).
        """
        per_prompt = self._check(prompts, params)
        rows = []
        for i, (prompt, sp) in enumerate(zip(prompts, per_prompt)):
            base_seed = sp.seed if sp.seed is not None else int(torch.randint(2**62, ()).item())
            for j in range(sp.n):
                rows.append(_Row(i, list(prompt), sp, self._generator(base_seed, i, j)))
        # Similar lengths together means less padding in each batch.
        order = sorted(range(len(rows)), key=lambda r: len(rows[r].prompt))
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored below for the trainer
        try:
            with torch.inference_mode():
                for start in range(0, len(order), self.max_batch_size):
                    self._run_batch([rows[r] for r in order[start:start + self.max_batch_size]])
        finally:
            self.model.train(was_training)
        results: list[list[Generation]] = [[] for _ in prompts]
        for row in rows:
            results[row.prompt_index].append(self._finish(row))
        return results

    # -- one batch ---------------------------------------------------------------------------

    def _run_batch(self, rows: list[_Row]) -> None:
        """Prefill all rows, then decode one token per step for the rows still running.

        Rows usually share a long prefix (chat template + system prompt + worked example, or the
        same question's n samples). That prefix is prefilled ONCE and its KV cache repeated over
        the batch; each row's remaining suffix is left-padded *after* the prefix:
            [shared prefix P][pad][suffix_k]   attention mask 1, 0, 1
        with positions P + (0..len(suffix_k)-1), so every row sees exactly the positions and
        context it would alone (the pad columns are masked out of attention).

        Inside `prefix_caching()`, when every row extends a sequence stored by an earlier call
        (the next turn of an episode), the rows' stored KV is the prefix instead, left-padded:
            [pad][stored_k][pad][new tokens_k]

        A row whose `deadline` passed before its batch started ends with no tokens; one that
        reaches it while decoding ends after that step's token ("timeout").
        """
        rows = expire_rows(rows)
        if not rows:
            return
        # One clock read per decode step, and none at all for a batch without bounds.
        timed = any(r.params.deadline is not None for r in rows)
        store = self._store
        hits = [store.longest_prefix(r.prompt) for r in rows] if store is not None else []
        B = len(rows)
        if hits and all(entry is not None for _, entry in hits):
            # Every row extends a sequence this rollout already ran: prefill only the new tokens.
            starts = [n for n, _ in hits]
            cache, past_mask = batch_from_entries([e for _, e in hits], starts, self.device)
        else:
            P = shared_prefix_len([r.prompt for r in rows]) if len(rows) > 1 else 0
            P = P if P >= self.min_shared_prefix else 0
            cache, starts = new_cache(), [P] * B
            past_mask = torch.ones((B, P), dtype=torch.long, device=self.device)
            if P:
                prefix = torch.tensor([rows[0].prompt[:P]], device=self.device)
                self.model(input_ids=prefix, attention_mask=torch.ones_like(prefix),
                           position_ids=torch.arange(P, device=self.device)[None], use_cache=True,
                           logits_to_keep=1, **{cache_keyword(self.model): cache})
                cache.batch_repeat_interleave(B)
                self.prefill_tokens += P
        suffixes = [r.prompt[n:] for r, n in zip(rows, starts)]
        self.prefill_tokens += sum(len(x) for x in suffixes)
        S = max(len(x) for x in suffixes)
        input_ids = torch.full((B, S), self.pad_token_id, dtype=torch.long)
        suffix_mask = torch.zeros((B, S), dtype=torch.long)
        position_ids = torch.zeros((B, S), dtype=torch.long)
        for k, (suf, n) in enumerate(zip(suffixes, starts)):
            input_ids[k, S - len(suf):] = torch.tensor(suf)
            suffix_mask[k, S - len(suf):] = 1
            position_ids[k, S - len(suf):] = torch.arange(n, n + len(suf))
        attention_mask = torch.cat([past_mask, suffix_mask.to(self.device)], dim=1)
        input_ids, position_ids = input_ids.to(self.device), position_ids.to(self.device)
        logits = self._last_logits(input_ids, attention_mask, position_ids, cache)
        next_position = torch.tensor([[len(r.prompt)] for r in rows], device=self.device)
        active = rows
        while True:
            tokens, logprobs = self._sample(logits, active)
            now = time.monotonic() if timed else None
            steps = zip(active, tokens.tolist(), logprobs.tolist())
            keep = [k for k, (row, token, logprob) in enumerate(steps) if not row.append(token, logprob, self, now)]
            if store is not None:  # keep finished rows' KV for the next turn, before they are dropped
                for k in sorted(set(range(len(active))) - set(keep)):
                    store.put(active[k].prompt + active[k].token_ids[:-1], cache, k,
                              attention_mask[k].nonzero()[:, 0])
            if not keep:
                return
            if len(keep) < len(active):  # drop finished rows from the batch and the KV cache
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                tokens, attention_mask, next_position = tokens[index], attention_mask[index], next_position[index]
                active = [active[k] for k in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
            logits = self._last_logits(tokens[:, None], attention_mask, next_position, cache)
            next_position = next_position + 1

    def _last_logits(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        """Float32 logits at the last position of each row, [b, V]."""
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=True, logits_to_keep=1, **{cache_keyword(self.model): cache},  # LM head: last position only
        )
        return out.logits[:, -1, :].float()

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token per row ([b], long) and its log-prob under the raw logits ([b]), on the device."""
        tokens = logits.argmax(-1)  # greedy rows keep this
        for k, row in enumerate(rows):
            sp = row.params
            row_logits = logits[k]
            if sp.allowed_tokens is not None:   # constrained: only these ids may come next
                allowed = torch.as_tensor(list(sp.allowed_tokens(row.token_ids)), dtype=torch.long, device=logits.device)
                if allowed.numel() == 0:
                    raise RagrlError("allowed_tokens returned no token: the grammar has no way to continue")
                row_logits = torch.full_like(row_logits, float("-inf")).index_copy(0, allowed, row_logits[allowed])
                if sp.temperature == 0:
                    tokens[k] = row_logits.argmax()
                    continue
            if sp.temperature == 0:
                continue
            probs = torch.softmax(row_logits / sp.temperature, dim=-1)
            if sp.top_p < 1.0:
                probs = _top_p(probs, sp.top_p)
            tokens[k] = torch.multinomial(probs, 1, generator=row.generator)[0]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
        return tokens, logprobs

    # -- helpers ----------------------------------------------------------------------------

    def _check(self, prompts, params) -> list[SamplingParams]:
        return check_requests(prompts, params, self.vocab_size)

    def _generator(self, seed: int, prompt_index: int, sample_index: int) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(row_seed(seed, prompt_index, sample_index))
        return generator

    def _finish(self, row: _Row) -> Generation:
        return to_generation(self.tokenizer, row.token_ids, row.logprobs, row.stop_reason, row.stop_string)


@dataclass
class _Row:
    """One sequence being generated: a prompt's k-th sample."""

    prompt_index: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None
    stop_string: str | None = None

    def append(self, token: int, logprob: float, engine: HFEngine, now: float | None = None) -> bool:
        """Record a token; True when the row is finished (eos, stop string, length, or its deadline
        at or before the clock reading `now`: a natural end on the same token wins)."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if token in engine.eos_token_ids:
            self.stop_reason = "eos"
        elif self.params.stop and (found := self._stop_string(engine.tokenizer)):
            self.stop_reason, self.stop_string = "stop", found
        elif len(self.token_ids) >= self.params.max_new_tokens:
            self.stop_reason = "length"
        elif past_deadline(self.params, now):
            self.stop_reason = "timeout"
        return self.stop_reason is not None

    def _stop_string(self, tokenizer) -> str | None:
        """The stop string completed by the newest token, if any (earlier tokens were checked at
        earlier steps, so only a tail window needs decoding)."""
        return stop_string_in(tokenizer.decode(self.token_ids[-stop_window(self.params.stop):]), self.params.stop)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; [V] → [V] (unnormalized)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0  # the top token always survives (mass_before = 0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
