"""A static-KV decode engine: preallocated slots, one compiled decode step, sampling on the device.

`HFEngine` decodes through transformers' forward with a growing cache, samples row by row in Python
and reads every token back to the host: on a GPU that is ~0.1x of a compiled decode. Here:

  slots    S rows decode at once; each slot owns a fixed [H, L, D] stretch of every layer's KV
           buffer ([S, H, L, D], allocated once per (S, L)). A slot's sequence sits at columns
           0..n-1 (column = position), so rows of different lengths share a batch without padding
           and a row that finishes frees its slot for the next waiting row (continuous batching).
  step     one decode step for all S slots: embed, then each layer's projections (the model's own
           modules, so LoRA adapters stay live and an optimizer step is seen at the next token),
           RoPE, a scatter of the new K/V into column `position`, attention over the first W
           columns masked to `column <= position`, MLP; then sampling (engines/sampling.py). W is
           the narrowest of a few widths (256, 512, ..., L) that holds every live row, chosen per
           chunk. Every shape is fixed, so the step compiles once per (S, L, W): torch.compile
           (CUDA graphs on a GPU via mode="reduce-overhead"), or CUDA graphs captured directly
           (`compile_mode="graphs"`).
  host     reads the sampled tokens back every `check_every` steps, not every token: eos, budgets
           and stop strings are checked on that chunk, and a row is cut at the token that ended
           it (the tokens a finished row decoded past its end are dropped, never returned). Wall-time
           deadlines are checked there too (a row past its own ends "timeout" with the chunk it
           has) and before a waiting row is prefilled (past it: no slot, no tokens).
  prefill  new rows are prefilled together into their slots (right-padded, eager); a prefix that
           all of them share (chat template, system prompt, one question's n samples) is run once
           and copied; inside `prefix_caching()` the next turn of an episode copies its stored KV
           into the slot and prefills only the new tokens.
  episodes `run_turns` decodes whole multi-turn episodes: when a row's turn ends, a callback (the
           rollout runner: parse, retrieve, build the observation) says what comes next, and the
           episode's next turn continues in the same slot at once, its observation prefilled
           after the KV already there, while the other rows keep decoding. No turn waits for the
           slowest row of its batch, and no KV is stored or copied between turns.

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

from ragrl.engines.base import Generation, NextTurn, SamplingParams, TurnEnds
from ragrl.engines.hf import HFEngine
from ragrl.engines.kv_cache import PrefixStore
from ragrl.engines.requests import (
    check_requests,
    default_eos,
    expire_rows,
    past_deadline,
    row_seed,
    shared_prefix_len,
    to_generation,
)
from ragrl.engines.sampling import P as SEED_MODULUS
from ragrl.engines.sampling import sample_tokens
from ragrl.engines.slots import LENGTH_STEP, CapturedStep, Row, SlotState, causal_lm
from ragrl.errors import ConfigError, RagrlError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
COMPILE_MODES = ("auto", "inductor", "graphs", "off")


def unsupported_reason(model) -> str | None:
    """Why `StaticEngine` cannot run `model`, or None when it can."""
    lm = causal_lm(model)
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


def _sampling_flags(params: list[SamplingParams]) -> tuple[bool, bool]:
    """(any row uses top-p, any row samples): the flags that pick a compiled decode step."""
    return (any(sp.top_p < 1 and sp.temperature > 0 for sp in params), any(sp.temperature > 0 for sp in params))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticEngine:
    """`Engine` with a static KV cache and a compiled decode step (see the module docstring).

    max_batch_size: the most slots; a call with fewer rows uses the next power of two of them.
    compile_mode: auto (inductor on CUDA, off on a CPU), inductor, graphs (CUDA graphs of the
        eager step, CUDA only), off (eager: the same step, uncompiled).
    check_every: decode steps between reads of the sampled tokens (stop checks, slot refills).
    width_buckets: attend over the narrowest width that holds the live rows (False: over the whole
        reserved length every step, the same results; benchmarks/rollout.py's A/B).
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64, device=None, eos_token_ids=None,
                 compile_mode: str = "auto", check_every: int = 8, width_buckets: bool = True):
        if max_batch_size < 1 or check_every < 1:
            raise ConfigError(f"max_batch_size and check_every must be >= 1, got {max_batch_size}, {check_every}")
        if compile_mode not in COMPILE_MODES:
            raise ConfigError(f"compile_mode {compile_mode!r} is not one of {', '.join(COMPILE_MODES)}")
        if (reason := unsupported_reason(model)) is not None:
            raise ConfigError(f"model.engine=static: {reason}; use model.engine=hf (or auto)")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.check_every, self.width_buckets = max_batch_size, check_every, width_buckets
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
        # Decode steps run, slot-steps run (steps x slots) and tokens kept from them: on a GPU a step
        # costs about the same however many slots are busy, so decode_steps is the cost and
        # busy_row_steps / slot_steps how well the slots were used.
        self.decode_steps = self.busy_row_steps = self.slot_steps = 0
        self._store: PrefixStore | None = None
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, list, list]] = {}   # (S, L) -> kv, keys, values
        self._graphs: dict = {}
        self._compiled = None
        self._constrained: HFEngine | None = None
        lm = causal_lm(model)
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

    def _forward(self, input_ids, positions, slots, keys, values, last_index=None, width=None) -> torch.Tensor:
        """Float32 logits [B, V] at each row's `last_index` (default: the last column).

        input_ids, positions: [B, T]. slots: [B] slot of each row, or None for a decode step over
        all S slots (B = S, T = 1), which attends over the first `width` columns (default L). K/V of
        every input token is written at column = its position (clamped to L - 1: right-padding
        tokens of a prefill may run past L; they are garbage a later write replaces before any
        query can see it)."""
        lm = causal_lm(self.model)
        L = keys[0].shape[2]
        B, T = input_ids.shape
        rows = (torch.arange(B, device=input_ids.device) if slots is None else slots)[:, None]
        columns = positions.clamp(max=L - 1)
        if slots is None:
            width = L if width is None else width
        else:
            width = min(L, int(positions.max()) + 1)
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
                k_all, v_all = keys[i][:, :, :width], values[i][:, :, :width]
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

    def _decode_step(self, tokens, positions, temperature, top_p, seeds, counters, keys, values, width: int,
                     use_top_p: bool, any_sampled: bool):
        """One token for every slot: (tokens [S], logprobs [S]); writes the fed tokens' K/V."""
        logits = self._forward(tokens[:, None], positions[:, None], None, keys, values, width=width)
        return sample_tokens(logits, temperature, top_p, seeds, counters, use_top_p, any_sampled)

    def _step(self, state: SlotState, width: int, use_top_p: bool, any_sampled: bool):
        args = (state.tokens, state.positions, state.temperature, state.top_p, state.seeds, state.counters)
        flags = (use_top_p, any_sampled)
        if self.compile_mode == "off":
            return self._decode_step(*args, state.keys, state.values, width, *flags)
        if self.compile_mode == "graphs":
            key = (id(state.keys[0]), width, *flags)
            if key not in self._graphs:
                self._graphs[key] = CapturedStep(self._decode_step, args, state.keys, state.values, width, *flags)
            return self._graphs[key](args)
        if self._compiled is None:
            # One compiled graph per (slots, length, width, top-p) shape; dynamo's default limit (8)
            # would silently fall back to eager for a long run's later shapes.
            config = torch._dynamo.config
            limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
            setattr(config, limit, max(getattr(config, limit), 64))
            mode = "reduce-overhead" if self.device.type == "cuda" else "default"
            self._compiled = torch.compile(self._decode_step, mode=mode, fullgraph=True, dynamic=False)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        return self._compiled(*args, state.keys, state.values, width, *flags)

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
            rows += [Row(i, list(prompt), sp, self._seed(sp, i, j)) for j in range(sp.n)]
        self._decode(rows)
        results: list[list[Generation]] = [[] for _ in prompts]
        for row in sorted(rows, key=lambda r: r.prompt_index):   # stable: sample order kept
            results[row.prompt_index].append(self._generation(row))
        return results

    def run_turns(self, prompts: list[list[int]], params: list[SamplingParams], turn_ends: TurnEnds, *,
                  max_episode_tokens: int) -> None:
        """Decode whole episodes, each turn continuing in its slot (see the module docstring).

        prompts[e], params[e]: episode e's prompt and first turn (n = 1). Whenever turns end (after
        a chunk), `turn_ends` gets them as (e, Generation) and answers, for each, the episode's
        `NextTurn` or None (the episode is over). A turn's row seed comes from (its params' seed,
        e), so the first turn draws as `generate` would. `max_episode_tokens`: the most tokens an
        episode decodes into after its prompt (actions and prefilled observations, the last turn
        included): the KV length is reserved from it, and a next turn that would not fit is an
        error, not a silent cut."""
        per_prompt = check_requests(prompts, params, self.vocab_size)
        if any(sp.n != 1 or sp.allowed_tokens is not None for sp in per_prompt):
            raise ConfigError("run_turns: each episode is one row (n = 1) without allowed_tokens; "
                              "use generate for those")
        if max_episode_tokens < 1:
            raise ConfigError(f"run_turns: max_episode_tokens must be >= 1, got {max_episode_tokens}")
        rows = [Row(e, list(prompt), sp, self._seed(sp, e, 0)) for e, (prompt, sp) in enumerate(zip(prompts, per_prompt))]
        self._decode(rows, turn_ends, max_episode_tokens)

    @staticmethod
    def _seed(sp: SamplingParams, index: int, sample: int) -> int:
        base_seed = sp.seed if sp.seed is not None else int(torch.randint(2**62, ()).item())
        return row_seed(base_seed, index, sample) % SEED_MODULUS

    def _generation(self, row: Row) -> Generation:
        return to_generation(self.tokenizer, row.token_ids, row.logprobs, row.stop_reason, row.stop_string)

    def _decode(self, rows: list[Row], turn_ends: TurnEnds | None = None, episode_tokens: int = 0) -> None:
        if not rows:
            return
        rows.sort(key=lambda r: len(r.prompt))   # stable: one prompt's samples stay together
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                self._run(rows, turn_ends, episode_tokens)
        finally:
            self.model.train(was_training)

    def _run(self, rows: list[Row], turn_ends: TurnEnds | None, episode_tokens: int) -> None:
        n_slots = min(self.max_batch_size, 1 << (len(rows) - 1).bit_length())
        need = max(len(r.prompt) + max(r.params.max_new_tokens, episode_tokens) for r in rows) + self.check_every + 1
        state = SlotState(self, n_slots, -(-need // LENGTH_STEP) * LENGTH_STEP)
        # Sampling flags are fixed for the call (they pick the compiled step): an episode's later
        # turns must keep within them (checked in _turn_ends).
        sampling = _sampling_flags([r.params for r in rows])
        pending, in_slot = deque(rows), [None] * n_slots
        resumed: list[tuple[int, Row]] = []    # (slot, row): next turns to prefill in their own slots
        timed = any(r.params.deadline is not None for r in rows)   # else the clock is never read
        while True:
            free = [s for s, row in enumerate(in_slot) if row is None]
            ended: list[tuple[int | None, Row]] = []
            if resumed or (pending and free):
                batch, resumed = resumed, []
                if pending and free:
                    waiting = [pending.popleft() for _ in range(min(len(free), len(pending)))]
                    live = expire_rows(waiting)   # waited past its deadline: ends with no tokens, takes no slot
                    ended += [(None, r) for r in waiting if r.stop_reason == "timeout"]
                    batch += list(zip(free, live))
                if batch:
                    ended += self._admit(state, batch, in_slot, sampling)
            else:
                active = [s for s, row in enumerate(in_slot) if row is not None]
                if not active:
                    return
                if self.compact and not pending and len(active) <= state.n_slots // 2:
                    state, in_slot = state.compacted(active, in_slot)
                    active = list(range(len(active)))
                steps = min(self.check_every, max(in_slot[s].remaining for s in active))
                width = state.width_for([in_slot[s] for s in active], steps) if self.width_buckets else state.length
                tokens, logprobs = state.chunk(steps, sampling, width)
                self.decode_steps += steps
                self.slot_steps += steps * state.n_slots
                now = time.monotonic() if timed else None
                for s in active:
                    row = in_slot[s]
                    before = len(row.token_ids)
                    done = row.extend(tokens[s], logprobs[s], self)
                    self.busy_row_steps += len(row.token_ids) - before
                    if not done and past_deadline(row.params, now):
                        row.stop_reason, done = "timeout", True
                    if done:
                        ended.append((s, row))
            if ended:
                resumed = self._turn_ends(state, ended, in_slot, turn_ends, pending, sampling)
                timed = timed or any(r.params.deadline is not None for r in [*(r for _, r in resumed), *pending])

    def _admit(self, state: SlotState, batch: list[tuple[int, Row]], in_slot: list, sampling) -> list[tuple[int, Row]]:
        """Prefill each (slot, row) of `batch` into its slot (a next turn continuing in place: only its
        new tokens), draw each row's first token; the rows already done with it."""
        slots, rows = [s for s, _ in batch], [r for _, r in batch]
        fresh = all(r.fed == 0 for r in rows)
        hits = [self._store.longest_prefix(r.prompt) if self._store is not None and r.fed == 0 else (0, None)
                for r in rows]
        slot_ids = torch.tensor(slots, device=self.device)
        starts = [r.fed or n for r, (n, _) in zip(rows, hits)]
        if any(entry is not None for _, entry in hits):
            for s, (n, entry) in zip(slots, hits):
                if entry is not None:      # one copy per row: all layers' K, then V
                    state.kv[0, :, s, :, :n] = entry.keys
                    state.kv[1, :, s, :, :n] = entry.values
        elif fresh and len(rows) > 1 and (shared := shared_prefix_len([r.prompt for r in rows])) >= self.min_shared_prefix:
            prefix = torch.tensor([rows[0].prompt[:shared]], device=self.device)
            self._forward(prefix, torch.arange(shared, device=self.device)[None], slot_ids[:1], state.keys, state.values)
            state.kv[:, :, slot_ids[1:], :, :shared] = state.kv[:, :, slots[0]:slots[0] + 1, :, :shared]
            self.prefill_tokens += shared
            starts = [shared] * len(rows)
        suffixes = [r.prompt[n:] for r, n in zip(rows, starts)]
        self.prefill_tokens += sum(map(len, suffixes))
        width = max(map(len, suffixes))
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        for k, suffix in enumerate(suffixes):
            input_ids[k, :len(suffix)] = torch.tensor(suffix)
        positions = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
        last = torch.tensor([len(x) - 1 for x in suffixes], device=self.device)
        logits = self._forward(input_ids.to(self.device), positions.to(self.device), slot_ids, state.keys,
                               state.values, last_index=last)
        first, logprob = state.seat(slot_ids, rows, logits, sampling)
        ended = []
        for s, row, token, lp in zip(slots, rows, first.tolist(), logprob.tolist()):
            in_slot[s] = row
            if row.extend([token], [lp], self):
                ended.append((s, row))
        return ended

    def _turn_ends(self, state: SlotState, ended: list[tuple[int | None, Row]], in_slot: list,
                   turn_ends: TurnEnds | None, pending: deque, sampling) -> list[tuple[int, Row]]:
        """Rows whose turn ended: free their slots (`generate`), or ask `turn_ends` what each episode
        does next and return the next turns that continue in their slots (`run_turns`)."""
        if turn_ends is None:
            for s, _ in ended:
                if s is not None:
                    self._release(state, s, in_slot)
            return []
        # The callback retrieves (a retriever policy records log-probs it trains on): outside inference mode.
        with torch.inference_mode(False):
            answers = turn_ends([(row.prompt_index, self._generation(row)) for _, row in ended])
        if len(answers) != len(ended):
            raise RagrlError(f"run_turns: the turn-end callback answered {len(answers)} times for {len(ended)} turns")
        resumed = []
        for (s, row), answer in zip(ended, answers):
            if answer is None:
                if s is not None:
                    in_slot[s] = None
                continue
            if not isinstance(answer, NextTurn):
                raise RagrlError(f"run_turns: the turn-end callback must answer a NextTurn or None, got {answer!r}")
            sp = answer.params
            row.next_turn(answer.observation, sp, self._seed(sp, row.prompt_index, 0), in_slot=s is not None)
            check_requests([row.prompt], sp, self.vocab_size)     # the observation's ids, the params' values
            if sp.n != 1 or sp.allowed_tokens is not None:
                raise ConfigError("run_turns: a next turn is one row (n = 1) without allowed_tokens")
            if any(now and not then for now, then in zip(_sampling_flags([sp]), sampling)):
                raise ConfigError("run_turns: a next turn samples (or uses top-p) where the episodes' first turns "
                                  "did not; keep temperature and top_p alike across an episode's turns")
            if len(row.prompt) + sp.max_new_tokens + self.check_every + 1 > state.length:
                raise RagrlError(f"run_turns: episode {row.prompt_index}'s next turn needs "
                                 f"{len(row.prompt) + sp.max_new_tokens} KV columns, past the {state.length} reserved "
                                 "from its prompt and max_episode_tokens")
            if s is None:
                pending.append(row)         # it never held a slot (it expired waiting): seated afresh
            else:
                resumed.append((s, row))
        return resumed

    def _release(self, state: SlotState, slot: int, in_slot: list) -> None:
        row, in_slot[slot] = in_slot[slot], None
        if self._store is not None:   # the row's KV for its episode's next turn (its last token was never fed)
            n = len(row.prompt) + len(row.token_ids) - 1
            self._store.put_entry(row.prompt + row.token_ids[:-1], state.kv[0, :, slot, :, :n].clone(),
                                  state.kv[1, :, slot, :, :n].clone())
