"""`Engine` on vLLM, for GPU rollouts (optional extra: pip install 'ragrl[vllm]').

UNTESTED HERE: the project's CI and dev machines have no GPU and no vllm, so only the import and
the clear error on construction are exercised. Written against vLLM's public offline API
(>= 0.10: `LLM`, `SamplingParams`, `TokensPrompt`, `collective_rpc`, `logprobs_mode`).

Log-probs follow the `Generation` contract: vLLM's "raw_logprobs" mode gives log_softmax of the
raw logits (before temperature/top-p), like HFEngine. Text is the decode of `token_ids` (minus a
final eos), not vLLM's stop-truncated text, so both engines return the same thing.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from ragrl.engines.base import Generation, SamplingParams
from ragrl.errors import ConfigError, RagrlError
from ragrl.models.lm_weights import load_tokenizer, resolve_policy

INSTALL_HINT = "VLLMEngine needs the optional extra: pip install 'ragrl[vllm]' and a CUDA GPU"


def vllm_available() -> bool:
    """True when vllm imports and a CUDA GPU is visible."""

    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


class VLLMEngine:
    """Batched sampling with vLLM; `load_weights` pushes trainer weights into it."""

    def __init__(self, model: str | Path, tokenizer=None, *, gpu_memory_utilization: float = 0.4,
                 dtype: str = "bfloat16", seed: int = 0, **llm_kwargs):
        try:
            import vllm  # late: optional (pip install 'ragrl[vllm]'), CUDA only
        except ImportError as error:
            raise RagrlError(f"{INSTALL_HINT} (vllm is not installed: {error})") from error
        if not torch.cuda.is_available():
            raise RagrlError(f"{INSTALL_HINT} (no CUDA GPU is visible)")

        path = resolve_policy(str(model))
        # Keep the engine core in this process, so weights can be loaded into it directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=str(path), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, seed=seed,
            enable_prefix_caching=True, logprobs_mode="raw_logprobs", **llm_kwargs,
        )
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(path))
        self.eos_token_ids = sorted({self.tokenizer.eos_token_id,
                                     self.tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None})

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[Generation]]:
        per_prompt = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise RagrlError(f"got {len(per_prompt)} SamplingParams for {len(prompts)} prompts")
        if any(sp.allowed_tokens is not None for sp in per_prompt):
            # Refused rather than ignored: an unconstrained selector would emit free text.
            raise RagrlError("the vLLM engine does not apply allowed_tokens (constrained decoding); use engine: hf")
        if any(sp.deadline is not None for sp in per_prompt):
            # Refused rather than ignored: vLLM's offline generate runs every request to its end.
            raise ConfigError("vLLM's engine does not support wall-time bounds (SamplingParams.deadline): use "
                              "model.engine=hf or static, or drop rollout.max_episode_s / rollout.max_rollout_s")
        vllm_params = [
            self._vllm.SamplingParams(
                n=sp.n, temperature=sp.temperature, top_p=sp.top_p, max_tokens=sp.max_new_tokens,
                stop=list(sp.stop), include_stop_str_in_output=True, stop_token_ids=self.eos_token_ids,
                seed=None if sp.seed is None else sp.seed + i, logprobs=0, skip_special_tokens=False,
            )
            for i, sp in enumerate(per_prompt)
        ]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]  # a TokensPrompt
        outputs = self.llm.generate(requests, vllm_params, use_tqdm=False)
        return [[self._generation(c) for c in out.outputs] for out in outputs]

    def _generation(self, completion) -> Generation:
        ids = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids)]
        if completion.finish_reason == "length":
            reason, stop_string = "length", None
        elif isinstance(completion.stop_reason, str):
            reason, stop_string = "stop", completion.stop_reason
        else:  # an eos / stop token id, or None for the model's own eos
            reason, stop_string = "eos", None
        text_ids = ids[:-1] if reason == "eos" else ids
        return Generation(ids, logprobs, reason, stop_string, self.tokenizer.decode(text_ids))

    def load_weights(self, weights) -> None:
        """Copy (name, tensor) pairs into vLLM's model, HF parameter names (merge peft adapters first).

        Uses `collective_rpc` where it exists (every worker), else the in-process driver worker.
        """
        weights = [(name, tensor.detach()) for name, tensor in weights]
        if hasattr(self.llm, "collective_rpc"):
            self.llm.collective_rpc(_load_into_worker, args=(weights,))
        else:
            self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights


def _load_into_worker(worker, weights) -> None:
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    runner.model.load_weights(weights)
