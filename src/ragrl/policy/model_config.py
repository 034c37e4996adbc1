"""The `model:` section of a training config: which LM, its LoRA, its dtype and device, and the
engine it rolls out with. It lives with the policy that reads it (build_policy), below train/."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from ragrl.engines.registry import ENGINES, make_engine
from ragrl.yaml_config import Choice, setting

EngineKind = Annotated[str, Choice(lambda: list(ENGINES))]


@dataclass
class ModelConfig:
    """The LM: which model, its LoRA adapter, dtype and device, and the rollout engine."""

    name: str = setting("smollm2-135m-instruct", help=(
        "The LM: a registry name (smollm2-135m-instruct), a Hugging Face id or a local path."))
    init_adapter: str | None = setting(None, help=(
        "A LoRA adapter folder to start from (e.g. an SFT checkpoint or an earlier stage's "
        "final_adapter); it is also the KL reference unless model.reference_adapter names another. "
        "Needs model.lora. null: a new adapter."))
    reference_adapter: str | None = setting(None, help=(
        "A LoRA adapter folder frozen as the run's start in place of model.init_adapter: the KL "
        "reference, and the reader of `rollout.answer_by: start`. A later stage of a chain (R1-Searcher's "
        "stage 2) names the chain's first start (stage 1's SFT adapter), so the reader is the one that "
        "was never trained by RL. Needs model.init_adapter. null: model.init_adapter itself."))
    lora: bool = setting(True, help=(
        "true: train a LoRA adapter over the frozen base; false: train every weight of the model."))
    lora_r: int = setting(16, help="LoRA rank of a new adapter (an init_adapter keeps its own).")
    lora_alpha: int = setting(32, help="LoRA alpha of a new adapter (its update is scaled by alpha / r).")
    # Dropout breaks "ratio == 1 at the first epoch" (the rollout's log-probs are computed without it).
    lora_dropout: float = setting(0.0, help=(
        "Dropout on the LoRA input of a new adapter; above 0 the first epoch's probability ratios "
        "are no longer 1."))
    lora_targets: list[str] = setting(factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"], help=(
        "Module names a new adapter wraps (attention and MLP projections of Llama-style models)."))
    lora_layers: int | None = setting(None, help=(
        "LoRA on the top N decoder layers only (a cheaper backward). null: every layer."))
    engine: EngineKind = setting("auto", help=(
        "The rollout engine, for training, evaluation and the quickstart. auto: static on a GPU "
        "(where the model's architecture allows), hf on a CPU and wherever rollout.answer_by switches "
        "adapters between calls. hf: generate with the very module "
        "being trained (no sync). static: the same module, a preallocated KV cache and a compiled "
        "decode step. vllm (a CUDA GPU, pip install 'ragrl[vllm]'): a vLLM copy that receives the "
        "merged weights whenever a trained parameter changed."))
    compile: Literal["auto", "inductor", "graphs", "off"] = setting("auto", help=(
        "How the static engine compiles its decode step: auto (torch.compile with CUDA graphs on a "
        "GPU, eager on a CPU), inductor (torch.compile), graphs (CUDA graphs of the eager step), off."))
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = setting("float32", help=(
        "Weights of the frozen base model. auto: bfloat16 where the hardware computes it natively "
        "(a GPU that supports it, a CPU with AMX / AVX512-BF16), else float32. bfloat16 halves "
        "memory traffic; LoRA adapters, log-probs and values stay float32."))
    device: str = setting("auto", help=(
        "Where the policy runs and trains: auto (this rank's CUDA GPU when there is one, else the "
        "CPU), cpu, cuda or cuda:N."))
    max_batch_size: int = setting(64, help=(
        "Rows the rollout engine generates at once (hf: batches of this many; static: its slots); "
        "the other rows wait."))


def engine_kind(requested: str, *, switches_adapters: bool = False) -> str:
    """The engine kind to build for `requested`: as asked, except that `auto` means hf where the caller
    switches LoRA adapters between calls (`rollout.answer_by` other than policy) or reads the HF model's
    own token probabilities (a threshold decision): a compiled decode step (the static engine's on a GPU)
    would not see the switch, and refusing there would make such runs fail on the one machine `auto`
    exists for.

    >>> engine_kind("auto"), engine_kind("auto", switches_adapters=True), engine_kind("static", switches_adapters=True)
    ('auto', 'hf', 'static')
    """
    return "hf" if switches_adapters and requested == "auto" else requested


def engine_for(mcfg: ModelConfig, model, tokenizer, *, max_batch_size: int | None = None,
               switches_adapters: bool = False, kind: str | None = None):
    """The rollout engine a `model:` section names (`engine`, `compile`, `max_batch_size`) over `model`:
    the one way training, evaluation, compare and the quickstart build one. `kind` overrides the
    section's engine (`ragrl eval --engine`); `switches_adapters` as in `engine_kind`."""
    return make_engine(engine_kind(kind or mcfg.engine, switches_adapters=switches_adapters), model, tokenizer,
                       max_batch_size=max_batch_size or mcfg.max_batch_size, compile_mode=mcfg.compile)
