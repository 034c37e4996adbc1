"""The trainable language-model policy: base model + optional LoRA + optional value head.

With LoRA the reference policy is the same module with adapters disabled (no second copy).
LoRA can be limited to the top `trainable_layers` decoder layers: the frozen bottom then
builds no autograd graph, which roughly halves the backward cost on CPU.
"""
from __future__ import annotations

import copy
import logging
import os

import torch
from torch import nn
from transformers import DynamicCache

from ragrl.errors import ConfigError
from ragrl.models.hf_compat import cache_keyword
from ragrl.models.agent_adapters import REFERENCE_ADAPTER
from ragrl.models.lm_weights import load_policy
from ragrl.policy.frozen_trunk import stop_after_trunk, top_layers_only, trunk_output
from ragrl.policy.logprobs import (decoder_and_head, logprobs_from_hidden, position_ids_from_mask,
                                   run_decoder)
from ragrl.policy.model_config import ModelConfig

log = logging.getLogger("ragrl.train")


class ValueHead(nn.Module):
    """Scalar value per position from the policy's last hidden state (PPO's critic)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.proj = nn.Linear(hidden, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N]
        return self.proj(h).squeeze(-1)


def build_policy(cfg: ModelConfig, *, with_value_head: bool = False):
    """Load the model named in cfg, wrap it in LoRA if asked; return (model, tokenizer, value_head)."""
    from peft import LoraConfig, PeftModel, get_peft_model  # late: peft takes ~3 s to import

    device = resolve_device(cfg.device)
    model, tok = load_policy(cfg.name, dtype=torch_dtype(cfg.dtype), device=device)
    model.config.use_cache = False
    if cfg.lora:
        if cfg.init_adapter:
            model = PeftModel.from_pretrained(model, cfg.init_adapter, is_trainable=True)
            freeze_reference(model, cfg.reference_adapter)   # KL is measured against the run's start
        else:
            n_layers = model.config.num_hidden_layers
            top = cfg.lora_layers
            layers = None if not top else list(range(max(0, n_layers - top), n_layers))
            lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                              target_modules=list(cfg.lora_targets), layers_to_transform=layers,
                              task_type="CAUSAL_LM")
            model = get_peft_model(model, lcfg)
        stable_target_modules(model)
    value_head = ValueHead(model.config.hidden_size).to(device) if with_value_head else None
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("policy %s on %s: %.1fM trainable parameters%s", cfg.name, device, n_train / 1e6,
             " (LoRA)" if cfg.lora else "")
    return model, tok, value_head


def stable_target_modules(model) -> None:
    """peft holds target_modules as a set, and save_pretrained writes it in the set's order, which
    changes with each process's hash seed: the same weights wrote different adapter_config.json
    bytes (and so different checkpoint manifests) after a resume. A sorted list writes the same."""
    for config in model.peft_config.values():
        if isinstance(config.target_modules, set):
            config.target_modules = sorted(config.target_modules)


def resolve_device(name: str = "auto", setting: str = "model.device") -> torch.device:
    """The torch device for a config name; errors name `setting` (the config key, or a CLI flag).

    "auto" is CUDA when a GPU is visible, else CPU; under a launcher (torchrun, accelerate) each
    rank takes GPU LOCAL_RANK, so the same config runs on one GPU, eight, or none.

    >>> resolve_device("cpu")
    device(type='cpu')
    """


    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(f"{setting} must be auto, cpu, cuda or cuda:N; got {name!r}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{setting} is {name!r} but torch sees no CUDA GPU (set {setting}=auto or cpu)")
    return device


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config name (`model.dtype`), with a clear error for anything else.

    "auto" is bfloat16 where the hardware computes it natively (a CUDA GPU that supports it, or a
    CPU with AVX512-BF16/AMX, where oneDNN runs bf16 matmuls 2-3x faster than fp32), else float32:
    emulated bf16 would be slower than fp32.
    """

    if name == "auto":
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if _cpu_has_native_bf16() else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"model.dtype must be one of auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


EVAL_DTYPES = ("float32", "bfloat16")   # the weights' precisions `ragrl eval` and `ragrl compare` generate in


def eval_dtype(name: str, setting: str = "--dtype") -> torch.dtype:
    """The torch dtype an evaluation generates in (`--dtype`), refused with a ConfigError naming
    `setting` unless it is one of EVAL_DTYPES: float16 is not offered, as no run trains in it here."""
    if name not in EVAL_DTYPES:
        raise ConfigError(f"{setting} must be one of {', '.join(EVAL_DTYPES)}; got {name!r}")
    return DTYPES[name]


def _cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:   # closed here: an unclosed file is a ResourceWarning
            flags = f.read()
    except OSError:  # not Linux: no cheap way to tell, so stay on the safe side
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def freeze_reference(model: nn.Module, source: str | None = None) -> None:
    """Make the current LoRA adapter's weights the KL reference as well: a frozen copy named
    `reference` (a warm-started run's reference is the policy RL starts from, not the base model
    under it, which never saw the tag protocol). The copy costs the adapter's size (~1.3M values).
    `source` (model.reference_adapter): load the reference from that adapter folder instead."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict  # late: peft takes ~3 s to import

    if not hasattr(model, "peft_config"):
        return
    active = model.active_adapter
    if REFERENCE_ADAPTER in model.peft_config:
        model.delete_adapter(REFERENCE_ADAPTER)
    if source:
        model.load_adapter(str(source), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
    else:
        model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(model.peft_config[active]))
        set_peft_model_state_dict(model, get_peft_model_state_dict(model, adapter_name=active),
                                  adapter_name=REFERENCE_ADAPTER)
    model.set_adapter(active)   # peft's set_adapter leaves only the active adapter trainable


def shared_prefix_hidden_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                action_mask: torch.Tensor, min_prefix: int = 32, *, run=None,
                                embeds: torch.Tensor | None = None) -> torch.Tensor:
    """Decoder hidden states [B, L, H], running a prefix common to every row only ONCE.

    A training batch is many rollouts of prompts that share the chat template and system
    prompt (and, within a GRPO group, the whole question). Those P tokens are computed once
    with batch 1 (gradients still flow: autograd sums over the expanded copies), and every
    row's remainder attends to the repeated prefix KV cache. Rows must be right padded (as
    `collate` makes them). P stops before the first action's predicting state, so every
    hidden state the LM head needs comes from the per-row pass or the shared one unchanged.
    `run(**decoder_inputs)` runs the decoder (default: the whole of it; `trunk_states` stops it early);
    `embeds` [B, L, H]: the decoder's input states in place of the ids' embeddings (kept trunk states).
    """

    decoder, _ = decoder_and_head(model)
    if run is None:
        run = lambda **inputs: run_decoder(model, decoder, **inputs)  # noqa: E731
    B, L = input_ids.shape
    first_action = int(action_mask.float().argmax(-1).min()) if bool(action_mask.any()) else L
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)
    P = int(same.long().cumprod(0).sum())
    P = min(P, first_action - 1, L - 1)
    # the decoder's input for rows and positions: the ids, or the states given in their place
    given = lambda rows, cols: ({"input_ids": input_ids[rows, cols]} if embeds is None  # noqa: E731
                                else {"inputs_embeds": embeds[rows, cols]})
    if B == 1 or P < min_prefix:
        return run(**given(slice(None), slice(None)), attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    cache = DynamicCache()
    pos = torch.arange(L, device=input_ids.device)[None]
    head = run(**given(slice(0, 1), slice(0, P)), attention_mask=attention_mask[:1, :P],
               position_ids=pos[:, :P], use_cache=True, **{cache_keyword(decoder): cache})     # [1, P, H]
    cache.batch_repeat_interleave(B)
    tail = run(**given(slice(None), slice(P, None)), attention_mask=attention_mask,
               position_ids=pos[:, P:].expand(B, -1), use_cache=True,
               **{cache_keyword(decoder): cache})                                              # [B, L-P, H]
    return torch.cat([head.expand(B, -1, -1), tail], dim=1)


@torch.no_grad()
def trunk_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 action_mask: torch.Tensor, depth: int) -> torch.Tensor:
    """The states entering decoder layer `depth` (the output of the frozen trunk below it,
    ragrl.policy.frozen_trunk): [B, L] -> [B, L, H], no graph, the rows' common prefix run once;
    the layers from `depth` up are not run."""
    decoder, _ = decoder_and_head(model)
    with stop_after_trunk(decoder, depth):
        return shared_prefix_hidden_states(
            model, input_ids, attention_mask, action_mask,
            run=lambda **inputs: trunk_output(lambda: run_decoder(model, decoder, **inputs)))


def forward_actions(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    action_mask: torch.Tensor, *, value_head: ValueHead | None = None,
                    with_entropy: bool = False, trunk: torch.Tensor | None = None,
                    trunk_depth: int = 0) -> dict[str, torch.Tensor | None]:
    """Log-probs (and entropy, values) of the tokens at action positions, from ONE decoder pass.

    input_ids, attention_mask, action_mask: [B, L]. Returns dense [B, L] tensors `logprobs`,
    `entropy`, `values` (zero off the action mask). The LM head runs only at action positions
    (ragrl.policy.logprobs); values V(prefix before token t) read the hidden state at t-1.
    `trunk` [B, L, H]: the rows' kept `trunk_states` at `trunk_depth`; only the layers above run.
    """
    device = next(model.parameters()).device   # inputs may come from a CPU collate
    input_ids, attention_mask, action_mask = (t.to(device) for t in (input_ids, attention_mask, action_mask))
    decoder, lm_head = decoder_and_head(model)
    if trunk is None:
        hidden = shared_prefix_hidden_states(model, input_ids, attention_mask, action_mask)  # [B, L, H]
    else:
        if tuple(trunk.shape[:2]) != tuple(input_ids.shape):
            raise ValueError(f"trunk states {tuple(trunk.shape)} do not match the batch {tuple(input_ids.shape)}")
        with top_layers_only(decoder, trunk_depth):
            hidden = shared_prefix_hidden_states(model, input_ids, attention_mask, action_mask,
                                                 embeds=trunk.to(device))
    logprobs, entropy = logprobs_from_hidden(hidden, lm_head, input_ids,
                                             action_mask, with_entropy=with_entropy)
    values = None
    if value_head is not None:
        rows, cols = action_mask.bool().nonzero(as_tuple=True)
        values = torch.zeros_like(logprobs).index_put((rows, cols), value_head(hidden[rows, cols - 1].float()))
    return {"logprobs": logprobs, "entropy": entropy, "values": values}
