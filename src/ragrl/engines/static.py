"""A static-KV decode engine: preallocated slots, one compiled decode step, sampling on the device.

`HFEngine` decodes through transformers' forward with a growing cache, samples row by row in Python
and reads every token back to the host: on a GPU that is ~0.1x of a compiled decode. Here:

  slots    S rows decode at once; each slot owns a fixed [H, L, D] stretch of every layer's KV
           buffer ([S, H, L, D], allocated once per (S, L)). A slot's sequence sits at columns
           0..n-1 (column = position), so rows of different lengths share a batch without padding
           and a row that finishes frees its slot for the next waiting row (continuous batching).
  step     one decode step for all S slots: embed, then each layer's projections (the model's own
           modules, so LoRA adapters stay live and an optimizer step is seen at the next token),
           RoPE, a scatter of the new K/V into column `position`, attention over all L columns
           masked to `column <= position`, MLP; then sampling (engines/sampling.py). Every shape
           is fixed, so the step compiles once per (S, L): torch.compile (CUDA graphs on a GPU via
           mode="reduce-overhead"), or CUDA graphs captured directly (`compile_mode="graphs"`).
  host     reads the sampled tokens back every `check_every` steps, not every token: eos, budgets
           and stop strings are checked on that chunk, and a row is cut at the token that ended
           it (the tokens a finished row decoded past its end are dropped, never returned). Wall-time
           deadlines are checked there too (a row past its own ends "timeout" with the chunk it
           has) and before a waiting row is prefilled (past it: no slot, no tokens).
  prefill  new rows are prefilled together into their slots (right-padded, eager); a prefix that
           all of them share (chat template, system prompt, one question's n samples) is run once
           and copied; inside `prefix_caching()` the next turn of an episode copies its stored KV
           into the slot and prefills only the new tokens.

Models: the Llama family's layout (llama, mistral, qwen2, qwen3); `unsupported_reason` names what
else stops a model from running here (then `model.engine: auto` uses `HFEngine`). A request with
`allowed_tokens` (a Python grammar callback per token) is decoded by an `HFEngine` over the same
module (without turn KV reuse), since a callback cannot run inside a compiled step.
"""
from __future__ import annotations

import time
from collections import deque

import torch
import torch.nn.functional as F

from ragrl.engines.base import Generation, SamplingParams
from ragrl.engines.hf import HFEngine
from ragrl.engines.kv_cache import PrefixStore
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
from ragrl.engines.sampling import P as SEED_MODULUS
from ragrl.engines.sampling import sample_tokens
from ragrl.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
COMPILE_MODES = ("auto", "inductor", "graphs", "off")
LENGTH_STEP = 256          # KV length L is rounded up to this, so few (S, L) shapes get compiled


def _causal_lm(model):
    """The transformers CausalLM inside a (peft) module."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported_reason(model) -> str | None:
    """Why `StaticEngine` cannot run `model`, or None when it can."""
    lm = _causal_lm(model)
    config = getattr(lm, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model type {kind!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(config, "use_sliding_window", False) or (kind == "mistral" and getattr(config, "sliding_window", None)):
        return "sliding-window attention is not implemented in the static engine"
    if any(type(m).__name__.startswith("FSDP") for m in model.modules()):
        return "the module is FSDP-sharded: its gathered weights are new tensors each step, which a compiled step would not see"
    if len(getattr(model, "peft_config", {}) or {}) > 1:
        return "the module holds several LoRA adapters (switched per agent), which a compiled step would freeze"
    return None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticEngine:
    """`Engine` with a static KV cache and a compiled decode step (see the module docstring).

    max_batch_size: the most slots; a call with fewer rows uses the next power of two of them.
    compile_mode: auto (inductor on CUDA, off on a CPU), inductor, graphs (CUDA graphs of the
        eager step, CUDA only), off (eager: the same step, uncompiled).
    check_every: decode steps between reads of the sampled tokens (stop checks, slot refills).
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64, device=None, eos_token_ids=None,
                 compile_mode: str = "auto", check_every: int = 8):
        if max_batch_size < 1 or check_every < 1:
            raise ConfigError(f"max_batch_size and check_every must be >= 1, got {max_batch_size}, {check_every}")
        if compile_mode not in COMPILE_MODES:
            raise ConfigError(f"compile_mode {compile_mode!r} is not one of {', '.join(COMPILE_MODES)}")
        if (reason := unsupported_reason(model)) is not None:
            raise ConfigError(f"model.engine=static: {reason}; use model.engine=hf (or auto)")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.check_every = max_batch_size, check_every
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if next(model.parameters()).device != self.device:
            model.to(self.device)
        if compile_mode == "auto":
            compile_mode = "inductor" if self.device.type == "cuda" else "off"
        if compile_mode == "graphs" and self.device.type != "cuda":
            raise ConfigError("compile_mode=graphs needs a CUDA device; use inductor or off")
        self.compile_mode = compile_mode
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else default_eos(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids)
        self.min_shared_prefix = 16
        self.prefill_tokens = 0      # prompt tokens run through the model (not copied from a cache)
        self._store: PrefixStore | None = None
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, list, list]] = {}   # (S, L) -> kv, keys, values
        self._graphs: dict = {}
        self._compiled = None
        self._constrained: HFEngine | None = None
        lm = _causal_lm(model)
        attn = lm.model.layers[0].self_attn
        self._head_dim = attn.head_dim
        self._kv_heads = lm.config.num_key_value_heads
        self._groups = lm.config.num_attention_heads // self._kv_heads
        self._qk_norm = hasattr(attn, "q_norm")
        #: once no row waits and half the slots are idle, move the rest into fewer slots. On a CPU an
        #: idle slot costs as much as a busy one; on a GPU it is nearly free, and a new slot count
        #: would mean a new compile or capture.
        self.compact = self.device.type == "cpu"

    # The turns of one rollout reuse earlier turns' KV through the same scoped store as HFEngine's
    # (emptied on exit: never wrap an optimizer step); its entries hold this engine's KV layout.
    prefix_caching = HFEngine.prefix_caching

    # -- the model, by hand over its own modules ----------------------------------------------

    def _forward(self, input_ids, positions, slots, keys, values, last_index=None) -> torch.Tensor:
        """Float32 logits [B, V] at each row's `last_index` (default: the last column).

        input_ids, positions: [B, T]. slots: [B] slot of each row, or None for a decode step over
        all S slots (B = S, T = 1). K/V of every input token is written at column = its position
        (clamped to L - 1: right-padding tokens of a prefill may run past L; they are garbage a
        later write replaces before any query can see it)."""
        lm = _causal_lm(self.model)
        L = keys[0].shape[2]
        B, T = input_ids.shape
        rows = (torch.arange(B, device=input_ids.device) if slots is None else slots)[:, None]
        columns = positions.clamp(max=L - 1)
        width = L if slots is None else min(L, int(positions.max()) + 1)
        visible = torch.arange(width, device=input_ids.device)[None, None, None, :] <= positions[:, None, :, None]
        if self._groups > 1 and T > 1:
            visible = visible.repeat(1, 1, self._groups, 1)      # one row per (query head in group, t)
        x = lm.model.embed_tokens(input_ids)
        cos, sin = lm.model.rotary_emb(x, positions)
        cos, sin = cos[:, None], sin[:, None]
        D, Hkv, G = self._head_dim, self._kv_heads, self._groups
        for i, layer in enumerate(lm.model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(B, T, -1, D)
            k = attn.k_proj(h).view(B, T, -1, D)
            v = attn.v_proj(h).view(B, T, -1, D)
            if self._qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys[i][rows, :, columns] = k.transpose(1, 2).to(keys[i].dtype)
            values[i][rows, :, columns] = v.to(values[i].dtype)
            if slots is None:
                k_all, v_all = keys[i], values[i]
            else:
                k_all, v_all = keys[i][slots, :, :width], values[i][slots, :, :width]
            # Grouped-query attention without repeating K/V: the G query heads of a K/V head
            # become G x T query rows against that head.
            out = F.scaled_dot_product_attention(q.reshape(B, Hkv, G * T, D), k_all, v_all,
                                                 attn_mask=visible, scale=attn.scaling)
            out = out.reshape(B, Hkv * G, T, D).transpose(1, 2).reshape(B, T, Hkv * G * D)
            x = x + attn.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = lm.model.norm(x[:, -1] if last_index is None else x[torch.arange(B, device=x.device), last_index])
        return lm.lm_head(x).float()

    def _decode_step(self, tokens, positions, temperature, top_p, seeds, counters, keys, values, use_top_p: bool,
                     any_sampled: bool):
        """One token for every slot: (tokens [S], logprobs [S]); writes the fed tokens' K/V."""
        logits = self._forward(tokens[:, None], positions[:, None], None, keys, values)
        return sample_tokens(logits, temperature, top_p, seeds, counters, use_top_p, any_sampled)

    def _step(self, state: _SlotState, use_top_p: bool, any_sampled: bool):
        args = (state.tokens, state.positions, state.temperature, state.top_p, state.seeds, state.counters)
        if self.compile_mode == "off":
            return self._decode_step(*args, state.keys, state.values, use_top_p, any_sampled)
        if self.compile_mode == "graphs":
            key = (id(state.keys[0]), use_top_p, any_sampled)
            if key not in self._graphs:
                self._graphs[key] = _CapturedStep(self._decode_step, args, state.keys, state.values, use_top_p,
                                                  any_sampled)
            return self._graphs[key](args)
        if self._compiled is None:
            # One compiled graph per (slots, length, top-p) shape; dynamo's default limit (8) would
            # silently fall back to eager for a long run's later shapes.
            config = torch._dynamo.config
            limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
            setattr(config, limit, max(getattr(config, limit), 64))
            mode = "reduce-overhead" if self.device.type == "cuda" else "default"
            self._compiled = torch.compile(self._decode_step, mode=mode, fullgraph=True, dynamic=False)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        return self._compiled(*args, state.keys, state.values, use_top_p, any_sampled)

    # -- generate -----------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[Generation]]:
        """For each prompt, `params.n` continuations (see `Engine.generate`). A row's samples depend
        on (seed, prompt position, sample index) alone, not on the batch or the slot it ran in."""
        per_prompt = check_requests(prompts, params, self.vocab_size)
        if any(sp.allowed_tokens is not None for sp in per_prompt):
            if self._constrained is None:
                self._constrained = HFEngine(self.model, self.tokenizer, max_batch_size=self.max_batch_size,
                                             device=self.device, eos_token_ids=self.eos_token_ids)
            return self._constrained.generate(prompts, params)
        rows = []
        for i, (prompt, sp) in enumerate(zip(prompts, per_prompt)):
            base_seed = sp.seed if sp.seed is not None else int(torch.randint(2**62, ()).item())
            rows += [_Row(i, list(prompt), sp, row_seed(base_seed, i, j) % SEED_MODULUS) for j in range(sp.n)]
        rows.sort(key=lambda r: len(r.prompt))   # stable: one prompt's samples stay together
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                self._run(rows)
        finally:
            self.model.train(was_training)
        results: list[list[Generation]] = [[] for _ in prompts]
        for row in sorted(rows, key=lambda r: r.prompt_index):   # stable: sample order kept
            results[row.prompt_index].append(
                to_generation(self.tokenizer, row.token_ids, row.logprobs, row.stop_reason, row.stop_string))
        return results

    def _run(self, rows: list[_Row]) -> None:
        n_slots = min(self.max_batch_size, 1 << (len(rows) - 1).bit_length())
        need = max(len(r.prompt) + r.params.max_new_tokens for r in rows) + self.check_every + 1
        state = _SlotState(self, n_slots, -(-need // LENGTH_STEP) * LENGTH_STEP)
        use_top_p = any(r.params.top_p < 1 and r.params.temperature > 0 for r in rows)
        sampling = (use_top_p, any(r.params.temperature > 0 for r in rows))
        pending, in_slot = deque(rows), [None] * n_slots
        timed = any(r.params.deadline is not None for r in rows)   # else the clock is never read
        while True:
            free = [s for s, row in enumerate(in_slot) if row is None]
            if pending and free:
                batch = [pending.popleft() for _ in range(min(len(free), len(pending)))]
                batch = expire_rows(batch)   # waited past its deadline: ends with no tokens, takes no slot
                if batch:
                    self._admit(state, batch, free[:len(batch)], in_slot, sampling)
                continue
            active = [s for s, row in enumerate(in_slot) if row is not None]
            if not active:
                return
            if self.compact and not pending and len(active) <= state.n_slots // 2:
                state, in_slot = state.compacted(active, in_slot)
                active = list(range(len(active)))
            steps = min(self.check_every, max(in_slot[s].remaining for s in active))
            tokens, logprobs = state.chunk(steps, sampling)
            now = time.monotonic() if timed else None
            for s in active:
                row = in_slot[s]
                ended = row.extend(tokens[s], logprobs[s], self)
                if not ended and past_deadline(row.params, now):
                    row.stop_reason, ended = "timeout", True
                if ended:
                    self._release(state, s, in_slot)

    def _admit(self, state: _SlotState, batch: list[_Row], slots: list[int], in_slot: list, sampling) -> None:
        """Prefill `batch` into `slots`, draw each row's first token, free the slots of rows already done."""
        hits = [self._store.longest_prefix(r.prompt) if self._store is not None else (0, None) for r in batch]
        slot_ids = torch.tensor(slots, device=self.device)
        starts = [n for n, _ in hits]
        if any(entry is not None for _, entry in hits):
            for s, (n, entry) in zip(slots, hits):
                if entry is not None:      # one copy per row: all layers' K, then V
                    state.kv[0, :, s, :, :n] = entry.keys
                    state.kv[1, :, s, :, :n] = entry.values
        elif len(batch) > 1 and (shared := shared_prefix_len([r.prompt for r in batch])) >= self.min_shared_prefix:
            prefix = torch.tensor([batch[0].prompt[:shared]], device=self.device)
            self._forward(prefix, torch.arange(shared, device=self.device)[None], slot_ids[:1], state.keys, state.values)
            state.kv[:, :, slot_ids[1:], :, :shared] = state.kv[:, :, slots[0]:slots[0] + 1, :, :shared]
            self.prefill_tokens += shared
            starts = [shared] * len(batch)
        suffixes = [r.prompt[n:] for r, n in zip(batch, starts)]
        self.prefill_tokens += sum(map(len, suffixes))
        width = max(map(len, suffixes))
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        for k, suffix in enumerate(suffixes):
            input_ids[k, :len(suffix)] = torch.tensor(suffix)
        positions = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
        last = torch.tensor([len(x) - 1 for x in suffixes], device=self.device)
        logits = self._forward(input_ids.to(self.device), positions.to(self.device), slot_ids, state.keys,
                               state.values, last_index=last)
        first, logprob = state.seat(slot_ids, batch, logits, sampling)
        for s, row, token, lp in zip(slots, batch, first.tolist(), logprob.tolist()):
            in_slot[s] = row
            if row.extend([token], [lp], self):
                self._release(state, s, in_slot)

    def _release(self, state: _SlotState, slot: int, in_slot: list) -> None:
        row, in_slot[slot] = in_slot[slot], None
        if self._store is not None:   # the row's KV for its episode's next turn (its last token was never fed)
            n = len(row.prompt) + len(row.token_ids) - 1
            self._store.put_entry(row.prompt + row.token_ids[:-1], state.kv[0, :, slot, :, :n].clone(),
                                  state.kv[1, :, slot, :, :n].clone())


class _SlotState:
    """The device side of one `generate` call: the KV buffers and each slot's sampling state."""

    def __init__(self, engine: StaticEngine, n_slots: int, length: int):
        self.engine, self.n_slots, self.length = engine, n_slots, length
        key = (n_slots, length)
        if key not in engine._buffers:
            if len(engine._buffers) >= 2:     # keep at most two shapes' buffers (and their compiled steps)
                engine._buffers.pop(next(iter(engine._buffers)))
                engine._graphs.clear()
            lm, dev = _causal_lm(engine.model), engine.device
            dtype = lm.model.embed_tokens.weight.dtype
            # One tensor [K/V, layers, S, H, L, D]: a slot's whole KV moves in one copy (turn reuse).
            kv = torch.zeros((2, len(lm.model.layers), n_slots, engine._kv_heads, length, engine._head_dim),
                             dtype=dtype, device=dev)
            keys, values = list(kv[0].unbind(0)), list(kv[1].unbind(0))
            if dev.type == "cuda":      # CUDA graphs may then write them in place
                for t in keys + values:
                    torch._dynamo.mark_static_address(t)
            engine._buffers[key] = (kv, keys, values)
        self.kv, self.keys, self.values = engine._buffers[key]
        dev = engine.device
        self.tokens = torch.zeros(n_slots, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n_slots, dtype=torch.long, device=dev)
        self.counters = torch.zeros(n_slots, dtype=torch.long, device=dev)
        self.seeds = torch.zeros(n_slots, dtype=torch.long, device=dev)
        self.temperature = torch.zeros(n_slots, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(n_slots, dtype=torch.float32, device=dev)
        self.out_tokens = torch.zeros((n_slots, engine.check_every), dtype=torch.long, device=dev)
        self.out_logprobs = torch.zeros((n_slots, engine.check_every), dtype=torch.float32, device=dev)

    def compacted(self, active: list[int], in_slot: list) -> tuple[_SlotState, list]:
        """A state with the fewest slots (a power of two) that hold `active`, their KV and sampling
        state copied over in slot order; returns it and the new slot -> row list."""
        smaller = _SlotState(self.engine, 1 << (len(active) - 1).bit_length(), self.length)
        index = torch.tensor(active, device=self.engine.device)
        k = len(active)
        smaller.kv[:, :, :k] = self.kv[:, :, index]
        for name in ("tokens", "positions", "counters", "seeds", "temperature", "top_p"):
            getattr(smaller, name)[:k] = getattr(self, name)[index]
        return smaller, [in_slot[s] for s in active] + [None] * (smaller.n_slots - k)

    def seat(self, slot_ids, rows: list[_Row], logits, sampling: tuple[bool, bool]):
        """Give `rows` their slots' sampling state and draw their first tokens from `logits`."""
        dev = self.engine.device
        temperature = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32, device=dev)
        top_p = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=dev)
        seeds = torch.tensor([r.seed for r in rows], dtype=torch.long, device=dev)
        first, logprob = sample_tokens(logits, temperature, top_p, seeds, torch.zeros_like(seeds), *sampling)
        self.tokens[slot_ids] = first
        self.positions[slot_ids] = torch.tensor([len(r.prompt) for r in rows], device=dev)
        self.counters[slot_ids] = 1
        self.seeds[slot_ids], self.temperature[slot_ids], self.top_p[slot_ids] = seeds, temperature, top_p
        return first, logprob

    def chunk(self, steps: int, sampling: tuple[bool, bool]) -> tuple[list[list[int]], list[list[float]]]:
        """Decode `steps` tokens in every slot; the sampled tokens and log-probs, read back once."""
        for j in range(steps):
            tokens, logprobs = self.engine._step(self, *sampling)
            self.out_tokens[:, j] = tokens
            self.out_logprobs[:, j] = logprobs
            self.tokens.copy_(tokens)
            self.positions.add_(1).clamp_(max=self.length - 1)   # an idle slot runs on harmlessly
            self.counters.add_(1)
        return self.out_tokens[:, :steps].tolist(), self.out_logprobs[:, :steps].tolist()


class _CapturedStep:
    """The eager decode step recorded as one CUDA graph (static inputs copied in, outputs reused)."""

    def __init__(self, step, args, keys, values, use_top_p: bool, any_sampled: bool):
        self.inputs = [a.clone() for a in args]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):          # warm up (allocator, kernels) off the capture
            for _ in range(2):
                step(*self.inputs, keys, values, use_top_p, any_sampled)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = step(*self.inputs, keys, values, use_top_p, any_sampled)

    def __call__(self, args):
        for dst, src in zip(self.inputs, args):
            dst.copy_(src)
        self.graph.replay()
        return self.outputs


class _Row:
    """One sequence: a prompt's k-th sample, its seed and what it has generated."""

    def __init__(self, prompt_index: int, prompt: list[int], params: SamplingParams, seed: int):
        self.prompt_index, self.prompt, self.params, self.seed = prompt_index, prompt, params, seed
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.stop_reason: str | None = None
        self.stop_string: str | None = None

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.token_ids)

    def extend(self, tokens: list[int], logprobs: list[float], engine: StaticEngine) -> bool:
        """Append a chunk; True when the row ended in it, cut just after the token that ended it.

        Per token, in HFEngine's order: eos, then a stop string completed by that token, then the
        budget. Stop strings are looked for in one decode of the chunk (with the window before it)
        and only on a hit token by token, so a chunk without one costs a single decode."""
        start = len(self.token_ids)
        self.token_ids += tokens
        self.logprobs += logprobs
        stops = self.params.stop
        window = stop_window(stops) if stops else 0
        maybe = bool(stops) and stop_string_in(engine.tokenizer.decode(self.token_ids[max(0, start - window):]), stops)
        for j in range(start, len(self.token_ids)):
            found = None
            if self.token_ids[j] in engine.eos_token_ids:
                reason = "eos"
            elif maybe and (found := stop_string_in(engine.tokenizer.decode(self.token_ids[max(0, j + 1 - window):j + 1]), stops)):
                reason = "stop"
            elif j + 1 >= self.params.max_new_tokens:
                reason = "length"
            else:
                continue
            del self.token_ids[j + 1:], self.logprobs[j + 1:]
            self.stop_reason, self.stop_string = reason, found
            return True
        return False
