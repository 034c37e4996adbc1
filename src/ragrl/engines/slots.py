"""The device side of `StaticEngine`: its slots' KV and sampling state, the decode step recorded as
a CUDA graph, and the rows (one sequence's turn) it decodes. See engines/static.py for the design."""
from __future__ import annotations

import torch

from ragrl.engines.base import SamplingParams
from ragrl.engines.requests import stop_string_in, stop_window
from ragrl.engines.sampling import sample_tokens

LENGTH_STEP = 256          # KV length L is rounded up to this, so few (S, L) shapes get compiled


def causal_lm(model):
    """The transformers CausalLM inside a (peft) module."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def attention_widths(length: int) -> list[int]:
    """The widths a decode step may attend over for a KV length L: LENGTH_STEP * 2^k below L, and L.

    A step attends over the narrowest one that holds every live row's columns, so short rows early
    in a long episode do not read (or, on a GPU, launch work over) the whole reserved length; a
    power-of-two ladder keeps the compiled shapes few (4 for L = 1280)."""
    widths, w = [], LENGTH_STEP
    while w < length:
        widths.append(w)
        w *= 2
    return widths + [length]


class SlotState:
    """The device side of one decode call: the KV buffers and each slot's sampling state."""

    def __init__(self, engine, n_slots: int, length: int):
        self.engine, self.n_slots, self.length = engine, n_slots, length
        self.widths = attention_widths(length)
        key = (n_slots, length)
        if key not in engine._buffers:
            if len(engine._buffers) >= 2:     # keep at most two shapes' buffers (and their compiled steps)
                engine._buffers.pop(next(iter(engine._buffers)))
                engine._graphs.clear()
            lm, dev = causal_lm(engine.model), engine.device
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

    def compacted(self, active: list[int], in_slot: list) -> tuple[SlotState, list]:
        """A state with the fewest slots (a power of two) that hold `active`, their KV and sampling
        state copied over in slot order; returns it and the new slot -> row list."""
        smaller = SlotState(self.engine, 1 << (len(active) - 1).bit_length(), self.length)
        index = torch.tensor(active, device=self.engine.device)
        k = len(active)
        smaller.kv[:, :, :k] = self.kv[:, :, index]
        for name in ("tokens", "positions", "counters", "seeds", "temperature", "top_p"):
            getattr(smaller, name)[:k] = getattr(self, name)[index]
        return smaller, [in_slot[s] for s in active] + [None] * (smaller.n_slots - k)

    def seat(self, slot_ids, rows: list[Row], logits, sampling: tuple[bool, bool]):
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

    def width_for(self, rows: list[Row], steps: int) -> int:
        """The narrowest attention width that holds every column `rows` reach in the next `steps`."""
        need = max(r.position + steps for r in rows)
        return next(w for w in self.widths if w >= need)

    def chunk(self, steps: int, sampling: tuple[bool, bool], width: int) -> tuple[list[list[int]], list[list[float]]]:
        """Decode `steps` tokens in every slot, attending over the first `width` columns; the sampled
        tokens and log-probs, read back once."""
        for j in range(steps):
            tokens, logprobs = self.engine._step(self, width, *sampling)
            self.out_tokens[:, j] = tokens
            self.out_logprobs[:, j] = logprobs
            self.tokens.copy_(tokens)
            self.positions.add_(1).clamp_(max=self.length - 1)   # an idle slot runs on harmlessly
            self.counters.add_(1)
        return self.out_tokens[:, :steps].tolist(), self.out_logprobs[:, :steps].tolist()


class CapturedStep:
    """The eager decode step recorded as one CUDA graph (static inputs copied in, outputs reused)."""

    def __init__(self, step, args, keys, values, width: int, use_top_p: bool, any_sampled: bool):
        self.inputs = [a.clone() for a in args]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):          # warm up (allocator, kernels) off the capture
            for _ in range(2):
                step(*self.inputs, keys, values, width, use_top_p, any_sampled)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = step(*self.inputs, keys, values, width, use_top_p, any_sampled)

    def __call__(self, args):
        for dst, src in zip(self.inputs, args):
            dst.copy_(src)
        self.graph.replay()
        return self.outputs


class Row:
    """One sequence's turn: its prompt, seed and what it has generated. `fed` is how many of the
    prompt's tokens already have their KV in the row's slot (its episode's earlier turns, when the
    turn continues in place); the rest are prefilled when it is seated."""

    def __init__(self, prompt_index: int, prompt: list[int], params: SamplingParams, seed: int):
        self.prompt_index, self.prompt, self.params, self.seed = prompt_index, prompt, params, seed
        self.fed = 0
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.stop_reason: str | None = None
        self.stop_string: str | None = None

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.token_ids)

    @property
    def position(self) -> int:
        """The position of the token the next decode step feeds (the newest sampled one)."""
        return len(self.prompt) + len(self.token_ids) - 1

    def next_turn(self, observation: list[int], params: SamplingParams, seed: int, in_slot: bool) -> None:
        """Become the episode's next turn: prompt + this turn's tokens + `observation`. In its slot,
        the KV up to the newest sampled token (never fed) is already there."""
        self.fed = self.position if in_slot else 0
        self.prompt = self.prompt + self.token_ids + list(observation)
        self.params, self.seed = params, seed
        self.token_ids, self.logprobs = [], []
        self.stop_reason = self.stop_string = None

    def extend(self, tokens: list[int], logprobs: list[float], engine) -> bool:
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
