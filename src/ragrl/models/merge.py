"""The weights a separate inference engine (vLLM) must hold for a model being trained.

A LoRA policy is the frozen base plus low-rank deltas; vLLM loads plain HF parameter names. So the
engine gets, for every base parameter, `W + scale · B·A` computed *out of place*: peft's
`merge_adapter()` / `unmerge_adapter()` would add and then subtract the delta in the base's dtype,
and in bf16 that round trip leaves the frozen base a little different after every sync.

`ParamVersions` says when the copy is stale: every in-place write to a tensor (an optimizer step,
`load_state_dict`, an SFT update) bumps its `_version`, so comparing the sum over the trained
parameters costs nothing and misses no update, whoever made it.
"""
from __future__ import annotations

import torch
from torch import nn


def merged_weights(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs under the base model's parameter names, active LoRA adapters merged in.

    A model without adapters returns its own state dict. Never modifies the model.
    """
    if not hasattr(model, "peft_config"):
        return [(name, t.detach()) for name, t in model.state_dict().items()]
    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            active = [a for a in module.active_adapters if a in module.lora_A]
            if active and not getattr(module, "disable_adapters", False):
                deltas[f"{name}.base_layer.weight"] = sum(module.get_delta_weight(a) for a in active)
    out = []
    for name, tensor in model.state_dict().items():
        if ".lora_" in name or "modules_to_save" in name:
            continue
        if name in deltas:
            tensor = tensor + deltas[name].to(tensor.dtype)
        out.append((name.removeprefix("base_model.model.").replace(".base_layer.", "."), tensor.detach()))
    return out


class ParamVersions:
    """Whether any trainable parameter was written since the last `mark_synced()`."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._seen: int | None = None

    def _now(self) -> int:
        return sum(p._version for p in self.model.parameters() if p.requires_grad)

    def stale(self) -> bool:
        return self._seen != self._now()

    def mark_synced(self) -> None:
        self._seen = self._now()
