"""Per-token log-probs of given token ids under a causal LM, computed only where needed.

With SmolLM2's 49k vocabulary the LM head (hidden → vocab matmul plus log-softmax) costs
more than the whole decoder on CPU when run on every position. RL needs log-probs only
on action tokens (often a fifth of the sequence), so we run the decoder body once,
pick the hidden states that *predict* the action tokens (position p-1 predicts token p),
and apply the LM head to those alone, in chunks.

Works with a plain *ForCausalLM, a peft PeftModel around one (LoRA layers live inside
the decoder, so calling the decoder runs them), and a value-head wrapper that keeps the
LM in `.pretrained_model` (trl's convention). To share one decoder pass between the LM
head and a value head, call `decoder_hidden_states` then `logprobs_from_hidden`.
"""
from __future__ import annotations

import torch
from torch import nn

from ragrl.algos.masked import AlgoInputError
from ragrl.errors import ModelError
from ragrl.policy.fsdp import is_sharded, root_decoder_states


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(decoder body returning hidden states, LM head) of a causal LM or a wrapper around one."""
    candidate, seen = model, []
    while candidate is not None and len(seen) < 4:
        seen.append(type(candidate).__name__)
        get_head = getattr(candidate, "get_output_embeddings", None)
        get_decoder = getattr(candidate, "get_decoder", None)
        head = get_head() if callable(get_head) else None
        if head is not None and callable(get_decoder):
            decoder = get_decoder()
            if decoder is not None and decoder is not candidate:
                return decoder, head
        # trl-style value-head models and DDP keep the LM one attribute down.
        inner = getattr(candidate, "pretrained_model", None)
        candidate = inner if inner is not None else getattr(candidate, "module", None)
    raise ModelError(f"cannot find a decoder and an LM head in {' -> '.join(seen)}; expected a causal LM "
                     "(get_decoder() and get_output_embeddings()) or a wrapper with .pretrained_model")


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] attention mask → [B, L] position ids counting real tokens only, so a left-padded
    row gets the same positions as the unpadded sequence (padding positions get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def decoder_hidden_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Final hidden states (after the last norm) of the decoder body: [B, L] → [B, L, H]."""
    decoder, _ = decoder_and_head(model)
    return run_decoder(model, decoder, input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids_from_mask(attention_mask), use_cache=False)


def run_decoder(model: nn.Module, decoder: nn.Module, **inputs) -> torch.Tensor:
    """`decoder(**inputs)`'s last hidden state. Under FSDP it runs through the root module's
    forward instead, so the root's sharded weights (embeddings, final norm) get gathered."""
    if is_sharded(model):
        return root_decoder_states(model, decoder, **inputs)
    out = decoder(**inputs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _check_positions(input_ids, attention_mask, positions_mask) -> torch.Tensor:
    if input_ids.dim() != 2:
        raise AlgoInputError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    for name, t in (("attention_mask", attention_mask), ("positions_mask", positions_mask)):
        if t is not None and t.shape != input_ids.shape:
            raise AlgoInputError(f"{name} has shape {tuple(t.shape)} but input_ids has {tuple(input_ids.shape)}")
    wanted = positions_mask.bool()
    if bool(wanted[:, 0].any()):
        raise AlgoInputError("positions_mask marks position 0, which has no preceding token to predict it")
    if attention_mask is not None:
        real = attention_mask.bool()
        if bool((wanted & ~real).any()):
            raise AlgoInputError("positions_mask marks padding positions (attention_mask is 0 there)")
        if bool((wanted[:, 1:] & ~real[:, :-1]).any()):
            raise AlgoInputError("positions_mask marks the first real token of a row; nothing before it predicts it")
    return wanted


def logprobs_from_hidden(hidden: torch.Tensor, lm_head: nn.Module, input_ids: torch.Tensor,
                         positions_mask: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                         chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[b, p] | prefix) at every marked p, from decoder hidden states.

    hidden [B, L, H], input_ids / positions_mask [B, L] → (logprobs [B, L] float32, 0 where
    not marked; entropy [B, L] of the full next-token distribution there, or None).
    The head runs on `chunk` positions at a time, which bounds the [chunk, V] logits
    buffer when no graph is kept (old/reference log-probs); under autograd each chunk's
    log-softmax is saved for backward anyway.
    """
    if not temperature > 0:
        raise AlgoInputError(f"temperature must be > 0, got {temperature}")
    wanted = _check_positions(input_ids, None, positions_mask)
    rows, cols = wanted.nonzero(as_tuple=True)                     # target positions p
    h = hidden[rows, cols - 1]                                     # [N, H]: state at p-1 predicts p
    targets = input_ids[rows, cols]                                # [N]
    lp_parts, ent_parts = [], []
    for start in range(0, h.shape[0], chunk):
        logits = lm_head(h[start:start + chunk]).float()           # [n, V]
        if temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        lp_parts.append(logp.gather(-1, targets[start:start + chunk, None]).squeeze(-1))
        if with_entropy:
            ent_parts.append(-(logp.exp() * logp).sum(-1))
    empty = hidden.new_zeros(0, dtype=torch.float32)
    out_shape = input_ids.shape
    logprobs = torch.zeros(out_shape, dtype=torch.float32, device=hidden.device).index_put(
        (rows, cols), torch.cat(lp_parts) if lp_parts else empty)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(out_shape, dtype=torch.float32, device=hidden.device).index_put(
            (rows, cols), torch.cat(ent_parts) if ent_parts else empty)
    return logprobs, entropy


def action_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    positions_mask: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                    chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `input_ids` at the positions marked in `positions_mask` (the action tokens).

    model: causal LM, PeftModel around one, or a value-head wrapper (see decoder_and_head).
    input_ids, attention_mask, positions_mask: [B, L]; left or right padding both work,
    positions come from the attention mask. → (logprobs [B, L] float32, 0 where not
    marked; entropy [B, L] or None). Differentiable w.r.t. the model's parameters.
    `temperature` must be the one used for sampling, or the ratios in PPO are off.
    """
    _check_positions(input_ids, attention_mask, positions_mask)
    _, lm_head = decoder_and_head(model)
    hidden = decoder_hidden_states(model, input_ids, attention_mask)
    return logprobs_from_hidden(hidden, lm_head, input_ids, positions_mask, temperature=temperature,
                                with_entropy=with_entropy, chunk=chunk)
