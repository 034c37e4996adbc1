"""action_logprobs: the LM head only at action positions equals the full-logits computation."""
import copy

import pytest
import torch
from torch import nn

from ragrl.algos.masked import AlgoInputError
from ragrl.errors import ModelError
from ragrl.models.tiny import make_tiny_model
from ragrl.policy.logprobs import (action_logprobs, decoder_and_head, decoder_hidden_states, logprobs_from_hidden,
                                  position_ids_from_mask)


@pytest.fixture(scope="module")
def tiny():
    model, _ = make_tiny_model()
    return model


def _batch(vocab: int, seed: int = 0):
    """Three rows of length 20: right-padded, left-padded, full; ~40% marked positions."""
    g = torch.Generator().manual_seed(seed)
    B, L = 3, 20
    ids = torch.randint(vocab, (B, L), generator=g)
    attn = torch.ones(B, L, dtype=torch.long)
    attn[0, 15:] = 0          # right padding
    attn[1, :6] = 0           # left padding
    wanted = (torch.rand(B, L, generator=g) < 0.4) & attn.bool()
    first_real = attn.argmax(dim=1)
    wanted[torch.arange(B), first_real] = False   # nothing predicts a row's first token
    wanted[0, 14] = wanted[1, 19] = wanted[2, 7] = True
    return ids, attn, wanted


def _naive(model, ids, attn, wanted, temperature=1.0):
    """Full [B, L, V] logits, log-softmax everywhere, then pick the marked targets."""
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    zero = torch.zeros((), dtype=picked.dtype)
    pad = lambda x: torch.nn.functional.pad(torch.where(wanted[:, 1:], x, zero), (1, 0))  # noqa: E731
    return pad(picked), pad(entropy)


def test_matches_full_logits_with_padding_and_chunks(tiny):
    ids, attn, wanted = _batch(tiny.config.vocab_size)
    with torch.no_grad():
        for temperature in (1.0, 0.7):
            lp, ent = action_logprobs(tiny, ids, attn, wanted, temperature=temperature, with_entropy=True, chunk=5)
            ref_lp, ref_ent = _naive(tiny, ids, attn, wanted, temperature)
            torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
            assert (lp[~wanted] == 0).all() and (lp[wanted] < 0).all()
        lp_no_ent, none = action_logprobs(tiny, ids, attn, wanted)
        assert none is None
        torch.testing.assert_close(lp_no_ent, _naive(tiny, ids, attn, wanted)[0], atol=1e-5, rtol=0)


def test_left_padding_gives_the_unpadded_answer(tiny):
    ids, attn, wanted = _batch(tiny.config.vocab_size, seed=1)
    with torch.no_grad():
        padded, _ = action_logprobs(tiny, ids, attn, wanted)
        alone, _ = action_logprobs(tiny, ids[1:2, 6:], attn[1:2, 6:], wanted[1:2, 6:])
    torch.testing.assert_close(padded[1, 6:], alone[0], atol=1e-5, rtol=0)


def test_gradient_matches_full_logits(tiny):
    model = copy.deepcopy(tiny)
    ids, attn, wanted = _batch(model.config.vocab_size, seed=2)
    params = [model.lm_head.weight, model.model.layers[0].self_attn.q_proj.weight]
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    lp, ent = action_logprobs(model, ids, attn, wanted, with_entropy=True)
    ours = torch.autograd.grad((lp * weights).sum() + ent.sum(), params)
    ref_lp, ref_ent = _naive(model, ids, attn, wanted)
    naive = torch.autograd.grad((ref_lp * weights).sum() + ref_ent.sum(), params)
    for a, b in zip(ours, naive):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_peft_lora_model(tiny):
    from peft import LoraConfig, get_peft_model

    # init_lora_weights=False: random, non-zero adapters, so LoRA visibly changes the outputs
    peft_model = get_peft_model(copy.deepcopy(tiny), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                init_lora_weights=False))
    ids, attn, wanted = _batch(tiny.config.vocab_size, seed=4)
    lp, _ = action_logprobs(peft_model, ids, attn, wanted)
    with torch.no_grad():
        torch.testing.assert_close(lp.detach(), _naive(peft_model, ids, attn, wanted)[0], atol=1e-5, rtol=0)
        base, _ = action_logprobs(tiny, ids, attn, wanted)
    assert (lp.detach() - base).abs().max() > 1e-3          # the adapters were really applied
    lp.sum().backward()
    lora_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)


class _WithValueHead(nn.Module):
    """The trl layout: the causal LM in .pretrained_model, a scalar head beside it."""

    def __init__(self, lm):
        super().__init__()
        self.pretrained_model = lm
        self.v_head = nn.Linear(lm.config.hidden_size, 1)


def test_value_head_wrapper_and_shared_hidden_states(tiny):
    wrapped = _WithValueHead(tiny)
    ids, attn, wanted = _batch(tiny.config.vocab_size, seed=5)
    with torch.no_grad():
        lp, _ = action_logprobs(wrapped, ids, attn, wanted)
        torch.testing.assert_close(lp, _naive(tiny, ids, attn, wanted)[0], atol=1e-5, rtol=0)
        # one decoder pass feeding both the LM head and the value head
        hidden = decoder_hidden_states(wrapped, ids, attn)
        lp2, _ = logprobs_from_hidden(hidden, decoder_and_head(wrapped)[1], ids, wanted)
        assert torch.equal(lp, lp2)
        assert wrapped.v_head(hidden).shape == (*ids.shape, 1)


def test_bad_positions_and_models_are_named(tiny):
    ids, attn, wanted = _batch(tiny.config.vocab_size)
    at_zero = wanted.clone()
    at_zero[2, 0] = True
    with pytest.raises(AlgoInputError, match="position 0"):
        action_logprobs(tiny, ids, attn, at_zero)
    on_pad = wanted.clone()
    on_pad[0, 17] = True
    with pytest.raises(AlgoInputError, match="padding"):
        action_logprobs(tiny, ids, attn, on_pad)
    first_real = wanted.clone()
    first_real[1, 6] = True
    with pytest.raises(AlgoInputError, match="first real token"):
        action_logprobs(tiny, ids, attn, first_real)
    with pytest.raises(ModelError, match="cannot find a decoder"):
        action_logprobs(nn.Linear(4, 4), ids, attn, wanted)
