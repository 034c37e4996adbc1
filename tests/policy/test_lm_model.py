"""The training forward: the shared-prefix pass equals the plain pass (values and gradients)."""
import json
import os
import subprocess
import sys

import torch

from ragrl.models.tiny import make_tiny_model
from ragrl.policy.logprobs import decoder_hidden_states
from ragrl.policy.lm_model import ValueHead, forward_actions, shared_prefix_hidden_states


def _lora_model():
    from peft import LoraConfig, get_peft_model

    model, _ = make_tiny_model(seed=0)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], layers_to_transform=[1]))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero LoRA B so the adapters really act on the prefix
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def _batch(prefix: int = 40):
    g = torch.Generator().manual_seed(0)
    B, L = 4, 60
    ids = torch.randint(5, 1000, (B, L), generator=g)
    ids[:, :prefix] = ids[0, :prefix]                     # a shared system prompt
    attn = torch.ones(B, L, dtype=torch.long)
    attn[1, 50:] = 0                                      # right padding, as collate makes it
    attn[2, 55:] = 0
    act = torch.zeros(B, L)
    act[:, 42:48] = 1                                     # action, observation gap, action
    act[:, 52:] = 1
    return ids, attn, act * attn


def test_shared_prefix_hidden_states_equal_the_plain_pass():
    model = _lora_model()
    ids, attn, act = _batch()
    with torch.no_grad():
        shared = shared_prefix_hidden_states(model, ids, attn, act)
        plain = decoder_hidden_states(model, ids, attn)
    assert ((shared - plain).abs() * attn[..., None]).max() < 1e-5


def test_shared_prefix_gradients_equal_the_plain_pass():
    model = _lora_model()
    ids, attn, act = _batch()
    grads = []
    for fn in (shared_prefix_hidden_states, lambda m, i, a, _: decoder_hidden_states(m, i, a)):
        model.zero_grad()
        (fn(model, ids, attn, act) * attn[..., None]).pow(2).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad]))
    scale = grads[1].abs().max()
    assert scale > 0
    assert (grads[0] - grads[1]).abs().max() < 1e-4 * scale


def test_forward_actions_is_zero_off_the_action_mask_and_values_come_from_one_pass():
    model = _lora_model()
    ids, attn, act = _batch()
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.proj.weight)
    out = forward_actions(model, ids, attn, act, value_head=head, with_entropy=True)
    for key in ("logprobs", "entropy", "values"):
        assert (out[key][act == 0] == 0).all()
        assert (out[key][act == 1] != 0).all()
    assert (out["logprobs"][act == 1] < 0).all()
    # a prefix too short to share falls back to the plain pass and gives the same log-probs
    ids2 = ids.clone()
    ids2[1:, 5] += 1                                      # rows now differ from position 5 on
    out2 = forward_actions(model, ids2, attn, act)
    assert torch.allclose(out2["logprobs"][0], out["logprobs"][0], atol=1e-5)


def test_device_names_resolve_or_fail_with_a_clear_error(monkeypatch):
    import pytest

    from ragrl.errors import ConfigError
    from ragrl.policy.lm_model import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # a CPU-only machine
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        resolve_device("cuda:0")
    with pytest.raises(ConfigError, match="model.device must be"):
        resolve_device("gpu please")


def test_build_policy_places_model_and_value_head_on_the_configured_device(tiny_model_dir):
    from ragrl.policy.batch import TrajBatch
    from ragrl.train.config import ModelConfig
    from ragrl.policy.lm_model import build_policy

    model, _, head = build_policy(ModelConfig(name=str(tiny_model_dir), device="cpu", lora_r=4),
                                  with_value_head=True)
    devices = {p.device for p in model.parameters()} | {p.device for p in head.parameters()}
    assert devices == {torch.device("cpu")}
    ids, attn, act = _batch()
    batch = TrajBatch(ids, attn, act, torch.zeros_like(act), torch.zeros(4), torch.arange(4))
    moved = batch.to("meta")                      # every tensor moves, shapes and dtypes kept
    assert all(t.device.type == "meta" for t in moved._tensors())
    assert [(t.shape, t.dtype) for t in moved._tensors()] == [(t.shape, t.dtype) for t in batch._tensors()]


def test_a_warm_started_runs_kl_reference_is_the_policy_it_starts_from(tiny_model_dir, tmp_path):
    """After an SFT warm start (or from `model.init_adapter`) the KL reference is the warm-started
    policy, frozen: not the base model under the adapter, and not moved by RL's updates."""
    from ragrl.train.config import ModelConfig
    from ragrl.models.agent_adapters import reference_context
    from ragrl.policy.lm_model import build_policy, freeze_reference
    from ragrl.train.rng import seed_everything

    seed_everything(0)
    model, _, _ = build_policy(ModelConfig(name=str(tiny_model_dir), lora=True, lora_r=4, lora_alpha=8))
    with torch.no_grad():   # stand-in for SFT: a non-zero adapter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    attn, act = torch.ones_like(ids), torch.ones_like(ids)
    act[:, :4] = 0
    lp = lambda: forward_actions(model, ids, attn, act)["logprobs"].detach()  # noqa: E731

    def ref_lp():
        with torch.no_grad(), reference_context(model):
            return lp()

    with model.disable_adapter():
        base = lp()
    start = lp()
    assert (start - base).abs().max() > 1e-3
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    freeze_reference(model)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable   # the copy is frozen
    assert torch.allclose(ref_lp(), start, atol=1e-6)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable   # still, after switching
    model.save_pretrained(tmp_path / "s", selected_adapters=["default"])   # the start, for the chain below
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    (-(forward_actions(model, ids, attn, act)["logprobs"]).sum()).backward()
    opt.step()
    assert (lp() - start).abs().max() > 1e-3                     # RL moved the policy ...
    assert torch.allclose(ref_lp(), start, atol=1e-6)            # ... and not its reference

    # From a saved adapter (`model.init_adapter`, as `ragrl train` chains SFT into RL): the same.
    model.save_pretrained(tmp_path / "a", selected_adapters=["default"])
    seed_everything(0)
    again, _, _ = build_policy(ModelConfig(name=str(tiny_model_dir), lora=True, lora_r=4, lora_alpha=8,
                                           init_adapter=str(tmp_path / "a")))
    model = again
    assert torch.allclose(ref_lp(), lp(), atol=1e-6) and (lp() - base).abs().max() > 1e-3
    trained = lp()

    # A chain's later stage (`model.reference_adapter`): it starts from the trained adapter `a`, and its
    # frozen start is another folder's (`s`, the weights before RL), loaded frozen.
    model, _, _ = build_policy(ModelConfig(name=str(tiny_model_dir), lora=True, lora_r=4, lora_alpha=8,
                                           init_adapter=str(tmp_path / "a"), reference_adapter=str(tmp_path / "s")))
    assert torch.allclose(lp(), trained, atol=1e-6)                # the policy is the trained stage
    assert torch.allclose(ref_lp(), start, atol=1e-6)              # its reference is the chain's start
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".reference." in n)
    assert any(p.requires_grad for n, p in model.named_parameters() if ".default." in n)


def test_saved_adapter_configs_are_the_same_bytes_whatever_the_hash_seed(tiny_model_dir, tmp_path):
    """Found by benchmarks/soak.py: peft wrote target_modules in a set's order, which differs between
    processes (PYTHONHASHSEED), so a resumed run's adapter_config.json differed from an uninterrupted one's."""
    script = ("import sys; from ragrl.policy.lm_model import build_policy; from ragrl.policy.model_config import "
              "ModelConfig; m, _, _ = build_policy(ModelConfig(name=sys.argv[1], lora=True, lora_r=4)); "
              "m.save_pretrained(sys.argv[2])")
    configs = []
    for seed in ("1", "2", "3"):
        out = tmp_path / seed
        subprocess.run([sys.executable, "-c", script, str(tiny_model_dir), str(out)], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True)
        configs.append((out / "adapter_config.json").read_bytes())
    assert configs[0] == configs[1] == configs[2]
    modules = json.loads(configs[0])["target_modules"]
    assert modules == sorted(modules) and len(modules) > 1
