"""The frozen trunk: kept states of the bottom layers give the forward and the update of the whole decoder."""
import dataclasses

import pytest
import torch

from ragrl.models.agent_adapters import reference_context
from ragrl.models.tiny import make_tiny_model
from ragrl.policy.batch import TrajBatch
from ragrl.policy.frozen_trunk import frozen_depth
from ragrl.policy.lm import LMPolicy
from ragrl.policy.lm_model import ValueHead, forward_actions, freeze_reference, trunk_states
from ragrl.policy.logprobs import decoder_and_head
from ragrl.train.config import AlgoConfig
from ragrl.train.update import ppo_update, prepare


def _model(adapted_layers=(2, 3), layers: int = 4, lora_dropout: float = 0.0):
    from peft import LoraConfig, get_peft_model

    model, tok = make_tiny_model(layers=layers, seed=0)
    torch.manual_seed(0)   # peft draws lora_A from the global generator: the same model each call
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"],
                                             layers_to_transform=list(adapted_layers), lora_dropout=lora_dropout))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():   # non-zero LoRA B, so the adapters act
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model, tok


def _batch(B: int = 6, L: int = 70, prefix: int = 40) -> TrajBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (B, L), generator=g)
    ids[:, :prefix] = ids[0, :prefix]                      # a shared system prompt
    attn = torch.ones(B, L, dtype=torch.long)
    for row, end in ((1, 50), (2, 61), (4, 45)):           # right padding, as collate makes it
        attn[row, end:] = 0
    act = torch.zeros(B, L)
    act[:, 42:44] = 1
    act[:, 47:60] = 1
    act = act * attn
    old = -torch.rand(B, L, generator=g) * act
    return TrajBatch(ids, attn, act, old, torch.rand(B, generator=g), torch.arange(B) // 2)


def _decoder(model):
    return decoder_and_head(model)[0]


def test_frozen_depth_is_the_first_layer_with_an_adapter_or_a_trainable_weight():
    model, _ = _model(adapted_layers=(2, 3))
    assert frozen_depth(model, _decoder(model)) == 2
    model, _ = _model(adapted_layers=(1, 3))
    assert frozen_depth(model, _decoder(model)) == 1
    plain, _ = make_tiny_model(layers=4)
    assert frozen_depth(plain, _decoder(plain)) == 0          # full fine-tuning: every weight trains
    plain.requires_grad_(False)
    assert frozen_depth(plain, _decoder(plain)) == 4          # nothing of the decoder trains
    _decoder(plain).layers[3].mlp.down_proj.weight.requires_grad_(True)
    assert frozen_depth(plain, _decoder(plain)) == 3
    _decoder(plain).embed_tokens.weight.requires_grad_(True)
    assert frozen_depth(plain, _decoder(plain)) == 0          # trainable embeddings move every layer
    model, _ = _model(adapted_layers=(2, 3))
    model.config.attention_dropout = 0.1                      # a fresh draw in every training forward
    assert frozen_depth(model, _decoder(model)) == 0
    model.config.attention_dropout = 0.0
    _decoder(model).layers[1].mlp.add_module("drop", torch.nn.Dropout(0.1))
    assert frozen_depth(model, _decoder(model)) == 1


def test_the_kept_trunk_gives_the_whole_decoders_log_probs_values_entropy_and_gradients():
    model, _ = _model()
    freeze_reference(model)
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.proj.weight)
    b = _batch()
    depth = frozen_depth(model, _decoder(model))
    trunk = trunk_states(model, b.input_ids, b.attention_mask, b.action_mask, depth)
    assert trunk.shape == (*b.input_ids.shape, model.config.hidden_size) and not trunk.requires_grad
    results = []
    for kept in (None, trunk):
        model.zero_grad()
        head.zero_grad()
        out = forward_actions(model, b.input_ids, b.attention_mask, b.action_mask, value_head=head,
                              with_entropy=True, trunk=kept, trunk_depth=depth)
        (out["logprobs"].sum() + out["values"].sum()).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        with torch.no_grad(), reference_context(model):
            ref = forward_actions(model, b.input_ids, b.attention_mask, b.action_mask, trunk=kept,
                                  trunk_depth=depth)["logprobs"]
        results.append({**{k: out[k].detach() for k in ("logprobs", "values", "entropy")}, "grads": grads,
                        "ref": ref})
    plain, kept = results
    for key in ("logprobs", "values", "entropy", "ref"):
        assert (plain[key] - kept[key]).abs().max() < 1e-4, key
    assert plain["grads"].abs().max() > 0
    assert (plain["grads"] - kept["grads"]).abs().max() < 1e-4 * plain["grads"].abs().max()
    # the trunk is really used: other states give other log-probs
    moved = forward_actions(model, b.input_ids, b.attention_mask, b.action_mask, trunk=trunk + 1.0,
                            trunk_depth=depth)["logprobs"].detach()
    assert (moved - plain["logprobs"]).abs().max() > 1e-2
    # and the decoder is itself again afterwards
    again = forward_actions(model, b.input_ids, b.attention_mask, b.action_mask)["logprobs"].detach()
    assert torch.equal(again, forward_actions(model, b.input_ids, b.attention_mask, b.action_mask)["logprobs"].detach())
    assert (again - plain["logprobs"]).abs().max() < 1e-5


def test_a_ppo_update_on_the_kept_trunk_is_the_update_on_the_whole_decoder():
    """PPO with a critic, a KL reference in the reward and two epochs: four forwards a row, reused."""
    cfg = AlgoConfig(estimator="gae", kl_in_reward=True, ppo_epochs=2, minibatch_size=3, micro_batch_size=2)
    outcomes = []
    for reuse in (False, True):
        model, tok = _model()
        freeze_reference(model)
        head = ValueHead(model.config.hidden_size)
        torch.nn.init.normal_(head.proj.weight, std=0.1)
        policy = LMPolicy(model, tok, head)
        prep = prepare(policy, _batch(), dataclasses.replace(cfg, reuse_frozen_trunk=reuse), 0.05, 2)
        assert (prep.batch.trunk is not None) == reuse
        params = policy.trainable_parameters()
        stats = ppo_update(policy, torch.optim.SGD(params, lr=0.5), prep, cfg, 0.05, 1.0,
                           torch.Generator().manual_seed(0))
        outcomes.append((prep, stats, torch.cat([p.detach().flatten() for p in params])))
    (p0, s0, w0), (p1, s1, w1) = outcomes
    for name in ("ref_logprobs", "old_values", "advantages", "returns"):
        assert (getattr(p0, name) - getattr(p1, name)).abs().max() < 1e-4, name
    assert s0["updates"] == s1["updates"] == 4
    assert abs(s0["loss"] - s1["loss"]) < 1e-4
    assert (w0 - w1).abs().max() < 1e-4


def test_a_single_forward_update_or_a_switched_off_setting_keeps_no_trunk():
    model, tok = _model()
    policy = LMPolicy(model, tok)
    once = prepare(policy, _batch(), AlgoConfig(estimator="grpo"), 0.0, 2)   # one epoch, no reference
    assert once.batch.trunk is None
    off = prepare(policy, _batch(), AlgoConfig(estimator="grpo", ppo_epochs=2, reuse_frozen_trunk=False), 0.0, 2)
    assert off.batch.trunk is None
    full, _ = _model(adapted_layers=(0, 1, 2, 3))          # an adapter in the first layer: nothing frozen
    kept = prepare(LMPolicy(full, tok), _batch(), AlgoConfig(estimator="grpo", ppo_epochs=2), 0.0, 2)
    assert kept.batch.trunk is None


def test_misuse_is_refused_with_a_clear_error():
    model, tok = _model()
    b = _batch()
    trunk = trunk_states(model, b.input_ids, b.attention_mask, b.action_mask, 2)
    with pytest.raises(ValueError, match="do not match the batch"):
        forward_actions(model, b.input_ids[:, :60], b.attention_mask[:, :60], b.action_mask[:, :60],
                        trunk=trunk, trunk_depth=2)
    with pytest.raises(ValueError, match="every row of the batch once"):
        LMPolicy(model, tok).with_frozen_trunk(b, [torch.tensor([0, 1, 2])])
    # a selected batch keeps its rows' states, trimmed as the ids are
    kept = LMPolicy(model, tok).with_frozen_trunk(b, [torch.tensor([4, 1]), torch.tensor([0, 2, 3, 5])])
    part = kept.select(torch.tensor([4, 1]))
    assert part.trunk.shape == (2, 50, model.config.hidden_size) and part.trunk_depth == 2
    assert torch.equal(part.trunk, kept.trunk[[4, 1], :50])


def test_a_model_whose_kept_trunk_disagrees_runs_the_whole_decoder_and_says_so(monkeypatch, caplog):
    """A fault injected: kept states that are not the decoder's (as a decoder that scales its input
    embeddings would give). The first update's check finds it, and no update uses them."""
    import ragrl.policy.lm as lm

    model, tok = _model()
    policy = LMPolicy(model, tok)
    real = lm.trunk_states
    monkeypatch.setattr(lm, "trunk_states", lambda *a: real(*a) * 1.5)
    with caplog.at_level("INFO", logger="ragrl.train"):
        first = policy.with_frozen_trunk(_batch(), [torch.arange(3), torch.arange(3, 6)])
    assert first.trunk is None and policy._trunk_agrees is False
    assert "differ from the whole decoder's" in caplog.text
    assert policy.with_frozen_trunk(_batch(), [torch.arange(6)]).trunk is None   # decided once
    monkeypatch.setattr(lm, "trunk_states", real)
    agreeing = LMPolicy(model, tok)
    assert agreeing.with_frozen_trunk(_batch(), [torch.arange(6)]).trunk is not None
    assert agreeing._trunk_agrees is True
    # a LoRA dropout above the trunk draws anew each pass; the check runs without it, in eval mode
    dropping, tok = _model(lora_dropout=0.5)
    dropping.train()
    policy = LMPolicy(dropping, tok)
    assert policy.with_frozen_trunk(_batch(), [torch.arange(6)]).trunk is not None
    assert policy._trunk_agrees is True and dropping.training
