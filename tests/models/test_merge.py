"""What a vLLM copy of a trained policy receives: merged LoRA weights under the base names, and
a staleness signal that no optimizer step escapes. (vLLM itself needs a GPU; this is its input.)"""
import copy

import pytest
import torch

from ragrl.models.merge import ParamVersions, merged_weights
from ragrl.train.config import ModelConfig
from ragrl.policy.lm_model import build_policy


@pytest.fixture()
def lora_model(tiny_model_dir):
    model, _, _ = build_policy(ModelConfig(name=str(tiny_model_dir), lora=True, lora_r=4, lora_alpha=8))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)   # a trained adapter: B is no longer zero
    return model


def test_merged_weights_equal_peft_merge_under_the_base_names_and_leave_the_model_alone(lora_model, tiny_model_dir):
    from ragrl.models.lm_weights import load_policy

    before = {n: t.clone() for n, t in lora_model.state_dict().items()}
    merged = dict(merged_weights(lora_model))
    reference = copy.deepcopy(lora_model).merge_and_unload().state_dict()
    base, _ = load_policy(str(tiny_model_dir))
    assert set(merged) == set(reference) == set(base.state_dict())   # what vLLM's load_weights expects
    changed = 0
    for name, tensor in reference.items():
        torch.testing.assert_close(merged[name], tensor)
        changed += not torch.equal(merged[name], base.state_dict()[name])
    assert changed >= 4   # the adapted projections differ from the base
    after = lora_model.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)   # nothing merged in place


def test_merged_weights_of_a_plain_model_are_its_state_dict(tiny_model_dir):
    from ragrl.models.lm_weights import load_policy

    model, _ = load_policy(str(tiny_model_dir))
    assert [n for n, _ in merged_weights(model)] == list(model.state_dict())


def test_param_versions_see_every_optimizer_step_and_only_those(lora_model):
    versions = ParamVersions(lora_model)
    assert versions.stale()                  # never synced
    versions.mark_synced()
    assert not versions.stale()
    with torch.no_grad():
        lora_model(torch.tensor([[1, 2, 3]]))   # a forward pass writes nothing
    assert not versions.stale()
    params = [p for p in lora_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    lora_model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    assert versions.stale()
    versions.mark_synced()
    lora_model.load_state_dict(lora_model.state_dict())   # a checkpoint restored on resume
    assert versions.stale()


def test_an_evaluated_adapter_is_merged_into_the_weights_with_the_same_logits(lora_model, tiny_model_dir, tmp_path):
    from ragrl.models.agent_adapters import load_adapters
    from ragrl.models.lm_weights import load_policy

    lora_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        unmerged = load_adapters(load_policy(str(tiny_model_dir))[0], tmp_path / "adapter")
        merged = load_adapters(load_policy(str(tiny_model_dir))[0], tmp_path / "adapter", merge=True)
        base = load_policy(str(tiny_model_dir))[0]
        assert hasattr(unmerged, "peft_config") and not hasattr(merged, "peft_config")   # a plain model
        torch.testing.assert_close(merged(ids).logits, unmerged(ids).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(merged(ids).logits, base(ids).logits)   # the adapter is in it
