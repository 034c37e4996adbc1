"""Pick a generation engine (`model.engine`): auto, hf, static, or vllm on a CUDA GPU.

    require_engine("vllm")                          # ConfigError naming what is missing, before any work
    engine = make_engine("vllm", module, tok)       # a trained module: vLLM follows its weights

`auto` takes the fastest tested engine that can run where the model is: on a GPU `static` when
the model's architecture is one it implements (13-27x `hf` there, benchmarks/results/
gpu_rollout.json), else `hf`; on a CPU `hf`, which is as fast per step there (see resolve_auto).
`hf` and `static` roll out with the very module being trained, so there is nothing to sync.
`vllm` keeps its own copy: `TrainingVLLMEngine` pushes the merged weights (LoRA included) into it
before a generation whenever a trained parameter changed since the last push (an RL update, an
SFT warm start, a checkpoint restored on resume).
"""
from __future__ import annotations

import importlib.util

import torch

from ragrl.engines.hf import HFEngine
from ragrl.engines.static import StaticEngine, unsupported_reason
from ragrl.engines.vllm import VLLMEngine
from ragrl.errors import ConfigError
from ragrl.models.lm_weights import load_policy
from ragrl.models.merge import ParamVersions, merged_weights

ENGINES = ("auto", "hf", "static", "vllm")


def require_engine(kind: str, setting: str = "model.engine") -> None:
    """Raise a ConfigError naming `setting` when `kind` cannot run on this machine."""
    if kind not in ENGINES:
        raise ConfigError(f"{setting}: {kind!r} is not one of {', '.join(ENGINES)}")
    if kind == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(f"{setting}=vllm: vllm is not installed (pip install 'ragrl[vllm]'); "
                              f"use {setting}=hf")
        if not torch.cuda.is_available():
            raise ConfigError(f"{setting}=vllm: no CUDA GPU is visible (vLLM runs on a GPU); use {setting}=hf")


def make_engine(kind: str, model, tokenizer, *, max_batch_size: int = 64, compile_mode: str = "auto", **kwargs):
    """An `Engine` of `kind`. `model`: an HF module, or (vllm) a name or path. `compile_mode`: how
    the static engine compiles its decode step (`StaticEngine`); the other engines have none.

    For vLLM with a module, the engine follows the module's weights (see `TrainingVLLMEngine`).
    """

    require_engine(kind)
    if kind in ("auto", "static") and isinstance(model, str):
        model, tokenizer = load_policy(model)
    if kind == "auto":
        kind = resolve_auto(model)
    if kind == "static":
        return StaticEngine(model, tokenizer, max_batch_size=max_batch_size, compile_mode=compile_mode, **kwargs)
    if kind == "hf":
        if isinstance(model, str):
            return HFEngine.from_name(model, max_batch_size=max_batch_size, **kwargs)
        return HFEngine(model, tokenizer, max_batch_size=max_batch_size, **kwargs)

    if isinstance(model, str):
        return VLLMEngine(model, tokenizer, max_num_seqs=max_batch_size, **kwargs)
    return TrainingVLLMEngine(model, tokenizer, max_num_seqs=max_batch_size, **kwargs)


def resolve_auto(model) -> str:
    """The engine `auto` means for the module `model` on this machine."""
    on_gpu = next(model.parameters()).device.type == "cuda"
    # vllm only when asked for: its training path has not run on a GPU yet (docs/recipes.md).
    # On a CPU a decode step costs the same in both (matrix products are all of it: 0.20 s a step
    # for 8 rows of SmolLM2 either way, measured), and HFEngine drops a finished row at once.
    return "static" if on_gpu and unsupported_reason(model) is None else "hf"


class TrainingVLLMEngine:
    """vLLM serving a module that is being trained: weights pushed when they changed."""

    def __init__(self, module, tokenizer, **kwargs):
        name = module.name_or_path   # a PeftModel forwards it to the base model
        self.module, self.versions = module, ParamVersions(module)
        self.inner = VLLMEngine(name, tokenizer, **kwargs)
        self.tokenizer = tokenizer

    def sync(self) -> None:
        if self.versions.stale():
            self.inner.load_weights(merged_weights(self.module))
            self.versions.mark_synced()

    def generate(self, prompts, params):
        self.sync()
        return self.inner.generate(prompts, params)

    def __getattr__(self, name):   # tokenizer ids and the like: the inner engine's
        return getattr(self.inner, name)
