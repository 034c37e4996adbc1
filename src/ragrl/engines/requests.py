"""What every local engine does around its decode loop: check a request, seed its rows, turn sampled
ids into a `Generation`, cut rows at their wall-time deadline. Shared by `HFEngine` and
`StaticEngine` so both refuse the same requests and report the same stop reasons."""
from __future__ import annotations

import hashlib
import math
import time

from ragrl.engines.base import Generation, SamplingParams
from ragrl.errors import ConfigError, RagrlError


def check_requests(prompts, params, vocab_size: int) -> list[SamplingParams]:
    """One SamplingParams per prompt, after checking prompts and params; errors name the problem."""
    if not isinstance(prompts, (list, tuple)):
        raise RagrlError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    per_prompt = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise ConfigError(f"got {len(per_prompt)} SamplingParams for {len(prompts)} prompts")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise RagrlError(f"prompt {i} is empty; every prompt needs at least one token")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise RagrlError(f"prompt {i} has token ids outside the vocabulary [0, {vocab_size})")
    for sp in per_prompt:
        if sp.max_new_tokens < 1 or sp.n < 1:
            raise ConfigError(f"max_new_tokens and n must be >= 1, got {sp.max_new_tokens} and {sp.n}")
        if sp.temperature < 0 or not 0 < sp.top_p <= 1:
            raise ConfigError(f"need temperature >= 0 and 0 < top_p <= 1, got {sp.temperature}, {sp.top_p}")
        if any(not s for s in sp.stop):
            raise ConfigError("stop strings must be non-empty")
        if sp.deadline is not None and (not isinstance(sp.deadline, (int, float)) or math.isnan(sp.deadline)):
            raise ConfigError(f"deadline must be a time.monotonic() instant or None, got {sp.deadline!r}")
    return per_prompt


def deadline_clock(rows) -> float | None:
    """`time.monotonic()` when any of `rows` (each with `.params`) has a deadline, else None: a
    batch with no bound never reads the clock, and one with bounds reads it once per check."""
    return time.monotonic() if any(r.params.deadline is not None for r in rows) else None


def past_deadline(params: SamplingParams, now: float | None) -> bool:
    """True when `params` has a deadline and the clock reading `now` (None: not read) is at or past it."""
    return now is not None and params.deadline is not None and now >= params.deadline


def expire_rows(rows: list) -> list:
    """Rows (each with `.params` and `.stop_reason`) whose deadline has passed before they ran end
    here, with no tokens and stop_reason "timeout"; the others are returned, to be decoded. Called
    before a prefill, so a row that waited past its bound costs no compute."""
    now = deadline_clock(rows)
    live = []
    for row in rows:
        if past_deadline(row.params, now):
            row.stop_reason = "timeout"
        else:
            live.append(row)
    return live


def row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed for one row, from (request seed, prompt position, sample index) alone."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def stop_string_in(text: str, stops: list[str]) -> str | None:
    """The stop string that occurs first in `text`, if any."""
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits)[1] if hits else None


def stop_window(stops: list[str]) -> int:
    """Tokens to decode to see any stop string that ends in the newest token: a string of L
    characters spans at most 4L byte-level tokens, plus slack for a partial character."""
    return 4 * max(len(s) for s in stops) + 4


def to_generation(tokenizer, token_ids: list[int], logprobs: list[float], stop_reason: str,
                  stop_string: str | None) -> Generation:
    # The eos token stays in token_ids (the policy must learn to emit it) but not in the text.
    text_ids = token_ids[:-1] if stop_reason == "eos" else token_ids
    return Generation(token_ids=token_ids, logprobs=logprobs, stop_reason=stop_reason,
                      stop_string=stop_string, text=tokenizer.decode(text_ids))


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving every prompt at least one own token."""
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for i in range(n):
        t = first[i]
        if any(p[i] != t for p in prompts):
            return i
    return max(n, 0)


def default_eos(model, tokenizer) -> frozenset[int]:
    """End-of-sequence ids: the tokenizer's eos, `<|im_end|>`, and the generation config's eos."""
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(config_eos if isinstance(config_eos, (list, tuple)) else [config_eos])
    ids.discard(None)
    if not ids:
        raise ConfigError("the tokenizer has no eos token; pass eos_token_ids= to the engine")
    return frozenset(ids)
