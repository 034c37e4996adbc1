"""KV caches for the HF engine's decode loop.

GrowingLayer: transformers' DynamicLayer appends each decoded token with torch.cat, which copies
the whole cache of every layer at every step (O(length) per token). Here keys/values live in a
buffer with spare room and a token is written in place; the buffer is reallocated only when it
is full or after the batch changed (rows dropped or repeated), which replaces the tensors.

PrefixStore: a multi-turn episode re-sends its whole history each turn (prompt, the actions so
far, the observations), and the engine would prefill all of it again. Within one rollout the
weights do not change, so the KV of (prompt + generated tokens) computed in turn t is still
exact in turn t+1: the store keeps each finished row's KV, and a later prompt that extends a
stored sequence prefills only its new tokens. It must be emptied whenever the weights change,
which is why the engine only fills it inside `HFEngine.prefix_caching()`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A DynamicLayer that appends in place into a buffer with spare capacity."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._kbuf = self._vbuf = None
        n = self.keys.shape[-2] if self.keys.numel() else 0
        t = key_states.shape[-2]
        kbuf = self._kbuf
        if (kbuf is None or n + t > kbuf.shape[-2] or kbuf.shape[0] != key_states.shape[0]
                or (n and kbuf.data_ptr() != self.keys.data_ptr())):
            # The tensors were replaced (batch_select_indices / repeat) or the buffer is full.
            cap = n + t + max(64, (n + t) // 2)
            B, H, _, D = key_states.shape
            self._kbuf = key_states.new_empty((B, H, cap, D))
            self._vbuf = value_states.new_empty((B, value_states.shape[1], cap, value_states.shape[-1]))
            if n:
                self._kbuf[:, :, :n] = self.keys
                self._vbuf[:, :, :n] = self.values
        self._kbuf[:, :, n:n + t] = key_states
        self._vbuf[:, :, n:n + t] = value_states
        self.keys, self.values = self._kbuf[:, :, :n + t], self._vbuf[:, :, :n + t]
        return self.keys, self.values


def new_cache() -> DynamicCache:
    """An empty cache whose layers append in place (see GrowingLayer)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    keys: object      # the engine's own layout: HFEngine a list per layer of [H, T, D], StaticEngine [layers, H, T, D]
    values: object


_HASH_BASE, _HASH_MOD = 1_000_003, (1 << 61) - 1


def _prefix_hashes(tokens: list[int]) -> list[int]:
    """h[n] = polynomial hash of tokens[:n], for every n: one pass, so a lookup is O(prompt length)."""
    out, h = [0], 0
    for t in tokens:
        h = (h * _HASH_BASE + t + 1) % _HASH_MOD
        out.append(h)
    return out


class PrefixStore:
    """KV of finished rows, keyed by their exact token ids, for the next turn's prompts.

    max_tokens bounds the memory: once the stored sequences reach it, new rows are not stored
    (they are simply prefilled in full next time). A lookup hashes the prompt's prefixes once and
    probes each stored length (then compares the tokens of a hit): with a few hundred rows of
    different lengths, slicing and hashing the prompt per stored length cost seconds a turn.
    """

    def __init__(self, max_tokens: int = 262_144):
        self.max_tokens = max_tokens
        self._entries: dict[tuple[int, int], _Entry] = {}
        self._lengths: set[int] = set()
        self.tokens = 0
        self.hits = self.misses = 0

    def put(self, tokens: list[int], cache: DynamicCache, row: int, columns: torch.Tensor) -> None:
        """Store row `row` of `cache` at key positions `columns` (the row's real tokens) as `tokens`."""
        if len(tokens) != len(columns) or self.tokens + len(tokens) > self.max_tokens:
            return
        self.put_entry(tokens, [layer.keys[row][:, columns].clone() for layer in cache.layers],
                       [layer.values[row][:, columns].clone() for layer in cache.layers])

    def put_entry(self, tokens: list[int], keys, values) -> None:
        """Store KV (in the engine's own layout) as the KV of exactly `tokens`."""
        if self.tokens + len(tokens) > self.max_tokens:
            return
        self._entries[(len(tokens), _prefix_hashes(tokens)[-1])] = _Entry(tuple(tokens), keys, values)
        self._lengths.add(len(tokens))
        self.tokens += len(tokens)

    def longest_prefix(self, prompt: list[int]) -> tuple[int, _Entry | None]:
        """(length, entry) of the longest stored sequence that is a proper prefix of `prompt`."""
        hashes = _prefix_hashes(prompt)
        for n in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            entry = self._entries.get((n, hashes[n]))
            if entry is not None and entry.tokens == tuple(prompt[:n]):
                self.hits += 1
                return n, entry
        self.misses += 1
        return 0, None

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.tokens = 0


def batch_from_entries(entries: list[_Entry], lengths: list[int], device) -> tuple[DynamicCache, torch.Tensor]:
    """A batch cache of the rows' stored KV, left-padded to the longest: (cache, past_mask [B, C])."""
    C, B = max(lengths), len(entries)
    mask = torch.zeros((B, C), dtype=torch.long, device=device)
    for k, n in enumerate(lengths):
        mask[k, C - n:] = 1
    cache = new_cache()
    for layer_idx in range(len(entries[0].keys)):
        k0, v0 = entries[0].keys[layer_idx], entries[0].values[layer_idx]
        keys = k0.new_zeros((B, k0.shape[0], C, k0.shape[-1]))
        values = v0.new_zeros((B, v0.shape[0], C, v0.shape[-1]))
        for k, (e, n) in enumerate(zip(entries, lengths)):
            keys[k, :, C - n:] = e.keys[layer_idx]
            values[k, :, C - n:] = e.values[layer_idx]
        cache.update(keys, values, layer_idx)
    return cache, mask
