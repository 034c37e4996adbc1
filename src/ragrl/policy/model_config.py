"""The `model:` section of a training config: which LM, its LoRA, its dtype and device, and the
engine it rolls out with. It lives with the policy that reads it (build_policy), below train/."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from ragrl.engines.registry import ENGINES, make_engine
from ragrl.yaml_config import Choice

EngineKind = Annotated[str, Choice(lambda: list(ENGINES))]


@dataclass
class ModelConfig:
    name: str = "smollm2-135m-instruct"   # registry name, HF id or local path
    init_adapter: str | None = None       # a LoRA adapter (e.g. an SFT checkpoint) to start from
    lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0             # dropout breaks "ratio == 1 at the first epoch"
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                             "gate_proj", "up_proj", "down_proj"])
    lora_layers: int | None = None        # LoRA on the top N decoder layers only (cheaper backward)
    # The rollout engine, for training, evaluation and the quickstart. auto: static on a GPU (where
    # the model's architecture allows), hf on a CPU. hf: generate with the very module being
    # trained (no sync). static: the same module, a preallocated KV cache and a compiled decode
    # step (engines/static.py). vllm (a CUDA GPU, pip install 'ragrl[vllm]'): a vLLM copy that
    # receives the merged weights whenever a trained parameter changed.
    engine: EngineKind = "auto"
    # How the static engine compiles its decode step: auto (torch.compile with CUDA graphs on a
    # GPU, eager on a CPU), inductor (torch.compile), graphs (CUDA graphs of the eager step), off.
    compile: Literal["auto", "inductor", "graphs", "off"] = "auto"
    # Weights of the frozen base model. bfloat16 halves memory traffic and uses AMX/bf16 units
    # (2-3x faster on CPUs that have them); LoRA adapters, log-probs and values stay float32.
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"   # auto: bf16 where native
    # Where the policy runs (and trains): auto = this rank's CUDA GPU when there is one, else CPU.
    device: str = "auto"                  # auto | cpu | cuda | cuda:N
    max_batch_size: int = 64              # generation rows at once


def engine_for(mcfg: ModelConfig, model, tokenizer, *, max_batch_size: int | None = None):
    """The rollout engine this `model:` section names (`engine`, `compile`, `max_batch_size`) over `model`."""
    return make_engine(mcfg.engine, model, tokenizer, max_batch_size=max_batch_size or mcfg.max_batch_size,
                       compile_mode=mcfg.compile)
